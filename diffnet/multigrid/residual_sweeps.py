"""Sweeps for a residual: symmetric Gauss-Seidel on the Gauss-Newton operator JᵀJ, a node's Gauss-Newton step at a
time, colour by colour.

A loss that is a residual's squares, L(u) = |r(u)|² (:class:`diffnet.protocol.loss.Residual`), has no 3^d Hessian
stencil for the energy's sweeps (:mod:`.sweeps`), but the same idea applies to its normal equations: the node i's
unknowns (C of them) take the Gauss-Newton step that minimises |r|² over them alone, the others held,

    δ_i = -(J_iᵀ J_i)⁻¹ J_iᵀ r,        J_i = ∂r / ∂u_i (one column per unknown of node i),

which for a linear residual is exactly a Gauss-Seidel step on JᵀJ δ = -Jᵀ r. Nodes whose residual supports cannot
overlap (``m`` = 2 r + 1 apart on every axis, r the residual's measured half-width (:func:`diffnet.multigrid.gauss_newton.reach`)
never couple through JᵀJ, so one colour's steps are one batched update: a forward derivative of the residual along
the colour's nodes (one per unknown) gives every column of the colour at once, each residual node read by the one
node of the colour whose support holds it. A sweep visits the m^d colours forwards, then backwards (symmetric), each
step kept only where it lowers |r|² (halved up to :data:`HALVINGS` times, else not taken: the residual's limiters
and upwinding make it only piecewise smooth). The cost of a colour is C forward derivatives of the residual, so a
sweep costs 2 m^d C of them: a stencil's cost, not a solve's.

The rough error a coarse correction cannot hold (:func:`diffnet.multigrid.gauss_newton.coarse_least_squares`) is
what these sweeps remove; together, repeated, they are a two-grid iteration on the residual. Inference only: no
gradient flows back through them (the product's ``exact_parameter_gradients`` is False with them).
"""

from __future__ import annotations

import itertools
from functools import lru_cache
from typing import TYPE_CHECKING

import torch

from diffnet.backend.clock import SWEEPS, PartClock
from diffnet.multigrid.gauss_newton import reach, residual_jvp
from diffnet.multigrid.hessian import fixed_nodes
from diffnet.multigrid.stencil import as_blocks, as_fields, components

if TYPE_CHECKING:
    from diffnet.protocol.family import Family

__all__ = ["HALVINGS", "residual_sweeps"]

HALVINGS = 4  # a colour's step halved this many times at most before it is not taken
_DAMPING = 1e-12  # of the block's largest diagonal entry: a node the residual does not see keeps its value


