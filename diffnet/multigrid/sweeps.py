"""Smoothing sweeps after the coarse correction: the high-frequency error a coarse space cannot touch, removed.

The exact coarse correction (:mod:`.coarse`) leaves the network's field with no error a coarse grid holds; what
is left is high-frequency, and it is small in L2 but not in the field's gradient (elasticity 64²: the displacement
at 1.03x its floor, the recovered stress at 5.7x). A few Gauss-Seidel sweeps with the fine Hessian the correction
has already formed remove it at the cost of a stencil product each, the post-smoothing of a two-grid cycle:

    u <- u - B (A u - b),    B the symmetric multicolour block Gauss-Seidel preconditioner on the free nodes,

with A the Hessian at every node and b its load (∇E(u) = A u - b; for a nonlinear energy the linearisation at the
coarse minimiser). The nodes are coloured by their index's parity along each axis (2^d colours): on a 3^d-point
stencil two nodes of one colour never couple, so each colour is one batched, exact block update (the C x C block
of a node's unknowns solved together), and a sweep visits the colours forwards then backwards (a symmetric B).
On the CPU a compiled loop visits the nodes colour by colour (about one stencil product a sweep at 64²); on a GPU
each colour is one batched update of that colour's nodes (:func:`sweeps`).

**Gradient.** The sweeps are affine in the field, S(u) = M u + c with M = I - B A, so the backward pass is
Mᵀ g = g - A (B g), and B g is one sweep from zero with g as its load: exact, k sweeps k times. Like the
correction it is solved in float64 whatever the field's dtype. In the instances' parameters (where they need a
gradient) each colour step is the energy's minimiser over its nodes, and its term is the implicit function
theorem's (:mod:`.sensitivity`, :func:`sweep_sensitivity`).
"""

from __future__ import annotations

import functools
import itertools

import numba
import numpy as np
import torch

from diffnet.backend.clock import SWEEPS, PartClock
from diffnet.multigrid.stencil import apply_blocks, as_blocks, as_fields, neighbour_offsets

__all__ = ["apply_sweeps", "sweeps", "sweep_sensitivity", "Sweeps"]


def _colours(dims: int) -> list[tuple[int, ...]]:
    """Each colour as its nodes' parity per axis, in the forward order."""
    return list(itertools.product((0, 1), repeat=dims))


def _inverse_diagonal(hessian: torch.Tensor, free: torch.Tensor) -> torch.Tensor:
    """Each node's C x C diagonal block on its free unknowns, inverted: (S, *grid, C, C). A fixed unknown's row and
    column are the identity's, and its update is masked away."""
    dims = free.ndim - 2
    centre = neighbour_offsets(dims).index((0,) * dims)
    block = torch.movedim(hessian[:, :, :, centre], (1, 2), (-2, -1))  # (S, *grid, C, C)
    mask = torch.movedim(free, 1, -1).to(block.dtype)  # (S, *grid, C)
    both = mask[..., :, None] * mask[..., None, :]
    eye = torch.eye(block.shape[-1], dtype=block.dtype, device=block.device)
    return torch.linalg.inv(block * both + eye * (1 - mask)[..., None])


def _by_colour(hessian: torch.Tensor, inverse: torch.Tensor, free: torch.Tensor) -> dict:
    """Each colour's rows of the operator, contiguous: its Hessian blocks, diagonal inverses and free mask (the GPU's
    batched sweep). Read once per call and reused by every sweep (and the backward pass): the strided slices of one
    colour, read anew in every product, cost 15x a whole stencil product at 64²."""
    out = {}
    for colour in _colours(free.ndim - 2):
        at = tuple(slice(p, None, 2) for p in colour)
        out[colour] = (hessian[(slice(None),) * 4 + at].contiguous(),
                       torch.movedim(inverse[(slice(None), *at)], (-2, -1), (1, 2)).contiguous(),
                       free[(slice(None), slice(None), *at)].to(hessian.dtype).contiguous())
    return out


