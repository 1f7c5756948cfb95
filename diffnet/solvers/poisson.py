"""Q1 finite-element reference: structured vectorised assembly, AMG-preconditioned CG or a direct solve.

The element is the one of :mod:`diffnet.energy` (bilinear on each pixel, 2x2 Gauss,
nodal diffusivity interpolated to the Gauss points), so the discrete solution here is
the exact minimiser of the energies DiffNet is trained on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from diffnet.energy import gauss_basis

__all__ = ["FEMSystem", "assemble", "dirichlet_system", "poisson_system", "reaction_diffusion_system",
           "poisson_fem", "reaction_diffusion_fem"]

# Element nodes as (dy, dx) offsets from the lower-left node, in gauss_basis order.
_NODES = ((0, 0), (0, 1), (1, 0), (1, 1))
# The 3x3 neighbourhood of a node, row-major: in this order a row's columns ascend.
_NEIGHBOURS = tuple((di, dj) for di in (-1, 0, 1) for dj in (-1, 0, 1))


def _element_matrices(nu: np.ndarray, hx: float, hy: float, kappa: float) -> np.ndarray:
    """(4, 4, N_y-1, N_x-1) element matrices of -div(nu grad) + kappa^2 on every pixel.

    Entry [a, b] of every element is one contiguous array, so the assembly below adds
    whole rows of memory; the products are one BLAS matrix multiply.
    """
    values, gx, gy, w = gauss_basis(hx, hy)
    stiff = w * (gx[:, :, None] * gx[:, None, :] + gy[:, :, None] * gy[:, None, :])  # (q, a, b)
    ny, nx = nu.shape
    corners = np.stack([nu[dy : ny - 1 + dy, dx : nx - 1 + dx].ravel() for dy, dx in _NODES])  # (node, pixel)
    nu_q = values @ corners  # (q, pixel): nu at the Gauss points
    ke = stiff.reshape(4, 16).T @ nu_q  # (a b, pixel)
    if kappa:
        ke += (kappa**2 * w * np.einsum("qa,qb->ab", values, values)).reshape(16, 1)
    return ke.reshape(4, 4, ny - 1, nx - 1)


def _load(f: np.ndarray | float, shape: tuple[int, int], hx: float, hy: float) -> np.ndarray:
    """Nodal load (N_y, N_x) of a constant or nodal (bilinearly interpolated) source."""
    ny, nx = shape
    b = np.zeros(shape)
    if np.ndim(f) == 0 and f == 0.0:
        return b
    values, _, _, w = gauss_basis(hx, hy)
    f = np.broadcast_to(np.asarray(f, dtype=np.float64), shape)
    corners = np.stack([f[dy : ny - 1 + dy, dx : nx - 1 + dx].ravel() for dy, dx in _NODES])
    fe = (w * values.T @ values) @ corners  # (a, pixel): sum_q w f_q N_a(q)
    for a, (dy, dx) in enumerate(_NODES):
        b[dy : ny - 1 + dy, dx : nx - 1 + dx] += fe[a].reshape(ny - 1, nx - 1)
    return b


def _stencil(nu: np.ndarray, hx: float, hy: float, kappa: float) -> np.ndarray:
    """The matrix as a (3, 3, N_y, N_x) stencil: entry [1+di, 1+dj, i, j] couples node (i, j) to (i+di, j+dj).

    Each node couples to its 3x3 neighbourhood only, so summing the element matrices
    into this array with slices is the whole assembly; couplings that leave the grid
    stay zero.
    """
    ny, nx = nu.shape
    ke = _element_matrices(nu, hx, hy, kappa)
    stencil = np.zeros((3, 3, ny, nx))
    for a, (ya, xa) in enumerate(_NODES):
        for b, (yb, xb) in enumerate(_NODES):
            stencil[yb - ya + 1, xb - xa + 1, ya : ny - 1 + ya, xa : nx - 1 + xa] += ke[a, b]
    return stencil


def _neighbour(field: np.ndarray, di: int, dj: int, fill) -> np.ndarray:
    """field[i + di, j + dj] at every node (i, j), ``fill`` where that leaves the grid."""
    padded = np.pad(field, 1, constant_values=fill)
    ny, nx = field.shape
    return padded[1 + di : 1 + di + ny, 1 + dj : 1 + dj + nx]


def _csr(stencil: np.ndarray) -> sp.csr_matrix:
    """The stencil as an (N, N) CSR matrix, nodes numbered row-major; exact zeros are not stored."""
    _, _, ny, nx = stencil.shape
    n = ny * nx
    index = np.int32 if 9 * n < 2**31 else np.int64
    values = np.ascontiguousarray(stencil.reshape(9, n).T)  # (N, 9), columns ascending within each row
    stored = values != 0.0
    indptr = np.zeros(n + 1, dtype=index)
    np.cumsum(np.count_nonzero(stored, axis=1), out=indptr[1:])
    columns = np.arange(n, dtype=index)[:, None] + np.array([di * nx + dj for di, dj in _NEIGHBOURS], dtype=index)
    return sp.csr_matrix((values[stored], columns[stored], indptr), shape=(n, n))


def assemble(
    nu: np.ndarray, hx: float, hy: float, kappa: float = 0.0, f: np.ndarray | float = 0.0
) -> tuple[sp.csr_matrix, np.ndarray]:
    """Assemble A = K + kappa^2 M and the load b on the structured grid, before boundary conditions.

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
    return _csr(_stencil(nu, hx, hy, kappa)), _load(f, nu.shape, hx, hy).ravel()


