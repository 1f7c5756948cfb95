"""Q1 finite-element reference: structured vectorised assembly, AMG-preconditioned CG or a direct solve.

The element is the one of :mod:`diffnet.energy` (bilinear on each pixel, 2x2 Gauss,
nodal diffusivity interpolated to the Gauss points), so the discrete solution here is
the exact minimiser of the energies DiffNet is trained on.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from diffnet.energy import gauss_basis

__all__ = ["assemble", "solve_dirichlet", "poisson_fem", "reaction_diffusion_fem"]

# Element nodes as (dy, dx) offsets from the lower-left node, in gauss_basis order.
_NODES = ((0, 0), (0, 1), (1, 0), (1, 1))


def _element_matrices(nu: np.ndarray, hx: float, hy: float, kappa: float) -> np.ndarray:
    """(N_y-1, N_x-1, 4, 4) element matrices of -div(nu grad) + kappa^2 on every pixel."""
    values, gx, gy, w = gauss_basis(hx, hy)
    stiff = w * (gx[:, :, None] * gx[:, None, :] + gy[:, :, None] * gy[:, None, :])  # (q, a, b)
    corners = np.stack([nu[dy : nu.shape[0] - 1 + dy, dx : nu.shape[1] - 1 + dx] for dy, dx in _NODES], -1)
    nu_q = corners @ values.T  # (N_y-1, N_x-1, q)
    ke = np.einsum("yxq,qab->yxab", nu_q, stiff)
    if kappa:
        ke += kappa**2 * w * np.einsum("qa,qb->ab", values, values)
    return ke


def _load(f: np.ndarray | float, shape: tuple[int, int], hx: float, hy: float) -> np.ndarray:
    """Nodal load vector of a constant or nodal (bilinearly interpolated) source."""
    values, _, _, w = gauss_basis(hx, hy)
    ny, nx = shape
    f = np.broadcast_to(np.asarray(f, dtype=np.float64), shape)
    corners = np.stack([f[dy : ny - 1 + dy, dx : nx - 1 + dx] for dy, dx in _NODES], -1)
    fe = w * (corners @ values.T) @ values  # (N_y-1, N_x-1, a): sum_q w f_q N_a(q)
    b = np.zeros(shape)
    for a, (dy, dx) in enumerate(_NODES):
        b[dy : ny - 1 + dy, dx : nx - 1 + dx] += fe[..., a]
    return b.ravel()


def assemble(
    nu: np.ndarray, hx: float, hy: float, kappa: float = 0.0, f: np.ndarray | float = 0.0
) -> tuple[sp.csr_matrix, np.ndarray]:
    """Assemble A = K + kappa^2 M and the load b on the structured grid, before boundary conditions.

    Each node couples to its 3x3 neighbourhood, so the matrix is nine diagonals: the
    element contributions are summed into a (3, 3, N_y, N_x) stencil with array slices
    and handed to scipy as a DIA matrix, with no per-entry index lists.

    Parameters
    ----------
    nu : numpy.ndarray
        Nodal diffusivity, shape (N_y, N_x), positive.
    hx, hy : float
        Node spacings.
    kappa : float
        Reaction coefficient.
    f : numpy.ndarray or float
        Source, constant or nodal (N_y, N_x).

    Returns
    -------
    A : scipy.sparse.csr_matrix
        (N, N) with N = N_y N_x, nodes numbered row-major (index i N_x + j).
    b : numpy.ndarray
        (N,) load.
    """
    nu = np.asarray(nu, dtype=np.float64)
    ny, nx = nu.shape
    ke = _element_matrices(nu, hx, hy, kappa)
    stencil = np.zeros((3, 3, ny, nx))
    for a, (ya, xa) in enumerate(_NODES):
        for b, (yb, xb) in enumerate(_NODES):
            stencil[yb - ya + 1, xb - xa + 1, ya : ny - 1 + ya, xa : nx - 1 + xa] += ke[..., a, b]
    n = ny * nx
    offsets, data = [], np.zeros((9, n))
    for k, (di, dj) in enumerate((di, dj) for di in (-1, 0, 1) for dj in (-1, 0, 1)):
        off = di * nx + dj
        offsets.append(off)
        row = stencil[di + 1, dj + 1].ravel()
        # DIA stores entry (r, r + off) at column r + off of its diagonal's row.
        if off >= 0:
            data[k, off:] = row[: n - off]
        else:
            data[k, :off] = row[-off:]
    A = sp.dia_matrix((data, offsets), shape=(n, n)).tocsr()
    A.eliminate_zeros()  # couplings across the grid's row ends are structural zeros
    return A, _load(f, (ny, nx), hx, hy)


def solve_dirichlet(
    A: sp.csr_matrix,
    b: np.ndarray,
    fixed: np.ndarray,
    values: np.ndarray,
    method: str = "amg",
    tol: float = 1e-10,
) -> np.ndarray:
    """Solve A u = b with u = values on the ``fixed`` nodes.

    The fixed rows and columns are replaced by the identity (their known values moved
    to the right-hand side), which keeps the matrix symmetric positive definite.

    Parameters
    ----------
    A, b : the assembled system.
    fixed : numpy.ndarray
        Boolean mask (N,) of Dirichlet nodes.
    values : numpy.ndarray
        (N,) prescribed values (only the fixed entries are used).
    method : {"amg", "direct"}
        Conjugate gradients preconditioned by pyamg smoothed aggregation, to a relative
        residual ``tol``; or a sparse LU factorisation (SuperLU).
    tol : float
        Relative residual for ``amg``.
    """
    g = np.where(fixed, values, 0.0)
    keep = sp.diags((~fixed).astype(np.float64))
    A_d = (keep @ A @ keep + sp.diags(fixed.astype(np.float64))).tocsr()
    rhs = np.where(fixed, g, b - A @ g)
    if method == "direct":
        from scipy.sparse.linalg import spsolve

        u = spsolve(A_d.tocsc(), rhs)
    elif method == "amg":
        import pyamg

        ml = pyamg.smoothed_aggregation_solver(A_d, symmetry="hermitian")
        residuals: list[float] = []
        u = ml.solve(rhs, tol=tol, accel="cg", maxiter=500, residuals=residuals)
        if residuals[-1] > 10 * tol * max(residuals[0], np.linalg.norm(rhs)):
            raise RuntimeError(f"AMG-CG did not converge: residual {residuals[-1]:.3e} after {len(residuals)} its")
    else:
        raise ValueError(f"unknown method {method!r}; choose 'amg' or 'direct'")
    # The identity rows are only solved to the tolerance; the prescribed values are exact.
    u[fixed] = g[fixed]
    return u


def _spacings(shape: tuple[int, int]) -> tuple[float, float]:
    ny, nx = shape
    return 1.0 / (nx - 1), 1.0 / (ny - 1)


def poisson_fem(nu: np.ndarray, method: str = "amg", tol: float = 1e-10) -> np.ndarray:
    """Q1 solution of -div(nu grad u) = 0 on [0,1]^2, u = 1 at x = 0, u = 0 at x = 1, zero flux at y = 0, 1.

    Returns the nodal field, shape (N_y, N_x), float64.
    """
    nu = np.asarray(nu, dtype=np.float64)
    hx, hy = _spacings(nu.shape)
    A, b = assemble(nu, hx, hy)
    ny, nx = nu.shape
    cols = np.broadcast_to(np.arange(nx), (ny, nx)).ravel()
    fixed = (cols == 0) | (cols == nx - 1)
    values = (cols == 0).astype(np.float64)
    return solve_dirichlet(A, b, fixed, values, method, tol).reshape(ny, nx)


def reaction_diffusion_fem(
    nu: np.ndarray, kappa: float, f: np.ndarray | float, method: str = "amg", tol: float = 1e-10
) -> np.ndarray:
    """Q1 solution of -div(nu grad u) + kappa^2 u = f on [0,1]^2 with u = 0 on the boundary.

    Returns the nodal field, shape (N_y, N_x), float64.
    """
    nu = np.asarray(nu, dtype=np.float64)
    hx, hy = _spacings(nu.shape)
    A, b = assemble(nu, hx, hy, kappa, f)
    ny, nx = nu.shape
    edge = np.zeros((ny, nx), dtype=bool)
    edge[[0, -1], :] = True
    edge[:, [0, -1]] = True
    return solve_dirichlet(A, b, edge.ravel(), np.zeros(ny * nx), method, tol).reshape(ny, nx)
