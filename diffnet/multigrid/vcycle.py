"""A batched multigrid V-cycle in torch for any family whose loss has a nearest-neighbour Hessian.

It is the preconditioner B of :mod:`diffnet.multigrid.preconditioned`: an approximate inverse of the loss's
Hessian in the field, one per instance, applied to the whole batch at once (CPU or CUDA, 2-D or
3-D). Nothing in it knows a family: every level's operator is read off the family's own loss.

* **Operators from the family**: the Hessian of its loss at the current field (:mod:`diffnet.multigrid.hessian`:
  the family's own ``hessian``, or read off the loss by coloured probes), cut to the free nodes and
  symmetrised (:mod:`diffnet.multigrid.stencil`).
* **Rediscretised coarse levels**: the family on each coarser grid (``at_resolution``), probed at
  the field interpolated there, down to a grid of at most 9 (2-D) or 5 (3-D) nodes a side, which
  is solved exactly (a dense Cholesky factor per instance: a few dozen unknowns).
* **Dirichlet nodes** are the nodes the family's ``field`` does not take from the network; the
  operators act on the other nodes only (identity rows on the fixed ones), as the numpy multigrid's
  Dirichlet rows do.
* **Several unknown fields** (a family with C > 1 :attr:`~diffnet.protocol.family.Family.unknowns`, fields
  (S, C, *grid)): the Hessian is a block stencil (S, C, C, 3^d, *grid), entry [a, b, k] at node i
  coupling component a at i to component b at i + o_k; the probes colour nodes *and* components
  (C 3^d products). Internally every field is (S, C, *grid) (C = 1 for a scalar family, whose fields
  and stencils keep their own shapes outside and the same arithmetic inside).
* **Smoothing**: ``sweeps`` damped-Jacobi sweeps (omega = 2/3; for several unknowns at most
  4 / (3 rho), rho the Gershgorin bound of D⁻¹A per instance and level) before and after the coarse
  correction, with bilinear prolongation P and restriction Pᵀ, so that B is symmetric. Jacobi and
  not Gauss-Seidel: it is one stencil application for the whole batch, where Gauss-Seidel is a
  sequential sweep. :class:`diffnet.solvers.gmg.GMGSolver` with ``smoother="jacobi"`` on the same
  levels is the test oracle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from diffnet.backend.constants import constant
from diffnet.grid.level import Level
from diffnet.grid.transfer import grid_hierarchy, interpolation_matrix
from diffnet.multigrid.hessian import block_hessian
from diffnet.multigrid.stencil import (apply_blocks, as_blocks, as_fields, components, dense_operator, neighbour_offsets,
                                      on_free_nodes)

if TYPE_CHECKING:
    from diffnet.protocol.family import Family

__all__ = ["VCycle", "Jacobi", "SHIFTS", "coarse_grids", "dense_interpolation", "cholesky", "cholesky_solve", "shifted_cholesky",
           "along_axes"]

_OMEGA = 2.0 / 3.0


def coarse_grids(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Node grids halving the cells (ceil(N / 2) nodes) from ``shape`` until a side has at most 9 (2-D) or 5 (3-D)
    nodes, coarsest first: the numpy multigrid's coarsening."""
    return grid_hierarchy(tuple(shape), 9 if len(shape) == 2 else 5)


def dense_interpolation(n_fine: int, n_coarse: int, like: torch.Tensor) -> torch.Tensor:
    """(n_fine, n_coarse) linear interpolation between uniform node grids with the same end points (nested or
    not): :func:`diffnet.grid.transfer.interpolation_matrix`, in ``like``'s dtype and device, built once (diffnet.backend.constants: no
    host-to-device copy in a step, which a CUDA graph could not capture)."""
    return constant(("interpolation 1d", n_fine, n_coarse), lambda: interpolation_matrix(n_coarse, n_fine), like)


