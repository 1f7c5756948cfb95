"""The lid-driven cavity's classical solve: Newton on the stabilised Q1 residual with a sparse LU.

The unit square, the lid y = 1 moving at u = 1 (its two corners held at rest, the regularised cavity), the other
walls at rest; the pressure pinned to 0 at the corner (0, 0) (only its gradient is defined: the pinned node's
continuity row, the one the others imply, is left out). The Jacobian is read off the residual by coloured
vector-Jacobian products (:func:`diffnet.solvers.newton.sparse_jacobian`), the steps solved by a sparse LU
(:mod:`diffnet.solvers.sparse_lu`). A Reynolds number beyond the reach of Newton from rest is approached by
continuation: the ladder Re = 100, 200, ... is solved once per grid and kept (:func:`ladder_solution`), and any Re
starts from its nearest rung, as a user sweeping Re starts each solve from the nearest one solved.
Also the stream function of a velocity field (:func:`stream_function`), the Q1 solve of -Δψ = ω, ψ = 0 on the walls.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
from scipy.sparse.linalg import splu

from diffnet.discretisation.energy import at_gauss_points
from diffnet.discretisation.navier_stokes import navier_stokes_residual
from diffnet.grid.element import gauss_basis
from diffnet.solvers.fem import dirichlet_system
from diffnet.solvers.newton import newton_solve

__all__ = ["RUNG", "boundary_tensors", "cavity_boundary", "cavity_residual", "cavity_solve", "ladder_solution",
           "nearest_rung", "stream_function"]

RUNG = 100.0  # the continuation's step in Re: Newton from the last solution converges over it at 257^2


def cavity_boundary(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(fixed, values) on n x n nodes: a (3, n, n) bool mask of the fixed unknowns (the walls' velocities, the pinned
    pressure) and their (3, n, n) values (u = 1 on the lid between its corners)."""
    fixed, values = np.zeros((3, n, n), dtype=bool), np.zeros((3, n, n))
    for c in (0, 1):
        fixed[c, [0, -1], :] = fixed[c, :, [0, -1]] = True
    values[0, -1, 1:-1] = 1.0
    fixed[2, 0, 0] = True
    return fixed, values


@lru_cache(maxsize=8)
def boundary_tensors(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`cavity_boundary` as tensors (shared: never written), built once per grid: the residual is evaluated at every Newton
    step and line-search trial, and the family's field and residual at every training step."""
    return tuple(torch.as_tensor(a) for a in cavity_boundary(n))


def cavity_residual(fields: torch.Tensor, nu: torch.Tensor | float) -> torch.Tensor:
    """The residual with the boundary rows replaced by (field - boundary value), (S, 3, n, n); the interior rows are
    the weak-form integrals times (n - 1)^2, O(1) on every grid."""
    n = fields.shape[-1]
    fixed, values = (a.to(fields.device) for a in boundary_tensors(n))
    r = navier_stokes_residual(fields, nu, (1.0 / (n - 1),) * 2)
    return torch.where(fixed, fields - values.to(fields.dtype), r * (n - 1) ** 2)


def cavity_solve(re: float, n: int, initial: np.ndarray | None = None, tol: float = 1e-10,
                 steps: int | None = None, lu: str = "superlu", stats: list | None = None) -> np.ndarray:
    """The cavity's same-grid solution (3, n, n) at Reynolds number ``re`` (the pressure pinned at (0, 0)), from
    ``initial`` (default: rest, by continuation in rungs of :data:`RUNG` beyond Re = 100); with ``steps``, that many
    Newton steps and no more (a polish). ``lu``: each step's sparse LU; ``stats`` gets one entry per Newton step."""
    nu_of = lambda r: torch.tensor([1.0 / r], dtype=torch.float64)  # noqa: E731
    fixed, values = cavity_boundary(n)
    if initial is None:
        x = torch.as_tensor(np.where(fixed, values, 0.0))
        ladder = [*np.arange(RUNG, re, RUNG), re]
    else:
        start = np.array(initial, dtype=np.float64)
        start[2] -= start[2, 0, 0]  # the pressure's gauge: 0 at the pinned corner
        x, ladder = torch.as_tensor(np.where(fixed, values, start)), [re]
    for r in ladder:
        fn = lambda f, nu=nu_of(r): cavity_residual(f, nu.expand(len(f)))  # noqa: E731
        x = newton_solve(fn, x, reach=1, tol=tol, max_iter=40 if steps is None else steps, what=f"cavity at Re = {r:g}",
                         strict=steps is None, components=True, lu=lu, stats=stats)
    return x.numpy().copy()


def nearest_rung(re: float, other: bool = False) -> float:
    """The continuation ladder's Re nearest to ``re`` (at least :data:`RUNG`); with ``other``, the nearest that is not
    ``re`` itself (a classical solve of a Re not yet solved: a rung's own solution would be free)."""
    rungs = RUNG * np.arange(max(1.0, np.floor(re / RUNG) - 1), np.ceil(re / RUNG) + 2)
    if other:
        rungs = rungs[np.abs(rungs - re) > 1e-9 * re]
    return float(rungs[np.argmin(np.abs(rungs - re))])


@lru_cache(maxsize=64)
def ladder_solution(re: float, n: int, lu: str = "superlu") -> np.ndarray:
    """The solution at the ladder's Re (a multiple of :data:`RUNG`) on n x n nodes, solved once per process from the
    rung below (Re = 100 from rest); read-only."""
    below = None if re <= RUNG else ladder_solution(re - RUNG, n, lu)
    out = cavity_solve(re, n, initial=below, lu=lu)
    out.setflags(write=False)
    return out


@lru_cache(maxsize=8)
def _stream_factor(n: int):
    """The Q1 Laplacian of the unit square on n x n nodes with ψ = 0 on the walls (:func:`~diffnet.solvers.fem.
    dirichlet_system`: identity rows there), factorised once per grid: every stream function on it is one solve."""
    walls = np.ones((n, n), dtype=bool)
    walls[1:-1, 1:-1] = False
    system = dirichlet_system(np.ones((n, n)), walls, np.zeros((n, n)))
    return splu(system.A.tocsc()), walls.ravel()


def stream_function(fields: np.ndarray) -> np.ndarray:
    """ψ (S, n, n) of velocities ``fields`` (S, >= 2, n, n) on the unit square: the Q1 solution of -Δψ = ω with
    ψ = 0 on the walls, its load ∫ N_a ω = ∫ (∂_y N_a u - ∂_x N_a v) taken from the velocity itself (no derivative of
    the field is recovered). u = ∂ψ/∂y, v = -∂ψ/∂x, so the primary vortex's ψ is negative (Ghia et al.'s sign)."""
    fields = np.asarray(fields, dtype=np.float64)
    n = fields.shape[-1]
    values, gx, gy, w = gauss_basis(1.0 / (n - 1), 1.0 / (n - 1))
    u, v = (at_gauss_points(torch.as_tensor(fields[:, c]), values) for c in (0, 1))
    test = torch.zeros(fields.shape[0], n, n, dtype=torch.float64, requires_grad=True)
    with torch.enable_grad():  # the load is linear in the test function: its gradient, every sample at once
        load = w * (at_gauss_points(test, gy) * u - at_gauss_points(test, gx) * v).sum()
        (b,) = torch.autograd.grad(load, test)
    factor, walls = _stream_factor(n)
    load = b.reshape(len(b), -1).numpy().T.copy()
    load[walls] = 0.0  # ψ = 0 there
    return factor.solve(load).T.reshape(-1, n, n)