@dataclass(frozen=True)
class FEMSystem:
    """An assembled Q1 system with its Dirichlet conditions applied, ready to solve.

    The Dirichlet rows and columns are replaced by the identity (their known values
    moved to the right-hand side), which keeps ``A`` symmetric positive definite.
    """

    A: sp.csr_matrix
    rhs: np.ndarray
    fixed: np.ndarray  # (N,) bool
    values: np.ndarray  # (N,) prescribed values on the fixed nodes, zero elsewhere
    shape: tuple[int, int]

    def solve(self, method: str = "amg", tol: float = 1e-10, stats: dict | None = None) -> np.ndarray:
        """The nodal solution, shape (N_y, N_x), float64.

        Parameters
        ----------
        method : {"amg", "direct"}
            Conjugate gradients preconditioned by pyamg smoothed aggregation, to a
            relative residual ``tol``; or a sparse LU factorisation (SuperLU).
        tol : float
            Relative residual ||rhs - A u|| / ||rhs|| for ``amg``.
        stats : dict, optional
            Filled with ``amg_setup_s``, ``iterations`` and ``relative_residual`` (``amg``).
        """
        if method == "direct":
            from scipy.sparse.linalg import spsolve

            u = spsolve(self.A.tocsc(), self.rhs)
        elif method == "amg":
            u = _amg_cg(self.A, self.rhs, tol, stats if stats is not None else {})
        else:
            raise ValueError(f"unknown method {method!r}; choose 'amg' or 'direct'")
        # The identity rows are only solved to the tolerance; the prescribed values are exact.
        u[self.fixed] = self.values[self.fixed]
        return u.reshape(self.shape)


def _amg_cg(A: sp.csr_matrix, rhs: np.ndarray, tol: float, stats: dict) -> np.ndarray:
    import pyamg

    t0 = time.perf_counter()
    # Jacobi prolongation smoothing weighted row by row (Gershgorin) instead of by a
    # spectral-radius estimate: the Arnoldi estimate was 80 % of pyamg's default setup at
    # 1024^2, and the local weights cost a few more CG iterations than they save.
    ml = pyamg.smoothed_aggregation_solver(A, symmetry="hermitian", smooth=("jacobi", {"weighting": "local"}))
    stats["amg_setup_s"] = time.perf_counter() - t0
    residuals: list[float] = []
    u = ml.solve(rhs, tol=tol, accel="cg", maxiter=500, residuals=residuals)
    norm = max(np.linalg.norm(rhs), np.finfo(float).tiny)
    stats["iterations"] = len(residuals) - 1
    stats["relative_residual"] = float(np.linalg.norm(rhs - A @ u) / norm)
    if stats["relative_residual"] > 10 * tol:
        raise RuntimeError(f"AMG-CG did not converge: relative residual {stats['relative_residual']:.3e} "
                           f"after {stats['iterations']} iterations")
    return u