@lru_cache(maxsize=64)
def _owners(grid: tuple[int, ...], spacing: tuple[int, ...], colour: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The colour's nodes (a (*grid) bool mask) and, for every node of the grid, the flat index of the nearest node of
    the colour (index ≡ colour mod spacing on each axis): the one whose residual support can hold it."""
    held = torch.ones(grid, dtype=torch.bool)
    owner = torch.zeros(grid, dtype=torch.long)
    stride = 1
    for axis in reversed(range(len(grid))):
        n, m, c = grid[axis], spacing[axis], colour[axis]
        k = torch.arange(n)
        last = c + m * ((n - 1 - c) // m)
        nearest = (c + m * torch.round((k - c) / m).long()).clamp(c, last)
        shape = [1] * len(grid)
        shape[axis] = n
        held = held & ((k - c) % m == 0).reshape(shape)
        owner = owner + (nearest * stride).reshape(shape)
        stride *= n
    return held, owner.flatten()


def _loss(residual, u: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
    return residual(u, instances).square().flatten(1).sum(1)


def residual_sweeps(family: Family, u: torch.Tensor, instances: torch.Tensor, count: int,
                    clock: PartClock | None = None) -> torch.Tensor:
    """``count`` symmetric Gauss-Seidel sweeps on the Gauss-Newton operator of ``family``'s residual (capability: a
    :class:`~diffnet.protocol.loss.Residual` loss) from the fields ``u`` (S, [C,] *grid), in float64, returned in u's
    dtype; the fixed nodes keep their values. ``clock`` gathers their seconds (part ``sweeps``).

    Raises
    ------
    RuntimeError
        Where a gradient through them is asked for: they are inference only.
    """
    if count == 0:
        return u
    if torch.is_grad_enabled() and u.requires_grad:
        raise RuntimeError("a residual's sweeps have no gradient: they finish the product at inference only (the "
                           "first stage trains without them)")
    clock = clock if clock is not None else PartClock()
    channels = components(family)
    vector = channels > 1
    residual = family.loss().residual
    with clock.part(SWEEPS, u.device), torch.inference_mode(False), torch.no_grad():
        w = as_blocks(u.detach().clone().double(), vector)
        p = instances.detach().clone()
        p = p.double() if p.is_floating_point() else p
        grid = tuple(w.shape[2:])
        # reach() is one more than the measured support's half-width: two nodes 2 (reach - 1) + 1 apart never share a
        # residual node.
        spacing = tuple(min(n, 2 * r - 1) for n, r in zip(grid, reach(family, as_fields(w, vector), p)))
        free = as_blocks(fixed_nodes(family, p, torch.float64).logical_not(), vector).double()
        colours = list(itertools.product(*[range(m) for m in spacing]))
        losses = _loss(residual, as_fields(w, vector), p)
        s, nodes = w.shape[0], w[0, 0].numel()
        for _ in range(count):
            for colour in colours + colours[::-1]:
                held, owner = _owners(grid, spacing, colour)
                held, owner = held.to(w.device), owner.to(w.device)
                # One forward derivative of the batch repeated once per unknown: column b of every node of the colour.
                directions = torch.zeros(channels, s, channels, *grid, dtype=torch.float64, device=w.device)
                for b in range(channels):
                    directions[b, :, b] = held * free[:, b]
                fields = as_fields(w, vector)
                r, d = residual_jvp(family, fields.repeat((channels,) + (1,) * (fields.ndim - 1)),
                                    as_fields(directions.flatten(0, 1), vector),
                                    p.repeat((channels,) + (1,) * (p.ndim - 1)))
                r = r[:s].reshape(s, -1, nodes)  # (S, R, N): R residual components
                d = d.reshape(channels, s, -1, nodes)  # (C, S, R, N)
                # Each residual node read by the node of the colour whose support holds it (its owner).
                gram = torch.zeros(s, nodes, channels, channels, dtype=torch.float64, device=w.device)
                rhs = torch.zeros(s, nodes, channels, dtype=torch.float64, device=w.device)
                for a in range(channels):
                    rhs[:, :, a].index_add_(1, owner, (d[a] * r).sum(1))
                    for b in range(a, channels):
                        gram[:, :, a, b] = gram[:, :, b, a] = torch.zeros(s, nodes, dtype=torch.float64, device=w.device
                                                                          ).index_add_(1, owner, (d[a] * d[b]).sum(1))
                diagonal = torch.diagonal(gram, dim1=2, dim2=3)
                scale = diagonal.amax(dim=(1, 2), keepdim=True).clamp_min(1e-300)
                gram = gram + torch.diag_embed(_DAMPING * scale + (diagonal == 0) * scale)
                delta = -torch.linalg.solve(gram, rhs[..., None])[..., 0]  # (S, N, C)
                step = delta.transpose(1, 2).reshape(s, channels, *grid) * held * free
                alpha = torch.ones(s, dtype=torch.float64, device=w.device)
                taken = torch.zeros(s, dtype=torch.bool, device=w.device)
                shape = (-1,) + (1,) * (w.ndim - 1)
                for _ in range(HALVINGS + 1):
                    trial = _loss(residual, as_fields(w + alpha.reshape(shape) * step, vector), p)
                    fresh = ~taken & torch.isfinite(trial) & (trial <= losses)
                    losses = torch.where(fresh, trial, losses)
                    w = torch.where(fresh.reshape(shape), w + alpha.reshape(shape) * step, w)
                    taken = taken | fresh
                    if bool(taken.all()):
                        break
                    alpha = torch.where(taken, alpha, 0.5 * alpha)
    return as_fields(w, vector).to(dtype=u.dtype, device=u.device)
