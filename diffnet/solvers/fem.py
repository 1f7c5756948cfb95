"""The assembled Q1 finite-element system on the unit square or cube, with its Dirichlet conditions:
a direct solve, AMG-preconditioned CG, or the geometric multigrid built from it.

The element is the one of :mod:`diffnet.discretisation.energy` (multilinear on each pixel or voxel, 2^d-point
Gauss, nodal coefficients interpolated to the Gauss points), so the discrete solution here is
the exact minimiser of the energies DiffNet is trained on. One system type serves 2-D and 3-D:
every node is an unknown, the Dirichlet nodes' rows are identity rows, and the dimension is the
grid's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import scipy.sparse as sp

from diffnet.solvers.gmg import GMGSolver
from diffnet.solvers.matrix_stencil import apply_dirichlet, to_csr
from diffnet.solvers.q1 import q1_load, q1_matrix_stencil

__all__ = ["FEMSystem", "assemble", "grid_spacing", "dirichlet_system", "poisson_system", "reaction_diffusion_system",
           "poisson_fem", "reaction_diffusion_fem"]

METHODS = ("amg", "direct", "cholesky", "gmg")


def grid_spacing(shape: tuple[int, ...]) -> tuple[float, ...]:
    """The node spacings of the unit square or cube's grid ``shape`` (axes outermost first), x first."""
    return tuple(1.0 / (n - 1) for n in reversed(shape))


def assemble(
    nu: np.ndarray, spacing: tuple[float, ...], kappa: float = 0.0, f: np.ndarray | float = 0.0
) -> tuple[sp.csr_matrix, np.ndarray]:
    """Assemble A = K + kappa^2 M and the load b on the structured grid, before boundary conditions.

    Parameters
    ----------
    nu : numpy.ndarray
        Nodal diffusivity over the grid, (N_y, N_x) or (N_z, N_y, N_x), positive.
    spacing : tuple of float
        Node spacings, x first.
    kappa : float
        Reaction coefficient.
    f : numpy.ndarray or float
        Source, constant or nodal.

    Returns
    -------
    A : scipy.sparse.csr_matrix
        (N, N) with N the number of nodes, numbered row-major.
    b : numpy.ndarray
        (N,) load.
    """
    nu = np.asarray(nu, dtype=np.float64)
    return to_csr(q1_matrix_stencil(nu, spacing, kappa)), q1_load(f, nu.shape, spacing).ravel()


