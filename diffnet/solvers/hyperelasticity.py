"""The classical solve of a Neo-Hookean body: Newton's method with a line search, load steps where it needs them,
and each Newton step's linear system by AMG-preconditioned CG with the rigid-body modes (pyamg's smoothed
aggregation, as linear elasticity's :mod:`diffnet.solvers.elasticity`).

The energy, its gradient and its tangent are the ones DiffNet is trained on
(:mod:`diffnet.discretisation.hyperelasticity`, through torch in float64 for one instance), so the solution is
the exact minimiser of the trained loss on its grid: the floor and, on a finer grid, the reference. The tangent
stencil becomes a CSR matrix node-major (dof = node d + component) through one index per grid.

**Newton.** From the held values (zero elsewhere), or a given start, at load fraction t: the step solves
K(x) dx = -g(x) on the free dofs (CG to ``linear_tol``, or a shifted K where it is indefinite far from the
solution), a backtracking line search takes the largest of 1, 1/2, ... with sufficient decrease of the energy
(Armijo) whose field inverts no element (det F > 0 wherever the iterate had it), and the iteration stops when
the free residual is below ``tol`` of the load's. Each step's system by AMG-CG or a sparse Cholesky (a lagged
tangent, its factorisation kept while each step at least halved the residual, took 19 Newton steps for 5 on one
49² instance and 138 for 6 on another, whose tangent is indefinite early on: not kept). **Load steps**: when
Newton at a fraction fails (no decrease, or no convergence in ``max_steps``), the step in t is halved and tried
from the last converged fraction; every Newton step of every load step is counted (:class:`NewtonStats`).
"""

from __future__ import annotations

import functools
import itertools
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import scipy.sparse as sp
import torch

from diffnet.discretisation.hyperelasticity import J_GUARD, neo_hookean_energy, neo_hookean_stencil, smallest_jacobian
from diffnet.instances.boundary import BoxBoundary
from diffnet.solvers.cholesky import cholesky_solve
from diffnet.solvers.elasticity import from_dofs, rigid_body_modes, to_dofs
from diffnet.solvers.fem import grid_spacing
from diffnet.solvers.vector_gmg import geometric_hierarchy

__all__ = ["NewtonStats", "NeoHookeanBody", "NewtonFailure"]

_ARMIJO = 1e-4
_MIN_LOAD_STEP = 1.0 / 64


class NewtonFailure(RuntimeError):
    """Newton (with load steps) did not reach the solution, or the solution is outside the Neo-Hookean energy's
    range (an element with det F below the guard)."""


@dataclass
class NewtonStats:
    """What a solve cost: Newton steps (over all load steps), load steps, CG iterations, AMG set-ups' seconds."""

    newton_steps: int = 0
    load_steps: int = 0
    cg_iterations: int = 0
    amg_setup_s: float = 0.0
    failed_fractions: list[float] = field(default_factory=list)