def _half_sweep(rows: dict, loads: dict, parts: dict, order) -> None:
    """One Gauss-Seidel pass over the colours in ``order`` for A x = load (block layout), in place on ``parts``: x
    split by colour, each colour's nodes a grid of their own with a layer of zeros around it (:func:`_split`), so a
    neighbour of every node of one colour is a shifted view of another colour's grid, read without stride. ``rows``
    (:func:`_by_colour`) and ``loads`` the operator and the load split the same way. Written as the C x C block
    products themselves (C <= 3)."""
    c = next(iter(parts.values())).shape[1]
    dims = next(iter(parts.values())).ndim - 2
    offsets = neighbour_offsets(dims)
    for colour in order:
        hessian, inverse, free = rows[colour]
        counts = free.shape[2:]
        residual = loads[colour].clone()
        for k, offset in enumerate(offsets):
            # The node 2 i + p + o is of colour (p + o) mod 2, at index i + floor((p + o) / 2) on that colour's grid.
            other = tuple((p + o) % 2 for p, o in zip(colour, offset))
            shift = tuple((p + o) // 2 for p, o in zip(colour, offset))
            view = parts[other][(slice(None), slice(None), *(slice(1 + t, 1 + t + m) for t, m in zip(shift, counts)))]
            for b in range(c):
                residual -= hessian[:, :, b, k] * view[:, b: b + 1]
        centre = parts[colour][(slice(None), slice(None), *(slice(1, 1 + m) for m in counts))]
        step = sum(inverse[:, :, b] * residual[:, b: b + 1] for b in range(c))
        centre += step * free


def _split(x: torch.Tensor, pad: bool) -> dict:
    """x (S, C, *grid) split by colour: each colour's nodes as a contiguous grid, with a layer of zeros around it
    (``pad``) or without."""
    dims = x.ndim - 2
    out = {}
    for colour in _colours(dims):
        part = x[(slice(None), slice(None), *(slice(p, None, 2) for p in colour))]
        out[colour] = torch.nn.functional.pad(part, (1, 1) * dims) if pad else part.contiguous()
    return out


@functools.lru_cache(maxsize=16)
def _walk(grid: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The compiled sweep's tables for a grid: each node's 3^d neighbours as flat indices (-1 outside the grid), and
    the nodes in the forward order, colour after colour (:func:`_colours`)."""
    dims = len(grid)
    index = np.arange(int(np.prod(grid))).reshape(grid)
    padded = np.pad(index, 1, constant_values=-1)
    neighbours = np.stack([padded[tuple(slice(1 + o, 1 + o + n) for o, n in zip(offset, grid))].ravel()
                           for offset in neighbour_offsets(dims)], axis=1)
    order = np.concatenate([index[tuple(slice(p, None, 2) for p in colour)].ravel() for colour in _colours(dims)])
    return np.ascontiguousarray(neighbours), order


@numba.njit(cache=True)
def _sweeps_compiled(hessian, inverse, free, load, x, neighbours, order, count):  # pragma: no cover - compiled
    """The sweeps of :func:`sweeps` on the CPU, in place on x (S, N, C): the same colours in the same order, node by
    node, everything node-major (a node's couplings together: hessian (S, N, C, C, K), inverse (S, N, C, C), free
    (S, N, C) as 0/1, load (S, N, C))."""
    n_s, _, c, _, k_n = hessian.shape
    m = order.size
    r = np.empty(c)
    for s in range(n_s):
        for _ in range(count):
            for backward in range(2):
                for t in range(m):
                    i = order[m - 1 - t] if backward else order[t]
                    for a in range(c):
                        total = load[s, i, a]
                        for b in range(c):
                            for k in range(k_n):
                                j = neighbours[i, k]
                                if j >= 0:
                                    total -= hessian[s, i, a, b, k] * x[s, j, b]
                        r[a] = total
                    for a in range(c):
                        step = 0.0
                        for b in range(c):
                            step += inverse[s, i, a, b] * r[b]
                        x[s, i, a] += step * free[s, i, a]


@numba.njit(cache=True)
def _inverse_compiled(hessian, free, centre):  # pragma: no cover - compiled
    """:func:`_inverse_diagonal` node-major on the CPU (hessian (S, N, C, C, K), free (S, N, C) as 0/1): (S, N, C, C),
    in closed form for C <= 2 (torch's batched inverse of 2 x 2 blocks cost 3x the sweeps it serves)."""
    n_s, n, c = free.shape
    out = np.zeros((n_s, n, c, c))
    block = np.empty((c, c))
    for s in range(n_s):
        for i in range(n):
            for a in range(c):
                for b in range(c):
                    fixed = free[s, i, a] == 0.0 or free[s, i, b] == 0.0
                    block[a, b] = (1.0 if a == b else 0.0) if fixed else hessian[s, i, a, b, centre]
            if c == 1:
                out[s, i, 0, 0] = 1.0 / block[0, 0]
            elif c == 2:
                det = block[0, 0] * block[1, 1] - block[0, 1] * block[1, 0]
                out[s, i, 0, 0], out[s, i, 1, 1] = block[1, 1] / det, block[0, 0] / det
                out[s, i, 0, 1], out[s, i, 1, 0] = -block[0, 1] / det, -block[1, 0] / det
            else:
                out[s, i] = np.linalg.inv(block)
    return out


def prepared(hessian: torch.Tensor, free: torch.Tensor) -> dict:
    """What every sweep of one operator reads, made once (and kept for the backward pass): the diagonal blocks'
    inverses and, on a GPU, the operator split by colour (:func:`_by_colour`); on the CPU the compiled sweep's
    arrays."""
    if hessian.is_cuda:
        return {"rows": _by_colour(hessian, _inverse_diagonal(hessian, free), free)}
    s, c = free.shape[:2]
    n = free[0, 0].numel()
    nodes = hessian.reshape(s, c, c, -1, n).permute(0, 4, 1, 2, 3).contiguous().numpy()  # node-major
    mask = free.reshape(s, c, n).transpose(1, 2).double().contiguous().numpy()
    return {"hessian": nodes, "free": mask, "inverse": _inverse_compiled(nodes, mask, (nodes.shape[-1] - 1) // 2)}


def sweeps(hessian: torch.Tensor, free: torch.Tensor, load: torch.Tensor, x: torch.Tensor, count: int,
           operator: dict | None = None) -> torch.Tensor:
    """``count`` symmetric multicolour block Gauss-Seidel sweeps for A x = ``load`` on the free nodes, from ``x``
    (block layout: A (S, C, C, 3^d, *grid) at every node, free (S, C, *grid) bool, load and x (S, C, *grid), float64);
    the fixed nodes keep x's values. ``operator``: :func:`prepared`, when already at hand. Returns a new tensor.

    On the CPU a compiled loop over the nodes (numba); on a GPU batched tensor updates, one per colour
    (:func:`_half_sweep`): the same colours in the same order, so the same field to rounding. Why compiled: the
    batched updates of one colour's strided nodes cost 2-3 stencil products a colour at 64² on the CPU, where the
    loop costs about one per sweep."""
    operator = prepared(hessian, free) if operator is None else operator
    dims = x.ndim - 2
    if "rows" not in operator:
        s, c = x.shape[:2]
        out = x.reshape(s, c, -1).transpose(1, 2).double().contiguous().numpy()  # node-major, a copy
        neighbours, order = _walk(tuple(x.shape[2:]))
        _sweeps_compiled(operator["hessian"], operator["inverse"], operator["free"],
                         load.reshape(s, c, -1).transpose(1, 2).contiguous().numpy(), out, neighbours, order, count)
        return torch.from_numpy(out).transpose(1, 2).reshape(x.shape)
    colours = _colours(dims)
    parts, loads = _split(x, pad=True), _split(load, pad=False)
    for _ in range(count):
        _half_sweep(operator["rows"], loads, parts, colours)
        _half_sweep(operator["rows"], loads, parts, colours[::-1])
    out = torch.empty_like(x)
    for colour, part in parts.items():
        out[(slice(None), slice(None), *(slice(p, None, 2) for p in colour))] = \
            part[(slice(None), slice(None), *(slice(1, -1),) * dims)]
    return out


def _colour_masks(free: torch.Tensor) -> list[torch.Tensor]:
    """Each colour's free unknowns (S, C, *grid) as 0/1, in a sweep's order: the colours forwards, then backwards."""
    dims = free.ndim - 2
    grid = free.shape[2:]
    masks = []
    for colour in _colours(dims):
        mask = torch.zeros(grid, dtype=torch.float64, device=free.device)
        mask[tuple(slice(p, None, 2) for p in colour)] = 1.0
        masks.append(mask * free.double())
    return masks + masks[::-1]


def sweep_sensitivity(hessian: torch.Tensor, free: torch.Tensor, load: torch.Tensor, v: torch.Tensor, count: int,
                      grad: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """The backward pass of ``count`` sweeps from ``v``, colour step by colour step (block layout, float64):
    ``grad``'s pull-back to v, and each colour step's field after it x' and direction w = D_c⁻¹ ḡ on its nodes (the
    implicit function theorem's pairs, :func:`diffnet.multigrid.sensitivity.parameter_vjp`).

    A colour step sets its nodes to the energy's minimiser over them (nodes of one colour never couple):
    x' = x + M_c D⁻¹ (b - A x), so ḡ ↦ ḡ - A w with w = D⁻¹ M_c ḡ. The steps are replayed here as batched tensor
    updates, one stencil product each: the same colours in the same order as :func:`sweeps`."""
    inverse = _inverse_diagonal(hessian, free)  # (S, *grid, C, C)

    def solve_diagonal(r: torch.Tensor) -> torch.Tensor:  # D⁻¹ r, node by node
        return torch.movedim(torch.einsum("s...ab,s...b->s...a", inverse, torch.movedim(r, 1, -1)), -1, 1)

    masks = _colour_masks(free) * count
    states, x = [], v
    for mask in masks:
        x = x + mask * solve_diagonal(load - apply_blocks(hessian, x))
        states.append(x)
    directions, g = [], grad
    for mask in masks[::-1]:
        w = solve_diagonal(mask * g)
        directions.append(w)
        g = g - apply_blocks(hessian, w)
    return g, states, directions[::-1]


class Sweeps(torch.autograd.Function):
    """u = S^k(v) forward (``smoothed``, computed outside); backward (Mᵀ)^k g, Mᵀ g = g - A (B g) (module docstring),
    and, where the parameters ``instances`` need a gradient, the colour steps' implicit-function-theorem terms
    (:func:`sweep_sensitivity`; ``family``'s energy must be the quadratic the sweeps minimise)."""

    @staticmethod
    def forward(ctx, v: torch.Tensor, smoothed: torch.Tensor, instances: torch.Tensor | None, operator: tuple,
                count: int, vector: bool, clock: PartClock, family, load: torch.Tensor) -> torch.Tensor:
        ctx.operator, ctx.count, ctx.vector, ctx.clock, ctx.family, ctx.load = operator, count, vector, clock, family, load
        ctx.v, ctx.instances = v.detach(), instances
        return smoothed.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        hessian, free, operator = ctx.operator
        dp = None
        with ctx.clock.part(SWEEPS, grad.device):
            g = as_blocks(grad.double(), ctx.vector)
            if ctx.instances is not None and ctx.needs_input_grad[2]:
                from diffnet.multigrid.sensitivity import parameter_vjp

                v = as_blocks(ctx.v.double(), ctx.vector)
                g, states, directions = sweep_sensitivity(hessian, free, ctx.load, v, ctx.count, g)
                fields = lambda xs: [as_fields(x, ctx.vector) for x in xs]  # noqa: E731
                dp = parameter_vjp(ctx.family, fields(states), fields(directions), ctx.instances,
                                   quadratic=True).to(ctx.instances.dtype)
            else:
                zero = torch.zeros_like(g)
                for _ in range(ctx.count):
                    g = g - apply_blocks(hessian, sweeps(hessian, free, g, zero, 1, operator))
        return as_fields(g, ctx.vector).to(grad.dtype), None, dp, None, None, None, None, None, None


def apply_sweeps(u: torch.Tensor, hessian: torch.Tensor, free: torch.Tensor, load: torch.Tensor, count: int, vector: bool,
           clock: PartClock | None = None, instances: torch.Tensor | None = None, family=None) -> torch.Tensor:
    """The field ``u`` (S, [C,] *grid; ``vector``: C > 1) after ``count`` symmetric Gauss-Seidel sweeps with the fine
    Hessian ``hessian`` (S, C, C, 3^d, *grid), its free nodes (S, C, *grid) and its load (S, C, *grid), float64 (a coarse
    correction's, :class:`~diffnet.multigrid.coarse.CoarseSpace`); differentiable in u (the module docstring's backward
    pass), in u's dtype, and in ``instances`` where they need a gradient: the instances of ``family``, whose quadratic
    energy has that Hessian and load (:func:`sweep_sensitivity`)."""
    if count == 0:
        return u
    clock = clock if clock is not None else PartClock()
    with clock.part(SWEEPS, u.device), torch.inference_mode(False), torch.no_grad():
        v = as_blocks(u.detach().clone().double(), vector)
        operator = prepared(hessian, free)
        smoothed = as_fields(sweeps(hessian, free, load, v, count, operator), vector).to(u.device)
    smoothed = smoothed.to(u.dtype)
    through_params = instances is not None and instances.requires_grad
    if torch.is_grad_enabled() and (u.requires_grad or through_params):
        return Sweeps.apply(u, smoothed, instances if through_params else None, (hessian, free, operator), count, vector,
                            clock, family, load)
    return smoothed