def dirichlet_system(
    nu: np.ndarray,
    fixed: np.ndarray,
    values: np.ndarray,
    kappa: float = 0.0,
    f: np.ndarray | float = 0.0,
) -> FEMSystem:
    """Assemble -div(nu grad u) + kappa^2 u = f on [0,1]^2 with u = ``values`` on the ``fixed`` nodes.

    The boundary conditions are applied to the stencil before the sparse matrix is
    built (array slices, no sparse products), so this is the whole cost of assembly.

    Parameters
    ----------
    nu : numpy.ndarray
        Nodal diffusivity (N_y, N_x); node spacings 1/(N_x-1) and 1/(N_y-1).
    fixed, values : numpy.ndarray
        (N_y, N_x) Dirichlet mask and prescribed values (only the fixed entries are used).
    kappa, f : reaction coefficient and source (constant or nodal).
    """
    nu = np.asarray(nu, dtype=np.float64)
    ny, nx = nu.shape
    hx, hy = 1.0 / (nx - 1), 1.0 / (ny - 1)
    stencil = _stencil(nu, hx, hy, kappa)
    g = np.where(fixed, values, 0.0)
    rhs = _load(f, nu.shape, hx, hy)
    for di, dj in _NEIGHBOURS:
        # Couplings to fixed nodes move to the right-hand side and leave the matrix.
        entry = stencil[1 + di, 1 + dj]
        rhs -= entry * _neighbour(g, di, dj, 0.0)
        entry[_neighbour(fixed, di, dj, False)] = 0.0
        entry[fixed] = 1.0 if di == dj == 0 else 0.0
    rhs[fixed] = g[fixed]
    return FEMSystem(_csr(stencil), rhs.ravel(), fixed.ravel().copy(), g.ravel(), (ny, nx))


def poisson_system(nu: np.ndarray) -> FEMSystem:
    """-div(nu grad u) = 0 on [0,1]^2, u = 1 at x = 0, u = 0 at x = 1, zero flux at y = 0, 1."""
    ny, nx = np.shape(nu)
    cols = np.broadcast_to(np.arange(nx), (ny, nx))
    return dirichlet_system(nu, (cols == 0) | (cols == nx - 1), (cols == 0).astype(np.float64))


def reaction_diffusion_system(nu: np.ndarray, kappa: float, f: np.ndarray | float) -> FEMSystem:
    """-div(nu grad u) + kappa^2 u = f on [0,1]^2 with u = 0 on the boundary."""
    edge = np.zeros(np.shape(nu), dtype=bool)
    edge[[0, -1], :] = True
    edge[:, [0, -1]] = True
    return dirichlet_system(nu, edge, np.zeros(edge.shape), kappa, f)


def poisson_fem(nu: np.ndarray, method: str = "amg", tol: float = 1e-10) -> np.ndarray:
    """Q1 solution of :func:`poisson_system`, shape (N_y, N_x), float64."""
    return poisson_system(nu).solve(method, tol)


def reaction_diffusion_fem(
    nu: np.ndarray, kappa: float, f: np.ndarray | float, method: str = "amg", tol: float = 1e-10
) -> np.ndarray:
    """Q1 solution of :func:`reaction_diffusion_system`, shape (N_y, N_x), float64."""
    return reaction_diffusion_system(nu, kappa, f).solve(method, tol)