@dataclass(frozen=True)
class FEMSystem:
    """An assembled Q1 system (2-D or 3-D) with its Dirichlet conditions applied, ready to solve.

    The Dirichlet rows and columns are replaced by the identity (their known values
    moved to the right-hand side), which keeps the matrix symmetric positive definite.
    The matrix is held as its stencil (what the multigrid works on); the CSR form is
    built on first use.
    """

    stencil: np.ndarray  # (*shape, 3, ..., 3), see diffnet.solvers.matrix_stencil
    rhs: np.ndarray  # (N,)
    fixed: np.ndarray  # (N,) bool
    values: np.ndarray  # (N,) prescribed values on the fixed nodes, zero elsewhere
    shape: tuple[int, ...]
    # What the matrix was assembled from, (nu, spacing, kappa): the multigrid forms its first
    # coarse operator from it element by element (coarse_q1_stencil) instead of from the stencil.
    q1: tuple | None = None
    # Nodes outside a domain cut out of the grid (among the fixed ones, held at 0), for the multigrid's
    # coarsening; None on the whole box.
    inactive: np.ndarray | None = None

    @cached_property
    def A(self) -> sp.csr_matrix:
        """(N, N) CSR matrix, nodes numbered row-major."""
        return to_csr(self.stencil)

    def multigrid(self) -> GMGSolver:
        """This system's geometric multigrid hierarchy (:class:`~diffnet.solvers.gmg.GMGSolver`)."""
        return GMGSolver.build(self)

    def solve_block(self, x: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """``x`` (the grid's shape) with its values at the free ``nodes`` (a boolean mask of the grid)
        replaced by the solution of their own rows, every other value held: the energy's minimiser over
        those nodes (a sparse direct solve of the block)."""
        from scipy.sparse.linalg import spsolve

        out = np.array(x, dtype=np.float64).ravel()
        block = np.ravel(nodes) & ~self.fixed
        if block.any():
            rest = ~block
            A = self.A
            rows = A[block]
            out[block] = spsolve(rows[:, block].tocsc(), self.rhs[block] - rows[:, rest] @ out[rest])
        return out.reshape(self.shape)

    def solve(self, method: str = "amg", tol: float = 1e-10, stats: dict | None = None) -> np.ndarray:
        """The nodal solution, shape ``self.shape``, float64.

        Parameters
        ----------
        method : {"amg", "direct", "cholesky", "gmg"}
            Conjugate gradients preconditioned by pyamg smoothed aggregation, to a relative
            residual ``tol``; a sparse LU factorisation (SuperLU, minimum-degree ordering of
            A + Aᵀ, which suits a symmetric stencil: in 3-D a third of the time of its default
            ordering); a sparse Cholesky (CHOLMOD, :mod:`diffnet.solvers.cholesky`); or the geometric
            multigrid's FMG to a tenth of the discretisation error.
        tol : float
            Relative residual ||rhs - A u|| / ||rhs|| for ``amg``.
        stats : dict, optional
            Filled with ``amg_setup_s``, ``iterations`` and ``relative_residual`` (``amg``), or
            ``finest_cycles`` and ``discretisation_estimate`` (``gmg``).
        """
        stats = stats if stats is not None else {}
        if method == "gmg":
            return self.multigrid().fmg(to_discretisation=True, stats=stats)
        if method == "direct":
            from scipy.sparse.linalg import splu

            u = splu(self.A.tocsc(), permc_spec="MMD_AT_PLUS_A").solve(self.rhs)
        elif method == "cholesky":
            from diffnet.solvers.cholesky import cholesky_solve

            u = cholesky_solve(self.A, self.rhs)
        elif method == "amg":
            u = _amg_cg(self.A, self.rhs, tol, stats)
        else:
            raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
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
    flux: np.ndarray | None = None,
) -> FEMSystem:
    """Assemble -div(nu grad u) + kappa^2 u = f on [0,1]^d with u = ``values`` on the ``fixed`` nodes.

    The Q1 system whose energy is :func:`diffnet.discretisation.energy.reaction_diffusion_energy` (and, with
    kappa = 0 and f = 0, :func:`diffnet.discretisation.energy.dirichlet_energy`) on the same grid: nu and f are
    interpolated multilinearly to the 2^d Gauss points of each element, the quadrature those
    energies use, so its solution is the exact minimiser of that energy over the fields with the
    prescribed values (to the solver's tolerance) — a family's same-grid floor and, on a finer
    grid, its reference. The boundary conditions are applied to the stencil (one compiled pass),
    so this is the whole cost of assembly.

    Parameters
    ----------
    nu : numpy.ndarray
        Nodal diffusivity (N_y, N_x) or (N_z, N_y, N_x), positive, over the axes as the fields are;
        node spacings 1/(N - 1) per axis on [0, 1]^d.
    fixed, values : numpy.ndarray
        Dirichlet mask and prescribed values of nu's shape (only the fixed entries are used); the
        other boundary nodes carry zero flux.
    kappa : float
        Reaction coefficient (the term is kappa^2 u).
    f : numpy.ndarray or float
        Source, constant or nodal.
    flux : numpy.ndarray, optional
        The Neumann load of fluxes on the boundary, ∫ q N_a dS per node, nu's shape
        (:meth:`diffnet.instances.boundary.BoxBoundary.flux_load`); the other free boundary nodes carry zero flux.

    Returns
    -------
    FEMSystem
        ``.solve("direct" | "amg" | "gmg")`` gives the nodal solution; ``.multigrid()`` its
        geometric multigrid (:class:`~diffnet.solvers.gmg.GMGSolver`).
    """
    nu = np.asarray(nu, dtype=np.float64)
    if nu.ndim not in (2, 3) or min(nu.shape) < 2:
        raise ValueError(f"need a 2-D or 3-D grid with at least 2 nodes per side, got {nu.shape}")
    spacing = grid_spacing(nu.shape)
    stencil = q1_matrix_stencil(nu, spacing, kappa)
    fixed = np.ascontiguousarray(np.broadcast_to(fixed, nu.shape), dtype=bool)
    g = np.where(fixed, values, 0.0)
    rhs = q1_load(f, nu.shape, spacing)
    if flux is not None:
        rhs += flux
    apply_dirichlet(stencil, rhs, fixed, g)
    return FEMSystem(stencil, rhs.ravel(), fixed.ravel(), g.ravel(), nu.shape, (nu, spacing, kappa))


def poisson_system(nu: np.ndarray, left: float = 1.0, right: float = 0.0) -> FEMSystem:
    """-div(nu grad u) = 0 on [0,1]^d, u = ``left`` at x = 0, ``right`` at x = 1 (x the last axis), zero
    flux on the other sides."""
    x = np.arange(np.shape(nu)[-1])
    last = x[-1]
    return dirichlet_system(nu, (x == 0) | (x == last), np.where(x == 0, float(left), float(right)))


def reaction_diffusion_system(nu: np.ndarray, kappa: float, f: np.ndarray | float) -> FEMSystem:
    """-div(nu grad u) + kappa^2 u = f on [0,1]^d with u = 0 on the boundary."""
    edge = np.ones(np.shape(nu), dtype=bool)
    edge[(slice(1, -1),) * edge.ndim] = False
    return dirichlet_system(nu, edge, np.zeros(edge.shape), kappa, f)


def poisson_fem(nu: np.ndarray, method: str = "amg", tol: float = 1e-10) -> np.ndarray:
    """Q1 solution of :func:`poisson_system`, float64 of nu's shape."""
    return poisson_system(nu).solve(method, tol)


def reaction_diffusion_fem(
    nu: np.ndarray, kappa: float, f: np.ndarray | float, method: str = "amg", tol: float = 1e-10
) -> np.ndarray:
    """Q1 solution of :func:`reaction_diffusion_system`, float64 of nu's shape."""
    return reaction_diffusion_system(nu, kappa, f).solve(method, tol)
