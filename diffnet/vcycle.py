"""A batched multigrid V-cycle in torch for any family whose loss has a nearest-neighbour Hessian.

It is the preconditioner B of :mod:`diffnet.preconditioned`: an approximate inverse of the loss's
Hessian in the field, one per instance, applied to the whole batch at once (CPU or CUDA, 2-D or
3-D). Nothing in it knows a family: every level's operator is read off the family's own loss.

* **Operators from the family**: its ``hessian(u, params)`` (capability ``precondition``), the
  Q1 families' stencils built straight from the coefficient (:func:`diffnet.energy.quadratic_stencil`).
* **Or by probing**, the default of ``hessian``. Where the loss couples each node only to its 3^d neighbours (the Q1
  energies, linear or not), the Hessian is a 3^d-point stencil, and 3^d Hessian-vector products
  with coloured probes (1 on the nodes whose index is c modulo 3 along each axis) give every
  entry: each neighbour of a node has its own colour. The products are central differences of
  the loss's gradient in float64, exact for a quadratic loss up to rounding, and the linearisation
  at the current field for a nonlinear one. The stencil is then symmetrised.
* **Rediscretised coarse levels**: the family on each coarser grid (``at_resolution``), probed at
  the field interpolated there, down to a grid of at most 9 (2-D) or 5 (3-D) nodes a side, which
  is solved exactly (a dense Cholesky factor per instance: a few dozen unknowns).
* **Dirichlet nodes** are the nodes the family's ``field`` does not take from the network; the
  operators act on the other nodes only (identity rows on the fixed ones), as the numpy multigrid's
  Dirichlet rows do.
* **Several unknown fields** (a family with C > 1 :attr:`~diffnet.family.Family.unknowns`, fields
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

import itertools
import math
from dataclasses import dataclass
from typing import Any

import torch

from diffnet.constants import constant

__all__ = ["VCycle", "apply_stencil", "probe_stencil", "fixed_nodes", "coarse_grids", "loss_gradient", "components",
           "as_blocks", "as_fields", "block_hessian"]

_OMEGA = 2.0 / 3.0
_PROBE_STEP = 1e-3  # central differences: exact for quadratic losses, O(step^2) for others


def coarse_grids(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Node grids from ``shape`` down, halving the cells (ceil(N / 2) nodes), until a side has at most
    9 (2-D) or 5 (3-D) nodes: the numpy multigrid's coarsening."""
    from diffnet.solvers.gmg import grid_hierarchy

    return grid_hierarchy(tuple(shape), 9 if len(shape) == 2 else 5)


def _offsets(dims: int) -> list[tuple[int, ...]]:
    return list(itertools.product((-1, 0, 1), repeat=dims))


def components(family: Any) -> int:
    """C, the family's number of unknown fields: a field is (S, *grid) for C = 1, (S, C, *grid) otherwise."""
    return len(getattr(family, "unknowns", ("u",)))


def as_blocks(x: torch.Tensor, vector: bool) -> torch.Tensor:
    """Fields in the block layout (S, C, *grid): a scalar family's (S, *grid) get their C = 1 axis."""
    return x if vector else x[:, None]


def as_fields(x: torch.Tensor, vector: bool) -> torch.Tensor:
    """Block-layout fields (S, C, *grid) back in the family's own shape (:func:`as_blocks` undone)."""
    return x if vector else x[:, 0]


def _shifted(x: torch.Tensor, offset: tuple[int, ...]) -> torch.Tensor:
    """y[..., i] = x[..., i + offset] (zero outside the grid) along x's last len(offset) axes."""
    pad = []
    for o in reversed(offset):
        pad += [max(-o, 0), max(o, 0)]
    padded = torch.nn.functional.pad(x, pad)
    # Along each axis the padding before it is max(-o, 0): node i + o sits at i + o + max(-o, 0).
    grid = x.shape[x.ndim - len(offset):]
    index = tuple(slice(max(-o, 0) + o, max(-o, 0) + o + n) for o, n in zip(offset, grid))
    return padded[(Ellipsis, *index)]


