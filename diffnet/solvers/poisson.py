"""Q1 finite-element reference: structured vectorised assembly, AMG-preconditioned CG or a direct solve.

The element is the one of :mod:`diffnet.energy` (bilinear on each pixel, 2x2 Gauss,
nodal diffusivity interpolated to the Gauss points), so the discrete solution here is
the exact minimiser of the energies DiffNet is trained on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import scipy.sparse as sp

from diffnet.energy import ELEMENT_NODES, gauss_basis
from diffnet.solvers.gmg import GMGSolver
from diffnet.solvers.matrix_stencil import apply_dirichlet, to_csr
from diffnet.solvers.q1 import coarse_q1_stencil, q1_matrix_stencil

__all__ = ["FEMSystem", "assemble", "coarse_q1_stencil", "dirichlet_system", "poisson_system", "reaction_diffusion_system",
           "poisson_fem", "reaction_diffusion_fem"]

def _load(f: np.ndarray | float, shape: tuple[int, int], hx: float, hy: float) -> np.ndarray:
    """Nodal load (N_y, N_x) of a constant or nodal (bilinearly interpolated) source."""
    ny, nx = shape
    b = np.zeros(shape)
    if np.ndim(f) == 0 and f == 0.0:
        return b
    values, _, _, w = gauss_basis(hx, hy)
    f = np.broadcast_to(np.asarray(f, dtype=np.float64), shape)
    corners = np.stack([f[dy : ny - 1 + dy, dx : nx - 1 + dx].ravel() for dy, dx in ELEMENT_NODES])
    fe = (w * values.T @ values) @ corners  # (a, pixel): sum_q w f_q N_a(q)
    for a, (dy, dx) in enumerate(ELEMENT_NODES):
        b[dy : ny - 1 + dy, dx : nx - 1 + dx] += fe[a].reshape(ny - 1, nx - 1)
    return b

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
    return to_csr(q1_matrix_stencil(nu, hx, hy, kappa)), _load(f, nu.shape, hx, hy).ravel()

@dataclass(frozen=True)
class FEMSystem:
    """An assembled Q1 system with its Dirichlet conditions applied, ready to solve.

    The Dirichlet rows and columns are replaced by the identity (their known values
    moved to the right-hand side), which keeps the matrix symmetric positive definite.
    The matrix is held as its stencil (what the multigrid works on); the CSR form is
    built on first use.
    """

    stencil: np.ndarray  # (N_y, N_x, 3, 3), see diffnet.solvers.matrix_stencil
    rhs: np.ndarray
    fixed: np.ndarray  # (N,) bool
    values: np.ndarray  # (N,) prescribed values on the fixed nodes, zero elsewhere
    shape: tuple[int, int]
    # What the matrix was assembled from, (nu, hx, hy, kappa): the multigrid forms its first
    # coarse operator from it element by element (coarse_q1_stencil) instead of from the stencil.
    q1: tuple | None = None

    @cached_property
    def A(self) -> sp.csr_matrix:
        """(N, N) CSR matrix, nodes numbered row-major."""
        return to_csr(self.stencil)

    def multigrid(self):
        """This system's geometric multigrid hierarchy (:class:`~diffnet.solvers.gmg.GMGSolver`)."""
        return GMGSolver.build(self)

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

    The Q1 system whose energy is :func:`diffnet.energy.reaction_diffusion_energy` (and, with
    kappa = 0 and f = 0, :func:`diffnet.energy.dirichlet_energy`) on the same grid: nu and f are
    interpolated bilinearly to the 2 x 2 Gauss points of each element, the quadrature those
    energies use, so its solution is the exact minimiser of that energy over the fields with the
    prescribed values (to the solver's tolerance) — a family's same-grid floor and, on a finer
    grid, its reference. The boundary conditions are applied to the stencil (one compiled pass),
    so this is the whole cost of assembly.

    Parameters
    ----------
    nu : numpy.ndarray
        Nodal diffusivity (N_y, N_x), positive, over (y, x) as the fields are; node spacings
        1/(N_x-1) and 1/(N_y-1) on [0, 1]^2.
    fixed, values : numpy.ndarray
        (N_y, N_x) Dirichlet mask and prescribed values (only the fixed entries are used); the other
        boundary nodes carry zero flux.
    kappa : float
        Reaction coefficient (the term is kappa^2 u).
    f : numpy.ndarray or float
        Source, constant or nodal (N_y, N_x).

    Returns
    -------
    FEMSystem
        ``.solve("direct" | "amg")`` gives the nodal solution (N_y, N_x); ``.multigrid()`` its
        geometric multigrid (:class:`~diffnet.solvers.gmg.GMGSolver`).
    """
    nu = np.asarray(nu, dtype=np.float64)
    ny, nx = nu.shape
    hx, hy = 1.0 / (nx - 1), 1.0 / (ny - 1)
    stencil = q1_matrix_stencil(nu, hx, hy, kappa)
    fixed = np.ascontiguousarray(fixed, dtype=bool)
    g = np.where(fixed, values, 0.0)
    rhs = _load(f, nu.shape, hx, hy)
    apply_dirichlet(stencil, rhs, fixed, g)
    return FEMSystem(stencil, rhs.ravel(), fixed.ravel(), g.ravel(), (ny, nx), (nu, hx, hy, kappa))

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