def cholesky_solve(b: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """x = (L Lᵀ)⁻¹ b for factors L (S, n, n) and right-hand sides b (S, n, 1).

    On the GPU as two triangular solves: ``torch.cholesky_solve`` there is not capturable in a CUDA graph
    (torch 2.11, H100: "operation not permitted when stream is capturing"); on the CPU ``cholesky_solve``."""
    if not factor.is_cuda:
        return torch.cholesky_solve(b, factor)
    y = torch.linalg.solve_triangular(factor, b, upper=False)
    return torch.linalg.solve_triangular(factor.mT, y, upper=True)


def cholesky(dense: torch.Tensor, what: str, shift: bool = False) -> torch.Tensor:
    """The Cholesky factors of a batch of symmetric positive definite matrices (S, n, n).

    ``cholesky_ex``: no host synchronisation on the GPU, so that a CUDA graph can capture it; outside a
    capture a matrix that is not positive definite is still an error (``what`` names it), or with ``shift`` (a
    nonlinear loss's Hessian away from its minimiser) factorised with its diagonal raised until it is."""
    factor, info = torch.linalg.cholesky_ex(dense)
    capturing = dense.is_cuda and torch.cuda.is_current_stream_capturing()
    if not capturing and bool((info != 0).any()):
        if shift:
            return torch.stack(shifted_cholesky(dense, what))
        raise ValueError(f"{what} is not positive definite for instance(s) {torch.nonzero(info).flatten().tolist()}")
    return factor


# The Levenberg-Marquardt shifts tried (here and by the coarse correction's banded factors), as shares of the diagonal: the first that makes the operator positive
# definite is taken (a shift of 1e4 leaves a steepest-descent step scaled by the diagonal).
SHIFTS = (0.0, 1e-3, 1e-2, 1e-1, 1.0, 1e1, 1e2, 1e4)


def shifted_cholesky(dense: torch.Tensor, what: str) -> list[torch.Tensor]:
    """The Cholesky factors of symmetric matrices (S, n, n), each one's diagonal raised by the first of the shares
    :data:`SHIFTS` of itself that makes it positive definite (none where it is)."""
    diagonal = dense.diagonal(dim1=1, dim2=2).clone()
    factors: list[torch.Tensor | None] = [None] * len(dense)
    for share in SHIFTS:
        todo = [k for k, f in enumerate(factors) if f is None]
        if not todo:
            break
        trial = dense[todo].clone()
        trial.diagonal(dim1=1, dim2=2).add_(share * diagonal[todo].abs())
        factor, info = torch.linalg.cholesky_ex(trial)
        for k, f, bad in zip(todo, factor, info.tolist()):
            if bad == 0:
                factors[k] = f
    failed = [k for k, f in enumerate(factors) if f is None]
    if failed:
        raise ValueError(f"{what} is not positive definite for instance(s) {failed}, even shifted")
    return factors


def along_axes(x: torch.Tensor, mats: list[torch.Tensor], transpose: bool) -> torch.Tensor:
    """x (S, [C,] *grid) times one matrix per grid axis (the last len(mats)): a separable transfer P x
    (coarse to fine) or, transposed, Pᵀ x."""
    for axis, mat in enumerate(mats, start=x.ndim - len(mats)):
        m = mat.T if transpose else mat
        x = torch.movedim(torch.movedim(x, axis, -1) @ m.T, -1, axis)
    return x


@dataclass(frozen=True)
class Jacobi:
    """What the damped-Jacobi smoother keeps for one level (:attr:`diffnet.grid.level.Level.smoother`)."""

    diagonal: torch.Tensor  # (S, C, *grid)
    omega: float | torch.Tensor = _OMEGA  # the damping, or one per instance (S, 1, ..., 1)


def _damping(stencil: torch.Tensor, diagonal: torch.Tensor) -> torch.Tensor:
    """Jacobi's damping for a block stencil, per instance: omega = min(2/3, 4 / (3 rho)), rho >= rho(D⁻¹A)
    the largest row sum of |D⁻¹A| (Gershgorin). A scalar Q1 operator (an M-matrix: rho <= 2) keeps 2/3; a
    vector Hessian's coupled components reach rho of 3-4, and at 2/3 the 3-D elasticity V-cycle diverged
    (the error grew 8x per cycle at 17^3)."""
    rho = (stencil.abs().sum(dim=(2, 3)) / diagonal).flatten(1).amax(dim=1)
    return (4.0 / 3.0 / rho).clamp(max=_OMEGA).reshape(-1, *([1] * (diagonal.ndim - 1)))


@dataclass
class VCycle:
    """B: ``cycles`` symmetric V-cycles for the Hessian of a family's loss, one hierarchy per instance.

    Build it with :meth:`build` at the current field; ``vcycle(r)`` is B r for a batch r of fields
    (S, *grid), or (S, C, *grid) for C unknowns, that is zero on the fixed nodes.
    """

    levels: list[Level]  # coarsest first: stencil (S, C, C, 3^d, *grid), fixed (S, C, *grid), dense P per axis
    coarse_factor: torch.Tensor  # (S, n, n) Cholesky factor of the coarsest operator
    sweeps: int = 2
    cycles: int = 1
    vector: bool = False  # fields (S, C, *grid) outside, not (S, *grid)

    @classmethod
    def build(cls, family: Family, u: torch.Tensor, instances: torch.Tensor, *, sweeps: int = 2, cycles: int = 1) -> "VCycle":
        """The hierarchy of ``family`` (on ``u``'s grid) linearised at the field ``u`` (S, [C,] *grid), float64 advised."""
        if sweeps < 1 or cycles < 1:
            raise ValueError(f"sweeps and cycles must be >= 1, got {sweeps} and {cycles}")
        vector = components(family) > 1
        grids = coarse_grids(tuple(u.shape[2:] if vector else u.shape[1:]))[::-1]  # built from the finest down
        # Per level but the coarsest, per axis: the interpolation from the next coarser grid (P; Pᵀ restricts).
        transfers = [[dense_interpolation(n, m, u) for n, m in zip(fine, coarse)] for fine, coarse in zip(grids, grids[1:])]
        centre = len(neighbour_offsets(len(grids[0]))) // 2
        levels = []
        field = u
        for k, grid in enumerate(grids):
            level_family = family if k == 0 else family.at_resolution(grid)
            if k > 0:  # the linearisation's field, interpolated to this level's nodes
                previous = field.shape[field.ndim - len(grid):]
                field = along_axes(field, [dense_interpolation(n, m, u) for n, m in zip(grid, previous)], False)
            hessian, free = block_hessian(level_family, field, instances)
            # A family's own Hessian is symmetric as written; a probed one only to rounding.
            stencil = on_free_nodes(hessian, free, symmetrise=getattr(level_family, "hessian", None) is None)
            diagonal = torch.diagonal(stencil[:, :, :, centre], dim1=1, dim2=2).movedim(-1, 1)
            levels.append(Level(stencil, free.logical_not(), transfers[k] if k < len(transfers) else None,
                                smoother=Jacobi(diagonal, _damping(stencil, diagonal) if vector else _OMEGA)))
        levels.reverse()  # coarsest first
        dense = dense_operator(levels[0].stencil)
        # Shifted where indefinite: a nonlinear loss's Hessian at a network's early field may be (B only preconditions).
        return cls(levels, cholesky(dense, "the V-cycle's coarsest operator", shift=True), sweeps, cycles, vector)

    @property
    def free(self) -> torch.Tensor:
        """(S, *grid) bool ((S, C, *grid) for C unknowns): the free nodes of the finest level."""
        return as_fields(self.levels[-1].free, self.vector)

    def operator(self, x: torch.Tensor) -> torch.Tensor:
        """A x: the finest level's operator (the Hessian on the free nodes, identity on the fixed) on fields x."""
        return as_fields(apply_blocks(self.levels[-1].stencil, as_blocks(x, self.vector)), self.vector)

    def _prolong(self, k: int, coarse: torch.Tensor) -> torch.Tensor:
        """Level k - 1's field onto level k."""
        fine = self.levels[k]
        return along_axes(coarse * self.levels[k - 1].free, fine.interpolation, False) * fine.free

    def _restrict(self, k: int, fine: torch.Tensor) -> torch.Tensor:
        """Level k's field onto level k - 1."""
        return along_axes(fine * self.levels[k].free, self.levels[k].interpolation, True) * self.levels[k - 1].free

    def _smooth(self, level: Level, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        jacobi = level.smoother
        for _ in range(self.sweeps):
            x = x + jacobi.omega * (b - apply_blocks(level.stencil, x)) / jacobi.diagonal
        return x

    def _cycle(self, k: int, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if k == 0:
            shape = b.shape
            return cholesky_solve(b.reshape(shape[0], -1, 1), self.coarse_factor).reshape(shape)
        level = self.levels[k]
        x = self._smooth(level, x, b)
        rc = self._restrict(k, b - apply_blocks(level.stencil, x))
        correction = self._cycle(k - 1, torch.zeros_like(rc), rc)
        x = x + self._prolong(k, correction)
        return self._smooth(level, x, b)

    def __call__(self, r: torch.Tensor) -> torch.Tensor:
        """B r: ``cycles`` V-cycles on A x = r from x = 0."""
        b = as_blocks(r, self.vector)
        x = torch.zeros_like(b)
        for _ in range(self.cycles):
            x = self._cycle(len(self.levels) - 1, x, b)
        return as_fields(x, self.vector)