@functools.lru_cache(maxsize=16)
def _csr_index(grid: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For a block stencil (d, d, 3^d, *grid), entry [a, b, k] at node i coupling component a at i to b at i + o_k
    (offsets in itertools.product order): the flat source of each coupling inside the grid and its node-major
    (row, col) dofs."""
    d, n = len(grid), math.prod(grid)
    index = np.arange(n).reshape(grid)
    source, rows, cols = [], [], []
    for k, offset in enumerate(itertools.product((-1, 0, 1), repeat=d)):
        i = index[tuple(slice(max(-o, 0), m - max(o, 0)) for o, m in zip(offset, grid))].ravel()
        j = index[tuple(slice(max(o, 0), m - max(-o, 0)) for o, m in zip(offset, grid))].ravel()
        for a, b in itertools.product(range(d), repeat=2):
            source.append(((a * d + b) * 3**d + k) * n + i)
            rows.append(i * d + a)
            cols.append(j * d + b)
    return np.concatenate(source), np.concatenate(rows), np.concatenate(cols)


@dataclass
class NeoHookeanBody:
    """One Neo-Hookean body on the unit square or cube: nodal shear modulus, Poisson ratio, the sides' conditions
    (one :class:`BoxBoundary` per component, x first) and the traction's scale."""

    shear: np.ndarray  # (*grid)
    nu: float
    boundaries: Sequence[BoxBoundary]
    scale: float = 1.0

    def __post_init__(self) -> None:
        self.shape = tuple(self.shear.shape)
        self.dims = len(self.shape)
        self.spacing = grid_spacing(self.shape)
        fixed, values = zip(*(b.fixed(self.shape) for b in self.boundaries))
        self.fixed = to_dofs(np.stack(fixed)).astype(bool)
        self.values = to_dofs(np.stack(values))
        self.free = ~self.fixed
        self.traction = to_dofs(np.stack([b.flux_load(self.shape) for b in self.boundaries]))
        self._shear = torch.as_tensor(self.shear, dtype=torch.float64)[None]
        self._nu = torch.tensor([self.nu], dtype=torch.float64)
        self.modes = rigid_body_modes(self.shape)[self.free]

    # -- the energy, its gradient and tangent, node-major dofs --------------------------------------------------
    def _field(self, x: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(from_dofs(x, self.shape).copy(), dtype=torch.float64)[None]

    def energy(self, x: np.ndarray, t: float = 1.0) -> float:
        """The total potential energy at dofs x under the load fraction t."""
        with torch.no_grad():
            stored = float(neo_hookean_energy(self._field(x), self._shear, self._nu, self.spacing)[0])
        return stored - t * self.scale * float(self.traction @ x)

    def gradient(self, x: np.ndarray, t: float = 1.0) -> np.ndarray:
        # Under any grad mode: a solve may run inside an autograd Function's forward (an inverse problem's classical
        # side), where grad is off.
        with torch.inference_mode(False), torch.enable_grad():
            u = self._field(x).requires_grad_(True)
            (g,) = torch.autograd.grad(neo_hookean_energy(u, self._shear, self._nu, self.spacing).sum(), u)
        return to_dofs(g[0].numpy()) - t * self.scale * self.traction

    def tangent(self, x: np.ndarray) -> sp.csr_matrix:
        """The tangent stiffness K(x) (d N, d N)."""
        with torch.no_grad():
            stencil = neo_hookean_stencil(self._field(x), self._shear, self._nu, self.spacing)[0]
        source, row, col = _csr_index(self.shape)
        n = x.size
        return sp.csr_matrix((stencil.reshape(-1).numpy()[source], (row, col)), shape=(n, n))

    def smallest_jacobian(self, x: np.ndarray) -> float:
        return float(smallest_jacobian(self._field(x), self.spacing)[0])

    # -- Newton, load steps ------------------------------------------------------------------------------------
    def solve(self, tol: float = 1e-10, linear_tol: float = 1e-10, start: np.ndarray | None = None,
              max_steps: int = 30, stats: NewtonStats | None = None, linear: str = "amg") -> np.ndarray:
        """The displacement (d, *grid) minimising the energy at the full load, from ``start`` (d, *grid: Newton at the
        full load, and where that fails the load steps from the held values) or the held values; ``stats`` gathers the
        cost; each Newton step's system by ``linear``: "amg" (AMG-CG to ``linear_tol``), "gmg" (geometric-multigrid CG,
        :mod:`diffnet.solvers.vector_gmg`) or "cholesky" (a sparse Cholesky, :mod:`diffnet.solvers.cholesky`). Raises
        :class:`NewtonFailure` naming what failed."""
        stats = stats if stats is not None else NewtonStats()
        x = self.values * self.fixed
        if start is not None:
            # A start is a neighbour's solution, for the full load: Newton there, else the load steps from rest (the
            # start is far from any fraction's solution; an inverse problem's chain met this on the plate).
            trial = self._newton(np.where(self.fixed, self.values, to_dofs(start)), 1.0, tol, linear_tol, max_steps,
                                 stats, linear=linear)
            stats.load_steps += 1
            if trial is not None:
                return self._checked(trial)
            stats.failed_fractions.append(1.0)
        done, step = 0.0, 1.0
        while done < 1.0:
            t = min(1.0, done + step)
            trial = self._newton(x, t, tol, linear_tol, max_steps, stats, linear=linear)
            stats.load_steps += 1
            if trial is not None:
                x, done = trial, t
                step = min(2 * step, 1.0 - done) if done < 1.0 else step
                continue
            stats.failed_fractions.append(t)
            step /= 2
            if step < _MIN_LOAD_STEP:
                raise NewtonFailure(f"Newton did not converge at load fraction {t:.4g} even with load steps of "
                                    f"{2 * step:.3g} ({stats.newton_steps} Newton steps)")
        return self._checked(x)

    def _checked(self, x: np.ndarray) -> np.ndarray:
        """The solution x as a field (d, *grid), refused where it inverts elements below the energy's guard."""
        j = self.smallest_jacobian(x)
        if j < J_GUARD:
            raise NewtonFailure(f"the load inverts elements: det F = {j:.3g} at the solution, below the energy's "
                                f"guard {J_GUARD:g} (a smaller load, or a stiffer material)")
        return from_dofs(x, self.shape)

    def _newton(self, x: np.ndarray, t: float, tol: float, linear_tol: float, max_steps: int,
                stats: NewtonStats, strict: bool = True, linear: str = "amg") -> np.ndarray | None:
        """Newton at load fraction t from x (the held dofs at their values scaled by t); None where it fails (without
        ``strict``, the iterate after ``max_steps``: a polish)."""
        import pyamg

        free = self.free
        x = np.where(self.fixed, t * self.values, x)
        reference = max(float(np.linalg.norm((t * self.scale * self.traction)[free])), 1e-300)
        if not np.any(self.traction):  # a displacement-driven body: its reaction forces set the scale
            reference = max(float(np.linalg.norm(self.gradient(np.where(self.fixed, x, 0.0), t))), 1e-300)
        energy = self.energy(x, t)
        for _ in range(max_steps):
            g = self.gradient(x, t)
            if not np.isfinite(g).all():
                return None
            if float(np.linalg.norm(g[free])) <= tol * reference:
                return x
            k = self.tangent(x)[free][:, free].tocsr()
            if not np.isfinite(k.data).all():
                return None
            residuals: list[float] = []
            dx = np.full_like(x, math.nan)
            t0 = time.perf_counter()
            # An indefinite tangent far from the solution ends CG with a warning (pyamg re-enables its own: recorded
            # here, not printed), or the set-up's spectral estimate fails on it: the step is checked for descent below.
            with warnings.catch_warnings(record=True):
                try:
                    if linear == "cholesky":  # an indefinite tangent fails its factorisation: a ValueError
                        dx[free] = cholesky_solve(k, -g[free])
                    else:
                        ml = (geometric_hierarchy(k, self.shape, free) if linear == "gmg" else
                              pyamg.smoothed_aggregation_solver(k, B=self.modes, symmetry="hermitian"))
                        stats.amg_setup_s += time.perf_counter() - t0
                        dx[free] = ml.solve(-g[free], tol=linear_tol, accel="cg", maxiter=500, residuals=residuals)
                    dx[self.fixed] = 0.0
                except ValueError:
                    pass
            stats.cg_iterations += max(len(residuals) - 1, 0)
            stats.newton_steps += 1
            slope = float(g @ dx) if np.isfinite(dx).all() else math.nan
            if not slope < 0:  # an indefinite tangent's CG step is no descent direction: steepest descent instead
                dx = np.where(free, -g, 0.0)
                slope = float(g @ dx)
            feasible = self.smallest_jacobian(x) > 0
            alpha = 1.0
            while alpha > 1e-8:
                trial = x + alpha * dx
                e = self.energy(trial, t)
                if math.isfinite(e) and e <= energy + _ARMIJO * alpha * slope and \
                        (not feasible or self.smallest_jacobian(trial) > 0):
                    break
                alpha *= 0.5
            else:
                return None
            x, energy = trial, e
        if not strict:
            return x
        g = self.gradient(x, t)
        return x if float(np.linalg.norm(g[free])) <= tol * reference else None

    def polish(self, start: np.ndarray, steps: int, linear: str = "amg") -> np.ndarray:
        """``steps`` damped Newton steps at the full load from the displacement ``start`` (d, *grid) (the held dofs set
        to their values), each step's system by ``linear`` (as :meth:`solve`): the network's field polished."""
        x = np.where(self.fixed, self.values, to_dofs(np.asarray(start, dtype=np.float64)))
        stats = NewtonStats()
        for _ in range(steps):
            moved = self._newton(x, 1.0, 0.0, 1e-10, 1, stats, strict=False, linear=linear)
            if moved is None:
                break
            x = moved
        return from_dofs(x, self.shape)
