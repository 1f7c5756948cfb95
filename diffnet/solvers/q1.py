"""The Q1 element's matrices and the stencils built from them: the fine matrix of
-div(nu grad) + kappa^2 and its Galerkin coarse operator, element by element.

Shared by the assembled systems (:mod:`diffnet.solvers.poisson`) and their multigrid
(:mod:`diffnet.solvers.gmg`), which both need them; neither imports the other's internals.
"""

from __future__ import annotations

import numpy as np

from diffnet.energy import ELEMENT_NODES, gauss_basis
from diffnet.solvers.matrix_stencil import q1_galerkin, q1_stencil

__all__ = ["element_matrices", "q1_matrix_stencil", "coarse_q1_stencil"]


def element_matrices(hx: float, hy: float, kappa: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per Gauss point q the element stiffness w grad N_a . grad N_b, shape (Q, 4, 4); the reaction
    term's element matrix kappa^2 w sum_q N_a N_b, (4, 4); the basis at the Gauss points, (Q, 4)."""
    values, gx, gy, w = gauss_basis(hx, hy)
    stiff = w * (gx[:, :, None] * gx[:, None, :] + gy[:, :, None] * gy[:, None, :])
    return stiff, kappa**2 * w * values.T @ values, values


def coarse_q1_stencil(nu: np.ndarray, hx: float, hy: float, kappa: float, fixed_coarse: np.ndarray) -> np.ndarray:
    """The Galerkin coarse operator Pᵀ A P of the Q1 matrix on the nested grid with half the cells,
    fixed coarse nodes cut out (:func:`diffnet.solvers.matrix_stencil.q1_galerkin`), shape (N_c_y, N_c_x, 3, 3)."""
    stiff, mass, values = element_matrices(hx, hy, kappa)
    # T[s, a, A]: coarse bilinear basis A at corner a of fine sub-element s, in the coarse element's unit square.
    T = np.empty((4, 4, 4))
    for sub, (sy, sx) in enumerate(ELEMENT_NODES):
        for a, (dy, dx) in enumerate(ELEMENT_NODES):
            eta, xi = (sy + dy) / 2, (sx + dx) / 2
            for A, (cy, cx) in enumerate(ELEMENT_NODES):
                T[sub, a, A] = (xi if cx else 1.0 - xi) * (eta if cy else 1.0 - eta)
    sub_stiff = np.einsum("saA,qab,sbB->sqAB", T, stiff, T)
    sub_mass = np.einsum("saA,ab,sbB->sAB", T, mass, T)
    return q1_galerkin(np.ascontiguousarray(nu, dtype=np.float64), sub_stiff, sub_mass, values,
                       np.ascontiguousarray(fixed_coarse, dtype=bool))


def q1_matrix_stencil(nu: np.ndarray, hx: float, hy: float, kappa: float) -> np.ndarray:
    """The matrix of -div(nu grad) + kappa^2 as a (N_y, N_x, 3, 3) stencil (:mod:`diffnet.solvers.matrix_stencil`).

    The element quantities at the Gauss points come from :func:`~diffnet.energy.gauss_basis`;
    the pass over the elements is compiled (a numpy version of the same sums took 0.25 s
    warm, 1.0 s cold at 1025^2, more than the multigrid solve).
    """
    stiff, mass, values = element_matrices(hx, hy, kappa)
    return q1_stencil(np.ascontiguousarray(nu, dtype=np.float64), stiff, mass, values)