def _apply_blocks(stencil: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A x for a block stencil (S, C, C, 3^d, *grid) and fields x (S, C, *grid)."""
    # x padded once with a layer of zeros; each neighbour is then a view into it (a pad per
    # offset cost 27 copies of the field in 3-D). For C = 1 the products and their order are the
    # scalar stencil's.
    dims = x.ndim - 2
    padded = torch.nn.functional.pad(x, (1, 1) * dims)
    out = torch.zeros_like(x)
    for k, offset in enumerate(_offsets(dims)):
        view = padded[(slice(None), slice(None), *(slice(1 + o, 1 + o + n) for o, n in zip(offset, x.shape[2:])))]
        for b in range(x.shape[1]):
            out += stencil[:, :, b, k] * view[:, b : b + 1]
    return out


def apply_stencil(stencil: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A x for a 3^d-point stencil (S, 3^d, *grid) (offsets in :func:`itertools.product` order) and x (S, *grid),
    or a block stencil (S, C, C, 3^d, *grid) and fields x (S, C, *grid)."""
    if stencil.ndim == x.ndim + 2:
        return _apply_blocks(stencil, x)
    return _apply_blocks(stencil[:, None, None], x[:, None])[:, 0]


def fixed_nodes(family: Any, params: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(S, *grid) bool ((S, C, *grid) for C unknowns): the nodes the family's field does not take from the network's output.

    Found by comparing two fields, unless the problem says itself (a ``fixed_nodes(params, dtype)``
    member: a field corrected on a coarse space, :class:`diffnet.coarse.CoarseCorrected`, moves every
    free node however it is probed)."""
    own = getattr(family, "fixed_nodes", None)
    if own is not None:
        return own(params, dtype)
    raw = torch.zeros(params.shape[0], components(family), *family.resolution, dtype=dtype, device=params.device)
    return family.field(raw + 1.0, params) == family.field(raw, params)


def loss_gradient(family: Any, u: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """g = dL/du of the family's summed loss terms at the field u (no graph kept)."""
    v = u.detach().requires_grad_(True)
    total = sum(t.sum() for t in family.loss_terms(v, params).values())
    return torch.autograd.grad(total, v)[0]


def _colours(grid: tuple[int, ...], device) -> torch.Tensor:
    """(*grid) int: the colour of each node, sum over axes of (index mod 3) 3^axis."""
    colour = torch.zeros(grid, dtype=torch.long, device=device)
    for axis, n in enumerate(grid):
        shape = [1] * len(grid)
        shape[axis] = n
        colour = colour + (torch.arange(n, device=device) % 3).reshape(shape) * 3**axis
    return colour


def probe_stencil(family: Any, u: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """The Hessian of the family's summed loss at the field u (S, *grid) as a stencil (S, 3^d, *grid),
    read off 3^d Hessian-vector products (central differences of the loss's gradient, in u's dtype);
    for C unknowns, fields (S, C, *grid), a block stencil (S, C, C, 3^d, *grid) from C 3^d products
    (each probe one colour of one component).

    Valid where the loss couples each node to its 3^d neighbours only (a family's ``hessian`` default)."""
    vector = components(family) > 1
    blocks = as_blocks(u, vector)
    grid = tuple(blocks.shape[2:])
    dims = len(grid)
    colour = _colours(grid, u.device)
    step = _PROBE_STEP * u.abs().max().clamp_min(1.0)  # a tensor: no host synchronisation (CUDA graphs)
    stencil = torch.empty(u.shape[0], blocks.shape[1], blocks.shape[1], 3**dims, *grid, dtype=u.dtype, device=u.device)
    for b in range(blocks.shape[1]):
        products = []
        for c in range(3**dims):
            e = torch.zeros_like(blocks)
            e[:, b] = (colour == c).to(u.dtype)
            e = as_fields(e, vector)
            g = (loss_gradient(family, u + step * e, params) - loss_gradient(family, u - step * e, params)) / (2 * step)
            products.append(as_blocks(g, vector))
        for k, offset in enumerate(_offsets(dims)):
            # The neighbour i + offset has colour(i + offset): read that probe's product at i.
            target = _shifted(colour[None].to(u.dtype), offset)[0].round().long()
            inside = _shifted(torch.ones(1, *grid, dtype=u.dtype, device=u.device), offset)[0] > 0
            entry = torch.zeros_like(blocks)
            for c in range(3**dims):
                entry = torch.where((target == c) & inside, products[c], entry)
            stencil[:, :, b, k] = entry
    return stencil if vector else stencil[:, 0, 0]


def _on_free_nodes(stencil: torch.Tensor, free: torch.Tensor) -> torch.Tensor:
    """The operator on the free nodes of a block stencil (S, C, C, 3^d, *grid) and free (S, C, *grid):
    couplings to fixed nodes cut, identity rows on them, and symmetrised ((a, i; b, i + o) and
    (b, i + o; a, i) are one coupling; a probed stencil holds both to rounding)."""
    dims = free.ndim - 2
    offsets = _offsets(dims)
    mask = free.to(stencil.dtype)
    cut = torch.stack([stencil[:, :, :, k] * mask[:, :, None] * _shifted(mask, o)[:, None] for k, o in enumerate(offsets)],
                      dim=3)
    mirror = [offsets.index(tuple(-x for x in o)) for o in offsets]
    swapped = cut.transpose(1, 2)
    twin = torch.stack([_shifted(swapped[:, :, :, mirror[k]], o) for k, o in enumerate(offsets)], dim=3)
    out = 0.5 * (cut + twin)
    centre = offsets.index((0,) * dims)
    for a in range(free.shape[1]):
        out[:, a, a, centre] = torch.where(free[:, a], out[:, a, a, centre], torch.ones_like(out[:, a, a, centre]))
    return out


def dense_interpolation(n_fine: int, n_coarse: int, like: torch.Tensor) -> torch.Tensor:
    """(n_fine, n_coarse) linear interpolation between uniform node grids with the same end points (nested or
    not): the numpy multigrid's, dense, in ``like``'s dtype and device, built once (diffnet.constants: no
    host-to-device copy in a step, which a CUDA graph could not capture)."""
    from diffnet.solvers.gmg import interpolation_1d

    return constant(("interpolation 1d", n_fine, n_coarse), lambda: interpolation_1d(n_fine, n_coarse).toarray(), like)


def cholesky_solve(b: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """x = (L Lᵀ)⁻¹ b for factors L (S, n, n) and right-hand sides b (S, n, 1).

    On the GPU as two triangular solves: ``torch.cholesky_solve`` there is not capturable in a CUDA graph
    (torch 2.11, H100: "operation not permitted when stream is capturing"); on the CPU ``cholesky_solve``."""
    if not factor.is_cuda:
        return torch.cholesky_solve(b, factor)
    y = torch.linalg.solve_triangular(factor, b, upper=False)
    return torch.linalg.solve_triangular(factor.mT, y, upper=True)


def cholesky(dense: torch.Tensor, what: str) -> torch.Tensor:
    """The Cholesky factors of a batch of symmetric positive definite matrices (S, n, n).

    ``cholesky_ex``: no host synchronisation on the GPU, so that a CUDA graph can capture it; outside a
    capture a matrix that is not positive definite is still an error (``what`` names it)."""
    factor, info = torch.linalg.cholesky_ex(dense)
    capturing = dense.is_cuda and torch.cuda.is_current_stream_capturing()
    if not capturing and bool((info != 0).any()):
        raise ValueError(f"{what} is not positive definite for instance(s) {torch.nonzero(info).flatten().tolist()}")
    return factor


def along_axes(x: torch.Tensor, mats: list[torch.Tensor], transpose: bool) -> torch.Tensor:
    """x (S, [C,] *grid) times one matrix per grid axis (the last len(mats)): a separable transfer P x
    (coarse to fine) or, transposed, Pᵀ x."""
    for axis, mat in enumerate(mats, start=x.ndim - len(mats)):
        m = mat.T if transpose else mat
        x = torch.movedim(torch.movedim(x, axis, -1) @ m.T, -1, axis)
    return x


@dataclass
class _Level:
    stencil: torch.Tensor  # (S, C, C, 3^d, *grid)
    free: torch.Tensor  # (S, C, *grid) bool
    diagonal: torch.Tensor  # (S, C, *grid)
    down: list[torch.Tensor] | None = None  # per axis, interpolation from the next coarser grid
    omega: float | torch.Tensor = _OMEGA  # the Jacobi damping, or one per instance (S, 1, ..., 1)


def _damping(stencil: torch.Tensor, diagonal: torch.Tensor) -> torch.Tensor:
    """Jacobi's damping for a block stencil, per instance: omega = min(2/3, 4 / (3 rho)), rho >= rho(D⁻¹A)
    the largest row sum of |D⁻¹A| (Gershgorin). A scalar Q1 operator (an M-matrix: rho <= 2) keeps 2/3; a
    vector Hessian's coupled components reach rho of 3-4, and at 2/3 the 3-D elasticity V-cycle diverged
    (the error grew 8x per cycle at 17^3; 2026-11-26)."""
    rho = (stencil.abs().sum(dim=(2, 3)) / diagonal).flatten(1).amax(dim=1)
    return (4.0 / 3.0 / rho).clamp(max=_OMEGA).reshape(-1, *([1] * (diagonal.ndim - 1)))


def block_hessian(family: Any, u: torch.Tensor, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The family's Hessian at u, at every node, and its free nodes, in the block layout: (S, C, C, 3^d, *grid)
    and (S, C, *grid) bool (C = 1 for a scalar family: the same values). The V-cycle and the coarse
    correction build their operators from it (:func:`_on_free_nodes`)."""
    free = fixed_nodes(family, params, u.dtype).logical_not()
    hessian = family.hessian(u, params).to(u.dtype)
    if components(family) == 1:
        free, hessian = free[:, None], hessian[:, None, None]
    return hessian, free


@dataclass
class VCycle:
    """B: ``cycles`` symmetric V-cycles for the Hessian of a family's loss, one hierarchy per instance.

    Build it with :meth:`build` at the current field; ``vcycle(r)`` is B r for a batch r of fields
    (S, *grid), or (S, C, *grid) for C unknowns, that is zero on the fixed nodes.
    """

    levels: list[_Level]
    coarse_factor: torch.Tensor  # (S, n, n) Cholesky factor of the coarsest operator
    sweeps: int = 2
    cycles: int = 1
    vector: bool = False  # fields (S, C, *grid) outside, not (S, *grid)

    @classmethod
    def build(cls, family: Any, u: torch.Tensor, params: torch.Tensor, *, sweeps: int = 2, cycles: int = 1) -> "VCycle":
        """The hierarchy of ``family`` (on ``u``'s grid) linearised at the field ``u`` (S, [C,] *grid), float64 advised."""
        if sweeps < 1 or cycles < 1:
            raise ValueError(f"sweeps and cycles must be >= 1, got {sweeps} and {cycles}")
        vector = components(family) > 1
        grids = coarse_grids(tuple(u.shape[2:] if vector else u.shape[1:]))
        # Per level but the coarsest, per axis: the interpolation from the next coarser grid (P; Pᵀ restricts).
        transfers = [[dense_interpolation(n, m, u) for n, m in zip(fine, coarse)] for fine, coarse in zip(grids, grids[1:])]
        centre = len(_offsets(len(grids[0]))) // 2
        levels = []
        field = u
        for k, grid in enumerate(grids):
            level_family = family if k == 0 else family.at_resolution(grid)
            if k > 0:  # the linearisation's field, interpolated to this level's nodes
                previous = field.shape[field.ndim - len(grid):]
                field = along_axes(field, [dense_interpolation(n, m, u) for n, m in zip(grid, previous)], False)
            hessian, free = block_hessian(level_family, field, params)
            stencil = _on_free_nodes(hessian, free)
            diagonal = torch.diagonal(stencil[:, :, :, centre], dim1=1, dim2=2).movedim(-1, 1)
            levels.append(_Level(stencil, free, diagonal, transfers[k] if k < len(transfers) else None,
                                 _damping(stencil, diagonal) if vector else _OMEGA))
        coarsest = levels[-1]
        n = math.prod(coarsest.free.shape[1:])
        basis = torch.eye(n, dtype=u.dtype, device=u.device).reshape(n, *coarsest.free.shape[1:])
        columns = [_apply_blocks(coarsest.stencil[s : s + 1].expand(n, *coarsest.stencil.shape[1:]), basis)
                   for s in range(u.shape[0])]
        dense = torch.stack([c.reshape(n, n).T for c in columns])
        return cls(levels, cholesky(dense, "the V-cycle's coarsest operator"), sweeps, cycles, vector)

    @property
    def free(self) -> torch.Tensor:
        """(S, *grid) bool ((S, C, *grid) for C unknowns): the free nodes of the finest level."""
        return as_fields(self.levels[0].free, self.vector)

    def operator(self, x: torch.Tensor) -> torch.Tensor:
        """A x: the finest level's operator (the Hessian on the free nodes, identity on the fixed) on fields x."""
        return as_fields(_apply_blocks(self.levels[0].stencil, as_blocks(x, self.vector)), self.vector)

    def _prolong(self, k: int, coarse: torch.Tensor) -> torch.Tensor:
        fine = self.levels[k]
        return along_axes(coarse * self.levels[k + 1].free, fine.down, False) * fine.free

    def _restrict(self, k: int, fine: torch.Tensor) -> torch.Tensor:
        return along_axes(fine * self.levels[k].free, self.levels[k].down, True) * self.levels[k + 1].free

    def _smooth(self, level: _Level, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        for _ in range(self.sweeps):
            x = x + level.omega * (b - _apply_blocks(level.stencil, x)) / level.diagonal
        return x

    def _cycle(self, k: int, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if k == len(self.levels) - 1:
            shape = b.shape
            return cholesky_solve(b.reshape(shape[0], -1, 1), self.coarse_factor).reshape(shape)
        level = self.levels[k]
        x = self._smooth(level, x, b)
        rc = self._restrict(k, b - _apply_blocks(level.stencil, x))
        correction = self._cycle(k + 1, torch.zeros_like(rc), rc)
        x = x + self._prolong(k, correction)
        return self._smooth(level, x, b)

    def __call__(self, r: torch.Tensor) -> torch.Tensor:
        """B r: ``cycles`` V-cycles on A x = r from x = 0."""
        b = as_blocks(r, self.vector)
        x = torch.zeros_like(b)
        for _ in range(self.cycles):
            x = self._cycle(0, x, b)
        return as_fields(x, self.vector)
