"""The Q1 element's matrices and the arrays built from them, in 2-D and 3-D: the fine matrix of
-div(nu grad) + kappa^2 and its Galerkin coarse operator element by element, and the load vector.

Shared by the assembled systems (:mod:`diffnet.solvers.fem`) and their multigrid
(:mod:`diffnet.solvers.gmg`), which both need them; neither imports the other's internals.
The element is :func:`diffnet.grid.element.gauss_basis`'s, so these are the matrices of the energies
DiffNet is trained on. ``spacing`` is (hx, hy[, hz]), x first, as there.
"""

from __future__ import annotations

import numpy as np

from diffnet.grid.element import element_matrices, element_nodes, element_slices, gauss_basis
from diffnet.solvers.matrix_stencil import q1_galerkin, q1_stencil

__all__ = ["q1_matrix_stencil", "coarse_q1_stencil", "q1_load"]


def coarse_q1_stencil(nu: np.ndarray, spacing: tuple[float, ...], kappa: float, fixed_coarse: np.ndarray) -> np.ndarray:
    """The Galerkin coarse operator Pᵀ A P of the Q1 matrix on the nested grid with half the cells,
    fixed coarse nodes cut out (:func:`diffnet.solvers.matrix_stencil.q1_galerkin`), a 3^d-point stencil."""
    stiff, mass, values = element_matrices(spacing, kappa)
    nodes = element_nodes(nu.ndim)
    # T[s, a, A]: coarse multilinear basis A at corner a of fine sub-element s, in the coarse element's unit cell.
    T = np.empty((len(nodes),) * 3)
    for sub, offset in enumerate(nodes):
        for a, corner in enumerate(nodes):
            point = [(o + c) / 2 for o, c in zip(offset, corner)]
            for A, coarse in enumerate(nodes):
                value = 1.0
                for x, c in zip(point[::-1], coarse[::-1]):  # x first, as the basis's products
                    value *= x if c else 1.0 - x
                T[sub, a, A] = value
    sub_stiff = np.einsum("saA,qab,sbB->sqAB", T, stiff, T)
    sub_mass = np.einsum("saA,ab,sbB->sAB", T, mass, T)
    return q1_galerkin(np.ascontiguousarray(nu, dtype=np.float64), sub_stiff, sub_mass, values,
                       np.ascontiguousarray(fixed_coarse, dtype=bool))


def q1_matrix_stencil(nu: np.ndarray, spacing: tuple[float, ...], kappa: float) -> np.ndarray:
    """The matrix of -div(nu grad) + kappa^2 for nodal ``nu`` (*grid) as a 3^d-point stencil
    (*grid, 3, ..., 3) (:mod:`diffnet.solvers.matrix_stencil`).

    The element quantities at the Gauss points come from :func:`~diffnet.grid.element.gauss_basis`;
    the pass over the elements is compiled (a numpy version of the same sums took 0.25 s
    warm, 1.0 s cold at 1025^2, more than the multigrid solve; in 3-D it would keep
    (elements x 64) index and value arrays, 3 GB at 128^3).
    """
    stiff, mass, values = element_matrices(spacing, kappa)
    return q1_stencil(np.ascontiguousarray(nu, dtype=np.float64), stiff, mass, values)


def q1_load(f: np.ndarray | float, shape: tuple[int, ...], spacing: tuple[float, ...]) -> np.ndarray:
    """Nodal load (*shape) of a constant or nodal (multilinearly interpolated) source: sum_q w f_q N_a(q)."""
    b = np.zeros(shape)
    if np.ndim(f) == 0 and f == 0.0:
        return b
    values, *_, w = gauss_basis(*spacing)
    f = np.broadcast_to(np.asarray(f, dtype=np.float64), shape)
    slices = element_slices(shape)
    corners = np.stack([f[at].ravel() for at in slices])
    fe = (w * values.T @ values) @ corners  # (a, element): sum_q w f_q N_a(q)
    cells = tuple(n - 1 for n in shape)
    for a, at in enumerate(slices):
        b[at] += fe[a].reshape(cells)
    return b
