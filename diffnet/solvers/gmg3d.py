"""Geometric multigrid for the 3-D Q1 system on pyamg's machinery: trilinear prolongation, Galerkin
coarse operators, Gauss-Seidel smoothing, full multigrid (FMG) stopped at discretisation accuracy.

The unknowns of :class:`~diffnet.solvers.poisson3d.HexSystem` are a box of free nodes, so
the prolongation is the Kronecker product of three 1-D linear interpolations (the x factor
without the Dirichlet rows and columns) and every coarse operator is Pᵀ A P. The
smoothing is pyamg's compiled Gauss-Seidel (forward before the coarse correction,
backward after: a symmetric cycle), the coarsest grid is factorised once with SuperLU.
Why not pyamg's own smoothed aggregation: on a structured grid with a smooth diffusivity
the trilinear interpolant is what aggregation tries to discover, and FMG reaches the
grid's own discretisation error in a fixed number of cycles instead of iterating to a
tolerance unrelated to it (``benchmarks/fem_vs_inference.py`` times the two).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp

from diffnet.solvers.gmg import COARSEST, grid_hierarchy, interpolation_1d

if TYPE_CHECKING:  # the system builds its multigrid: the type only, for the annotations
    from diffnet.solvers.poisson3d import HexSystem

__all__ = ["GMG3D", "prolongation_3d"]


def prolongation_3d(fine: tuple[int, int, int], coarse: tuple[int, int, int]) -> tuple[sp.csr_matrix, np.ndarray]:
    """Trilinear interpolation between the free-node boxes of two node grids (N_z, N_y, N_x), and the
    coarse grid's Dirichlet planes interpolated onto the fine free nodes per unit value: ``(P, (w_left, w_right))``
    with w_* of shape (N_x - 2,) (they depend on x alone)."""
    iz, iy, ix = (interpolation_1d(f, c) for f, c in zip(fine, coarse))
    ix = ix.tocsc()
    P = sp.kron(iz, sp.kron(iy, ix[1:-1, 1:-1]), format="csr")
    weights = (ix[1:-1, 0].toarray().ravel(), ix[1:-1, coarse[2] - 1].toarray().ravel())
    return P, weights


@dataclass
class _Level:
    A: sp.csr_matrix
    shape: tuple[int, int, int]  # full node grid
    P: sp.csr_matrix | None = None  # from the next coarser level's free nodes
    R: sp.csr_matrix | None = None  # Pᵀ
    lift: np.ndarray | None = None  # the next coarser level's Dirichlet data on this level's free nodes
    work: dict = field(default_factory=dict)


@dataclass
class GMG3D:
    """A geometric multigrid hierarchy for one :class:`HexSystem`.

    Attributes
    ----------
    system : HexSystem
        The finest system.
    levels : list
        Finest first: operators A_{l+1} = P_lᵀ A_l P_l down to a grid of at most ``COARSEST`` nodes a side.
    """

    system: HexSystem
    levels: list
    coarse_lu: object

    @classmethod
    def build(cls, system: HexSystem, coarsest: int = COARSEST) -> "GMG3D":
        from scipy.sparse.linalg import splu

        grids = grid_hierarchy(system.shape, coarsest)
        level = _Level(system.A, system.shape)
        levels = [level]
        for fine, coarse in zip(grids, grids[1:]):
            P, (w_left, w_right) = prolongation_3d(fine, coarse)
            level.P, level.R = P, P.T.tocsr()
            lift = system.left * w_left + system.right * w_right
            level.lift = np.broadcast_to(lift, (fine[0], fine[1], fine[2] - 2)).ravel().copy()
            A = (level.R @ level.A @ P).tocsr()
            A.sort_indices()
            level = _Level(A, coarse)
            levels.append(level)
        return cls(system, levels, splu(levels[-1].A.tocsc()))

    def _vcycle(self, k: int, x: np.ndarray, b: np.ndarray) -> None:
        """One V(1,1)-cycle on level k in place: forward Gauss-Seidel, coarse correction, backward Gauss-Seidel."""
        from pyamg.relaxation.relaxation import gauss_seidel

        level = self.levels[k]
        gauss_seidel(level.A, x, b, iterations=1, sweep="forward")
        rc = level.R @ (b - level.A @ x)
        if k + 2 == len(self.levels):
            e = self.coarse_lu.solve(rc)
        else:
            e = np.zeros_like(rc)
            self._vcycle(k + 1, e, rc)
        x += level.P @ e
        gauss_seidel(level.A, x, b, iterations=1, sweep="backward")

    def _cycles(self, k: int, x: np.ndarray, b: np.ndarray, cycles: int) -> np.ndarray:
        if k + 1 == len(self.levels):
            return self.coarse_lu.solve(b)
        for _ in range(cycles):
            self._vcycle(k, x, b)
        return x

    def fmg(self, cycles: int = 1, to_discretisation: bool = False, stats: dict | None = None,
            max_cycles: int = 50) -> np.ndarray:
        """Full multigrid: each level's problem (the Galerkin projection of the finer one, with the level's
        own Dirichlet data lifted onto the finer grid, as :meth:`diffnet.solvers.gmg.GMGSolver.fmg`),
        the coarsest solved exactly, then ``cycles`` V-cycles per level from the interpolated coarser
        solution. With ``to_discretisation``, V-cycles continue on the finest level until the algebraic
        error left is a tenth of the discretisation error estimated as ||u_h - I u_2h|| / 3.

        Returns the nodal solution (N_z, N_y, N_x); ``stats`` gets ``finest_cycles`` and
        ``discretisation_estimate`` (relative).
        """
        levels = self.levels
        rhs = [self.system.rhs]
        for level in levels[:-1]:
            rhs.append(level.R @ (rhs[-1] - level.A @ level.lift))
        x = self.coarse_lu.solve(rhs[-1])
        start = x
        for k in range(len(levels) - 2, -1, -1):
            start = levels[k].lift + levels[k].P @ x
            x = self._cycles(k, start.copy(), rhs[k], cycles)
        done = cycles
        estimate = np.linalg.norm(x - start) / 3.0 if len(levels) > 1 else 0.0
        change = np.inf
        while to_discretisation and len(levels) > 1 and done < max_cycles:
            before = x.copy()
            self._vcycle(0, x, rhs[0])
            done += 1
            change, last = np.linalg.norm(x - before), change
            # The error left is about change * rho / (1 - rho), rho the cycle's contraction.
            rho = min(change / last, 0.9) if np.isfinite(last) and last > 0 else None
            if change <= 0.1 * estimate or (rho is not None and change * rho / (1.0 - rho) <= 0.1 * estimate):
                break
        u = self.system.full(x)
        if stats is not None:
            stats["finest_cycles"] = done
            stats["discretisation_estimate"] = float(estimate / max(np.linalg.norm(u), np.finfo(float).tiny))
        return u

    def vcycles(self, initial: np.ndarray, cycles: int) -> np.ndarray:
        """``cycles`` V(1,1)-cycles on the finest level from the nodal field ``initial`` (N_z, N_y, N_x);
        the Dirichlet planes are the system's, whatever ``initial`` holds there."""
        if cycles < 0:
            raise ValueError(f"cycles must be >= 0, got {cycles}")
        x = np.array(np.asarray(initial, dtype=np.float64)[:, :, 1:-1]).ravel()
        return self.system.full(self._cycles(0, x, self.system.rhs, cycles))
