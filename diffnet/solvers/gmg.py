"""Geometric multigrid for the structured Q1 systems in 2-D and 3-D: multilinear prolongation, Galerkin
coarse operators, full multigrid (FMG) stopped at discretisation accuracy.

Every level is a stencil on its node grid and every kernel (Gauss-Seidel, residual,
transfers, the Galerkin product) is a compiled pass over the nodes
(:mod:`diffnet.solvers.matrix_stencil`), one set for both dimensions: a 2-D level is held as a 3-D
grid of one layer. The coarsest level is factorised once with SuperLU and the
multigrid-preconditioned CG is scipy's. The cycle is the one this module ran on pyamg's
machinery before (forward Gauss-Seidel before, backward after; the tests check it against
sparse matrices on the same levels), at 2.4x its speed at 1025^2 and without its fixed
overhead on small grids (figures in :mod:`diffnet.solvers.matrix_stencil`).

Why geometric: on a structured grid with a smooth diffusivity the multilinear interpolant
is the prolongation aggregation-based AMG tries to discover, and building it costs
one pass over the nodes instead of an aggregation and a smoothing pass over the matrix.
FMG then reaches the grid's own discretisation error in a fixed number of cycles,
independent of the grid, instead of iterating to a tolerance that has no relation to that error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import scipy.sparse as sp

from diffnet.solvers import matrix_stencil as ms
from diffnet.grid.level import Level
from diffnet.grid.transfer import grid_hierarchy, interpolation_matrix, interpolation_weights
from diffnet.solvers.matrix_stencil import grid3, stencil3, stencil_native
from diffnet.solvers.q1 import coarse_q1_stencil

__all__ = ["COARSEST", "prolongation", "GMGSolver", "StencilSystem", "gmg_solve"]

COARSEST = 9  # nodes per side at which the hierarchy stops; solved by sparse LU


class StencilSystem(Protocol):
    """What the multigrid reads of a linear system on a node grid (the FEM systems are such, and build
    their multigrid: a structural type here, so that this module imports nothing of theirs)."""

    stencil: np.ndarray  # (*shape, 3, ..., 3), see diffnet.solvers.matrix_stencil
    rhs: np.ndarray  # (N,)
    fixed: np.ndarray  # (N,) bool
    values: np.ndarray  # (N,) prescribed values on the fixed nodes
    shape: tuple[int, ...]
    q1: tuple | None  # what the matrix was assembled from (nu, spacing, kappa), or None
    inactive: np.ndarray | None  # nodes outside a cut domain, or None


def prolongation(fine: tuple[int, ...], coarse: tuple[int, ...]) -> sp.csr_matrix:
    """Multilinear interpolation from a coarse node grid to a fine one (2-D or 3-D), nodes row-major."""
    P = sp.csr_matrix(interpolation_matrix(coarse[0], fine[0]))
    for f, c in zip(fine[1:], coarse[1:]):
        P = sp.kron(P, sp.csr_matrix(interpolation_matrix(c, f)), format="csr")
    return P.tocsr()


def _nearest(fine: int, coarse: int) -> np.ndarray:
    """For each of ``coarse`` nodes on [0, 1], the index of the nearest of ``fine`` nodes."""
    return np.rint(np.linspace(0, fine - 1, coarse)).astype(np.int64)


def _axes(fine: tuple[int, ...], coarse: tuple[int, ...]) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """Per axis of the 3-D layout (z, y, x), the interpolation (left, weight) from ``coarse`` to ``fine``
    (a 2-D grid's z: its one layer onto itself)."""
    pairs = [interpolation_weights(f, c) for f, c in zip(fine, coarse)]
    return tuple([interpolation_weights(1, 1)] * (3 - len(fine)) + pairs)


def _q1_coarsening(level: Level, fixed_coarse: np.ndarray) -> bool:
    """Whether the coarse operator below ``level`` may be formed element by element from the Q1
    data: nested grids, and every fixed fine node interpolating only from fixed coarse nodes
    (then P's rows at fixed fine nodes lie in the columns cut anyway; true for boundary lines and planes)."""
    fine = level.fixed.shape
    if any(f != 2 * c - 1 for f, c in zip(fine, fixed_coarse.shape) if f > 1):
        return False
    reach = np.zeros(fine)
    ms.interpolate((~fixed_coarse).astype(np.float64), *_flat(level), np.zeros(fine, dtype=bool), reach)
    return not reach[level.fixed].any()


@dataclass
class _Work:
    """What the numpy cycle keeps for one level (:attr:`diffnet.grid.level.Level.smoother`): the compiled passes of its
    dimension and work arrays allocated once (a fresh 8 MB array per cycle and level cost its page faults again
    every cycle at 1025^2)."""

    passes: object
    residual: np.ndarray
    rhs: np.ndarray  # a coarse level's right-hand side within a cycle
    correction: np.ndarray


def _make_level(S: np.ndarray, fixed: np.ndarray, values: np.ndarray, inactive: np.ndarray | None = None) -> Level:
    """A level of the 3-D layout (a 2-D grid as one layer, :mod:`~diffnet.solvers.matrix_stencil`): its stencil
    (N_z, N_y, N_x, k_z, k, k), fixed rows identity rows, its Dirichlet nodes and data, with its work arrays; the
    interpolation from the next coarser grid (per axis z, y, x: left neighbour and weight) is set by the builder."""
    work = _Work(ms.kernels(2 if S.shape[3] == 1 else 3),  # a 2-D grid's stencil is one coupling deep in z
                 np.empty(fixed.shape), np.empty(fixed.shape), np.empty(fixed.shape))
    return Level(S, fixed, values=values, inactive=inactive, smoother=work)


def _flat(level: Level) -> tuple[np.ndarray, ...]:
    """The interpolation's arrays as the kernels take them: lz, wz, ly, wy, lx, wx."""
    return tuple(a for pair in level.interpolation for a in pair)


def _up(level: Level, coarse: np.ndarray, out: np.ndarray) -> None:
    """out += P coarse on the level's free nodes."""
    ms.interpolate(coarse, *_flat(level), level.fixed, out)


def _down(level: Level, fine: np.ndarray, coarse: Level, out: np.ndarray | None = None) -> np.ndarray:
    """Pᵀ fine from the level's free nodes, zero on the coarse level's fixed nodes."""
    out = np.empty(coarse.fixed.shape) if out is None else out
    ms.restrict(fine, *_flat(level), level.fixed, coarse.fixed, out)
    return out


def _level(system: StencilSystem) -> Level:
    """A system's operator and Dirichlet data as a level (views in the 3-D layout)."""
    shape = system.shape
    inactive = None if system.inactive is None else grid3(system.inactive.reshape(shape))
    return _make_level(stencil3(system.stencil), grid3(system.fixed.reshape(shape)), grid3(system.values.reshape(shape)),
                       inactive)


def _factorise(level: Level, dims: int):
    """SuperLU of a level's operator (the coarsest)."""
    from scipy.sparse.linalg import splu

    return splu(ms.to_csr(stencil_native(level.stencil, dims)).tocsc())


@dataclass
class GMGSolver:
    """A geometric multigrid hierarchy for one assembled Q1 system, 2-D or 3-D (Dirichlet nodes held at their values).

    Attributes
    ----------
    system : StencilSystem
        The finest system; its Dirichlet rows are identity rows decoupled from the rest.
    levels : list of diffnet.grid.level.Level
        Coarsest first (level 0; the finest last): stencils A_{l-1} = P_lᵀ A_l P_l (Galerkin), multilinear P_l
        without rows at fixed fine nodes or columns at fixed coarse ones; each level keeps identity rows
        at its own fixed nodes (the fine ones nearest to them), holding its own Dirichlet data.
    """

    system: StencilSystem
    levels: list
    coarse_lu: object  # SuperLU of the coarsest operator
    # The smoother of every V-cycle: forward Gauss-Seidel before the coarse correction and backward
    # after (the classical solver's), or ``sweeps`` damped-Jacobi sweeps before and after (the one
    # the batched torch V-cycle of diffnet.multigrid.vcycle runs, so this hierarchy is its test oracle).
    smoother: str = "gauss-seidel"
    sweeps: int = 2
    omega: float = 2.0 / 3.0

    @classmethod
    def build(cls, system: StencilSystem, coarsest: int = COARSEST) -> "GMGSolver":
        """The Galerkin hierarchy down to a grid with at most ``coarsest`` nodes on a side."""
        dims = len(system.shape)
        level = _level(system)
        levels = [level]
        grids = grid_hierarchy(system.shape, coarsest)[::-1]  # built from the finest down
        for fine, coarse in zip(grids, grids[1:]):
            level.interpolation = _axes(fine, coarse)
            # A coarse node is fixed when the fine node nearest to it is: boundary nodes
            # coincide on every grid; interior coarse nodes fall on or between interior ones.
            coarse3 = (1,) * (3 - dims) + tuple(coarse)
            nearest = np.ix_(*(_nearest(f, c) for f, c in zip(level.fixed.shape, coarse3)))
            fixed = np.ascontiguousarray(level.fixed[nearest])
            inactive = None
            if level.inactive is not None:
                # Nodes outside a domain cut out of the grid: a coarse node stays free while its support
                # reaches an active fine node (by the nearest rule a coarse node just outside the boundary
                # would be held, and the coarse space could not follow the solution there: a V-cycle
                # contracted by 0.74 instead of 0.2 on the torsion family's Nitsche system at 64^2).
                reach = np.empty(coarse3)
                none = np.zeros(level.fixed.shape, dtype=bool)
                ms.restrict((~level.inactive).astype(np.float64), *_flat(level), none, np.zeros(coarse3, bool), reach)
                inactive = reach <= 0
                fixed = np.ascontiguousarray((fixed & ~level.inactive[nearest]) | inactive)
            if len(levels) == 1 and system.q1 is not None and _q1_coarsening(level, fixed):
                S = stencil3(coarse_q1_stencil(*system.q1, fixed.reshape(coarse)))
            else:
                width = max(ms.coarse_width(level.stencil.shape[3 + axis] // 2, *level.interpolation[axis])
                            for axis in range(3 - dims, 3))
                S = level.smoother.passes.galerkin(level.stencil, level.fixed, fixed, *_flat(level), width)
            # Values are zero off the fixed nodes on every level, so reading them at the
            # nearest fine nodes keeps them zero off the coarse fixed nodes.
            level = _make_level(S, fixed, np.where(fixed, level.values[nearest], 0.0), inactive)
            levels.append(level)
        levels.reverse()  # coarsest first
        return cls(system, levels, _factorise(levels[0], dims))

    @classmethod
    def from_systems(cls, systems: list[StencilSystem], smoother: str = "jacobi") -> "GMGSolver":
        """A hierarchy of rediscretised operators: ``systems`` on successively finer grids, coarsest
        first (each its own assembly, not a Galerkin product), multilinear transfers between them."""
        levels = [_level(s) for s in systems]
        for level, coarse, fine in zip(levels[1:], systems, systems[1:]):
            level.interpolation = _axes(fine.shape, coarse.shape)
        return cls(systems[-1], levels, _factorise(levels[0], len(systems[0].shape)), smoother=smoother)

    def _smooth(self, level: Level, x: np.ndarray, b: np.ndarray, forward: bool) -> None:
        if self.smoother == "gauss-seidel":
            level.smoother.passes.gauss_seidel(level.stencil, x, b, forward)
            return
        kz, ky, kx = level.stencil.shape[3:]
        diagonal = level.stencil[:, :, :, kz // 2, ky // 2, kx // 2]
        for _ in range(self.sweeps):
            level.smoother.passes.residual(level.stencil, x, b, level.smoother.residual)
            x += self.omega * level.smoother.residual / diagonal

    def precondition(self, r: np.ndarray, cycles: int = 1) -> np.ndarray:
        """B r: ``cycles`` V-cycles on A x = r from x = 0 (r of the grid's shape, zero on the fixed nodes)."""
        b = np.ascontiguousarray(r, dtype=np.float64).reshape(self._shape3)
        return self._cycles(self._finest, np.zeros(self._shape3), b, cycles).reshape(self.system.shape)

    @property
    def _shape3(self) -> tuple[int, int, int]:
        """The finest grid in the 3-D layout."""
        return self.levels[-1].fixed.shape

    @property
    def _finest(self) -> int:
        return len(self.levels) - 1

    def _coarse_solve(self, b: np.ndarray) -> np.ndarray:
        return self.coarse_lu.solve(b.ravel()).reshape(b.shape)

    def _vcycle(self, k: int, x: np.ndarray, b: np.ndarray) -> None:
        """One V(1,1)-cycle on level k in place: forward Gauss-Seidel, coarse correction, backward
        Gauss-Seidel (a symmetric cycle, so a valid CG preconditioner, at half the cost of symmetric sweeps)."""
        level, coarse = self.levels[k], self.levels[k - 1]
        self._smooth(level, x, b, True)
        level.smoother.passes.residual(level.stencil, x, b, level.smoother.residual)
        rc = _down(level, level.smoother.residual, coarse, coarse.smoother.rhs)
        if k == 1:
            e = self._coarse_solve(rc)
        else:
            e = coarse.smoother.correction
            e[:] = 0.0
            self._vcycle(k - 1, e, rc)
        _up(level, e, x)
        self._smooth(level, x, b, False)

    def _cycles(self, k: int, x: np.ndarray, b: np.ndarray, cycles: int) -> np.ndarray:
        for _ in range(cycles):
            if k == 0:
                return self._coarse_solve(b)
            self._vcycle(k, x, b)
        return x

    def fmg(self, cycles: int = 1, to_discretisation: bool = False, stats: dict | None = None,
            max_cycles: int = 50) -> np.ndarray:
        """Full multigrid: the system on every level, the coarsest solved exactly, then on each finer
        level ``cycles`` V-cycles from the interpolated coarser solution.

        Level l-1's system is the Galerkin projection of level l's with level l-1's own
        Dirichlet data: its free unknowns v solve P_lᵀ A_l (P_l v + g_l) = P_lᵀ b_l, where g_l
        is the coarse boundary data interpolated onto level l's free nodes. Projecting the
        fine boundary data instead (a one-cell ramp no coarse function can follow) leaves
        an O(1) boundary-layer error for the fine cycles to remove.

        With ``to_discretisation``, V-cycles continue on the finest level until the algebraic
        error left -- the last cycle's change, or that change times rho / (1 - rho) with rho
        the ratio of the last two changes -- is a tenth of the discretisation error,
        estimated as ||u_h - I u_2h|| / 3 (second order: the coarser level's error is four
        times this one's). One FMG cycle reaches that for smooth diffusivities, but where nu varies over
        many decades the V-cycle contracts by only 0.3-0.5 and more cycles are needed.

        Returns the nodal solution (the system's shape) with its Dirichlet values; ``stats`` gets
        ``finest_cycles`` and ``discretisation_estimate`` (relative).
        """
        levels = self.levels[::-1]  # finest first, the order the right-hand sides are restricted in
        rhs = [self.system.rhs.reshape(self._shape3)]
        for level, coarse in zip(levels, levels[1:]):
            # The level's system with the coarse Dirichlet data lifted onto it (and its own on its fixed nodes).
            lift = level.values.copy()
            _up(level, coarse.values, lift)
            r = np.empty_like(lift)
            level.smoother.passes.residual(level.stencil, lift, rhs[-1], r)
            b = _down(level, r, coarse)
            b[coarse.fixed] = coarse.values[coarse.fixed]
            rhs.append(b)
        x = self._coarse_solve(rhs[-1])
        for k in range(1, len(self.levels)):  # coarse to fine
            level = self.levels[k]
            start = level.values.copy()
            _up(level, x, start)
            x = self._cycles(k, start.copy(), rhs[self._finest - k], cycles)
        done = cycles
        estimate = np.linalg.norm(x - start) / 3.0 if len(levels) > 1 else 0.0
        change = np.inf
        step = np.empty_like(x)  # one buffer: a fresh 8 MB pair per cycle cost ~10 ms of page faults at 1025^2
        while to_discretisation and len(levels) > 1 and done < max_cycles:
            np.copyto(step, x)
            self._vcycle(self._finest, x, rhs[0])
            done += 1
            np.subtract(x, step, out=step)
            change, last = np.linalg.norm(step.ravel()), change
            # The error left is about change * rho / (1 - rho), rho the cycle's contraction
            # (the ratio of successive changes): stop when that is a tenth of the estimate.
            rho = min(change / last, 0.9) if np.isfinite(last) and last > 0 else None
            if change <= 0.1 * estimate or (rho is not None and change * rho / (1.0 - rho) <= 0.1 * estimate):
                break
        if stats is not None:
            stats["finest_cycles"] = done
            stats["discretisation_estimate"] = float(estimate / max(np.linalg.norm(x), np.finfo(float).tiny))
        return self._full(x)

    def vcycles(self, initial: np.ndarray, cycles: int) -> np.ndarray:
        """``cycles`` V(1,1)-cycles on the finest level from ``initial`` (the grid's shape): the polish of a
        network's output. The Dirichlet values are taken from the system, whatever ``initial`` holds there."""
        if cycles < 0:
            raise ValueError(f"cycles must be >= 0, got {cycles}")
        level = self.levels[-1]
        x = np.array(initial, dtype=np.float64).reshape(self._shape3)
        x[level.fixed] = level.values[level.fixed]
        x = self._cycles(self._finest, x, self.system.rhs.reshape(self._shape3), cycles)
        return self._full(x)

    def solve(self, tol: float, maxiter: int = 200, stats: dict | None = None,
              initial: np.ndarray | None = None) -> np.ndarray:
        """Multigrid-preconditioned CG (scipy's) from zero (or ``initial``, the grid's shape) to the relative
        residual ``tol`` or ``maxiter`` iterations (the classical use)."""
        from scipy.sparse.linalg import LinearOperator, cg

        shape, n = self._shape3, self.system.rhs.size
        zero = np.zeros(shape)

        def matvec(v: np.ndarray) -> np.ndarray:
            out = np.empty(shape)
            self.levels[-1].smoother.passes.residual(self.levels[-1].stencil, v.reshape(shape), zero, out)
            return -out.ravel()

        def precondition(r: np.ndarray) -> np.ndarray:
            return self.precondition(r.reshape(shape)).ravel()

        iterations = [0]

        def count(_):
            iterations[0] += 1

        x0 = None if initial is None else self._full(np.ravel(initial)).ravel()
        x, _ = cg(LinearOperator((n, n), matvec), self.system.rhs, x0=x0, rtol=tol, atol=0.0, maxiter=maxiter,
                  M=LinearOperator((n, n), precondition), callback=count)
        if stats is not None:
            stats["iterations"] = iterations[0]
        return self._full(x)

    def _full(self, x: np.ndarray) -> np.ndarray:
        u = np.array(x, dtype=np.float64).reshape(self.system.shape)
        # The identity rows are only solved to the cycles' accuracy; the prescribed values are exact.
        u.ravel()[self.system.fixed] = self.system.values[self.system.fixed]
        return u


def gmg_solve(system: StencilSystem, cycles: int = 1) -> np.ndarray:
    """The FMG solution of ``system`` with ``cycles`` V-cycles per level (hierarchy built here)."""
    return GMGSolver.build(system).fmg(cycles)
