"""The assembled form of :func:`diffnet.discretisation.immersed_elasticity.immersed_elasticity_energy`: the stiffness
matrix of a solid cut out of the node grid, node-major as :mod:`diffnet.solvers.elasticity`'s (dof = node * 2 +
component), so its system solves by the same smoothed aggregation with the rigid-body modes.

Whole elements take the 2x2 Gauss element matrix of :func:`~diffnet.solvers.elasticity.element_stiffness` (weighted
by the discretisation's ``stiffness_weight``: 1 inside, α on cut elements), the cut elements' inside points their own
rank-one terms: ½ uᵀ K u equals the torch energy of the same field (tests/science/test_elastic_plate.py).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from diffnet.discretisation.immersed import Immersed
from diffnet.grid.material import lame
from diffnet.solvers.elasticity import element_dofs, element_stiffness, gauss_values

__all__ = ["immersed_elasticity_matrix", "block_stencil"]


def immersed_elasticity_matrix(data: Immersed, young: np.ndarray, nu: float, plane: str = "stress") -> sp.csr_matrix:
    """K (2N, 2N) of one instance's cut solid: nodal Young's modulus ``young`` (N_y, N_x), Poisson ratio ``nu``.

    The inactive nodes' rows are empty (the caller holds them); no other condition is applied.
    """
    cells = data.cells
    ny, nx = cells.resolution
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
    dofs = element_dofs((ny, nx))
    rows = np.broadcast_to(dofs[:, :, None], ke.shape).ravel()
    cols = np.broadcast_to(dofs[:, None, :], ke.shape).ravel()
    n = 2 * ny * nx
    return sp.csr_matrix((ke.ravel(), (rows, cols)), shape=(n, n))


def block_stencil(K: sp.spmatrix, grid: tuple[int, int]) -> np.ndarray:
    """A node-major matrix K (2N, 2N) of 9-point coupling as the block stencil (2, 2, 9, N_y, N_x) of
    :mod:`diffnet.multigrid.stencil` (entry [a, b, k] at node i: K's coupling of component a at i to component b at
    i + o_k, the offsets (dy, dx) in {-1, 0, 1}² row-major); couplings past the grid's edge are zero."""
    ny, nx = grid
    K = sp.csr_matrix(K)
    i, j = np.meshgrid(np.arange(ny), np.arange(nx), indexing="ij")
    out = np.zeros((2, 2, 9, ny, nx))
    for k, (dy, dx) in enumerate((dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)):
        inside = (0 <= i + dy) & (i + dy < ny) & (0 <= j + dx) & (j + dx < nx)
        node, other = (i * nx + j)[inside], ((i + dy) * nx + j + dx)[inside]
        for a in range(2):
            for b in range(2):
                out[a, b, k][inside] = np.asarray(K[node * 2 + a, other * 2 + b]).ravel()
    return out
