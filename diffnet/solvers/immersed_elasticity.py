"""The assembled form of :func:`diffnet.discretisation.immersed_elasticity.immersed_elasticity_energy`: the stiffness
matrix of a solid cut out of the node grid, node-major as :mod:`diffnet.solvers.elasticity`'s (dof = node * 2 +
component), so its system solves by the same smoothed aggregation with the rigid-body modes.

Whole elements take the 2x2 Gauss element matrix of :func:`~diffnet.solvers.elasticity.element_stiffness` (weighted
by the discretisation's ``stiffness_weight``: 1 inside, α on cut elements), the cut elements' inside points their own
rank-one terms: ½ uᵀ K u equals the torch energy of the same field (tests/methods/test_elastic_plate.py).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from diffnet.discretisation.immersed import Immersed
from diffnet.grid.element import element_nodes
from diffnet.grid.material import lame
from diffnet.solvers.elasticity import element_dofs, element_stiffness, gauss_values

__all__ = ["element_matrices", "immersed_elasticity_matrix", "immersed_elasticity_stencil"]


def element_matrices(data: Immersed, young: np.ndarray, nu: float, plane: str = "stress") -> np.ndarray:
    """Every element's 8 x 8 stiffness (cells, 8, 8), local dof (a, i) at 2a + i (corners in
    :func:`~diffnet.grid.element.element_nodes` order): the whole elements' 2x2 Gauss matrix weighted by
    ``stiffness_weight``, plus the cut elements' inside points."""
    cells = data.cells
    young = np.asarray(young, dtype=np.float64)
    k_q, values = element_stiffness(cells.spacing, nu, plane)  # (Q, 8, 8) for E = 1
    e_q = gauss_values(young, values)  # (cells, Q)
    ke = np.einsum("cq,qab->cab", e_q * data.stiffness_weight.reshape(-1, 1), k_q)
    lam, mu = lame(nu, plane)
    g = cells.grads  # (P, 4, 2): dN_a/dx_j at each inside point of a cut element
    dot = np.einsum("paj,pbj->pab", g, g)
    # K_p[(a, i), (b, k)] = λ g_ai g_bk + μ (δ_ik g_a·g_b + g_ak g_bi), local dof (a, i) at 2a + i
    kp = (lam * np.einsum("pai,pbk->paibk", g, g) + mu * np.einsum("pak,pbi->paibk", g, g)
          + mu * np.einsum("pab,ik->paibk", dot, np.eye(2))).reshape(len(g), 8, 8)
    np.add.at(ke, cells.element, (cells.weights * data.nu_points)[:, None, None] * kp)
    return ke


def immersed_elasticity_matrix(data: Immersed, young: np.ndarray, nu: float, plane: str = "stress") -> sp.csr_matrix:
    """K (2N, 2N) of one instance's cut solid: nodal Young's modulus ``young`` (N_y, N_x), Poisson ratio ``nu``.

    The inactive nodes' rows are empty (the caller holds them); no other condition is applied.
    """
    ny, nx = data.cells.resolution
    ke = element_matrices(data, young, nu, plane)
    dofs = element_dofs((ny, nx))
    rows = np.broadcast_to(dofs[:, :, None], ke.shape).ravel()
    cols = np.broadcast_to(dofs[:, None, :], ke.shape).ravel()
    n = 2 * ny * nx
    return sp.csr_matrix((ke.ravel(), (rows, cols)), shape=(n, n))


def immersed_elasticity_stencil(data: Immersed, young: np.ndarray, nu: float, plane: str = "stress") -> np.ndarray:
    """The same K as the block stencil (2, 2, 9, N_y, N_x) of :mod:`diffnet.multigrid.stencil` (entry [a, b, k] at
    node i: the coupling of component a at i to component b at i + o_k, the offsets (dy, dx) in {-1, 0, 1}²
    row-major), scattered from the element matrices: 64 slice additions, where reading it off the assembled CSR
    matrix took 21 ms at 64²."""
    ny, nx = data.cells.resolution
    ke = element_matrices(data, young, nu, plane).reshape(ny - 1, nx - 1, 4, 2, 4, 2)
    out = np.zeros((2, 2, 9, ny, nx))
    for a, (ay, ax) in enumerate(element_nodes(2)):
        rows = (slice(ay, ny - 1 + ay), slice(ax, nx - 1 + ax))
        for c, (cy, cx) in enumerate(element_nodes(2)):
            k = 3 * (1 + cy - ay) + (1 + cx - ax)
            for i in range(2):
                for j in range(2):
                    out[(i, j, k) + rows] += ke[:, :, a, i, c, j]
    return out
