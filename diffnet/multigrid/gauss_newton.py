"""The coarse correction of a residual loss: its least-squares minimiser over ũ + range(P), by Gauss–Newton.

A loss that is a sum of squared residuals, L(u) = |r(u)|² (Burgers' space-time scheme: capability
``least_squares``), has no energy whose Hessian is a 3^d stencil, but its coarse analogue is the same idea:

    u = ũ + P c*,    c* = argmin_c |r(ũ + P c)|²,

found by Gauss–Newton on the coarse unknowns, batched over the instances, in float64. At the iterate w,
J_P = (∂r/∂u) P, one column per free coarse node, is read off forward-mode derivatives (dual tensors, ``torch.autograd.forward_ad``) of
the residual along *coloured* sums of P's columns: two columns whose fields' residual supports cannot overlap
(coarse nodes ``m`` apart on an axis, ``m`` from the residual's reach, :func:`reach`, and the coarse spacing) share one
derivative, so a pass costs ``m^d`` residual derivatives however many coarse nodes there are. Each residual node
is owned, per colour, by the nearest coarse node of that colour, and the products of two colours' derivatives,
summed by owner pairs, are G = J_Pᵀ J_P (dense, (S, n_c, n_c)); each derivative times the residual, summed by
owner, is J_Pᵀ r. The step δ = -(G + μ D)⁻¹ J_Pᵀ r (a Levenberg
damping μ of 1e-10 of the diagonal D: the scheme's limiters and upwinding make r only piecewise smooth), taken
with a backtracking (Armijo) line search on |r|², until the step is below :data:`TOLERANCE` of the field or |r|²
stops decreasing (a kink of the limiter), at most :data:`MAX_ITERATIONS`.

**Gradient.** At c*, Pᵀ ∇L(u) = 2 J_Pᵀ r = 0, so for the network trained on this same loss
dL(u(ũ))/dũ = (I + P ∂c*/∂ũ)ᵀ ∇L(u) = ∇L(u) (the envelope theorem): the corrected field is passed back to the
network as ũ + sg(u - ũ), exact at the minimiser. The instances' own gradient through c* is not built
(:attr:`diffnet.multigrid.corrected.CoarseCorrected.exact_parameter_gradients`).
"""

from __future__ import annotations

import itertools
import math
from functools import lru_cache
from typing import TYPE_CHECKING

import torch
import torch.autograd.forward_ad as fwAD

from diffnet.backend.clock import FACTORISATION, JACOBIAN, LINE_SEARCH, MINIMISED, NEWTON_STEPS, OPERATOR, SOLVES, \
    PartClock
from diffnet.multigrid.coarse import coarse_grid
from diffnet.multigrid.hessian import fixed_nodes
from diffnet.multigrid.minimiser import refuse_not_finite
from diffnet.multigrid.stencil import as_blocks, as_fields, components
from diffnet.multigrid.vcycle import along_axes, dense_interpolation

if TYPE_CHECKING:
    from diffnet.protocol.family import Family

__all__ = ["MAX_ITERATIONS", "TOLERANCE", "colours", "coarse_least_squares", "gauss_newton_norms", "least_squares_minimiser",
           "reach", "residual_jvp"]

TOLERANCE = 1e-6  # a step's max-norm over the field's, taken as the last
MAX_ITERATIONS = 20
_ARMIJO = 1e-4
_HALVINGS = 30
_DAMPING = 1e-10  # Levenberg's μ, of G's diagonal
_PROBES = 16  # single-node derivatives, each at its own random field, that find the residual's reach
_REACH: dict[tuple, tuple[int, ...]] = {}  # (family, grid) -> reach per axis


def residual_jvp(family: Family, u: torch.Tensor, direction: torch.Tensor, instances: torch.Tensor
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual at u and its derivative along ``direction`` (forward mode: dual tensors, measured 1.5-14x
    cheaper than ``torch.func.jvp`` on Burgers' residual at 129^2-33^2, whose padding that transform decomposes)."""
    with fwAD.dual_level():
        out = fwAD.unpack_dual(family.loss().residual(fwAD.make_dual(u, direction), instances))
    return out.primal, out.tangent


def reach(family: Family, like: torch.Tensor, instances: torch.Tensor) -> tuple[int, ...]:
    """Per grid axis, how many nodes away a node's value changes the residual (one more than measured, for safety).

    Measured once per family and grid by forward derivatives along single nodes at random fields: the union of the
    supports of :data:`_PROBES` of them (a limiter or an upwind flux hides a neighbour at one field, not at all)."""
    vector = components(family) > 1
    grid = tuple(like.shape[2:] if vector else like.shape[1:])
    key = (family, grid)
    if key not in _REACH:
        generator = torch.Generator().manual_seed(0)
        found = [0] * len(grid)
        with torch.no_grad():
            for k in range(_PROBES):
                # Ramps of either sign along every axis with a little noise: limiters and upwind fluxes select each
                # neighbour at some of them (white noise alone makes a minmod limiter flat almost everywhere).
                base = 0.1 * torch.randn((1,) + tuple(like.shape[1:]), generator=generator, dtype=torch.float64)
                for axis, n in enumerate(grid):
                    shape = [1] * base.ndim
                    shape[base.ndim - len(grid) + axis] = n
                    sign = 1.0 if (k >> axis) & 1 else -1.0
                    base = base + sign * torch.linspace(-1.0, 1.0, n, dtype=torch.float64).reshape(shape)
                node = tuple(int(n * (1 + k % 3) / 4) for n in grid)
                delta = torch.zeros_like(base)
                delta[(0, Ellipsis) + node] = 1.0
                _, out = residual_jvp(family, base, delta, instances[:1])
                hit = as_blocks(out, vector)[0].abs().sum(0).nonzero()
                for axis in range(len(grid)):
                    if len(hit):
                        found[axis] = max(found[axis], int((hit[:, axis] - node[axis]).abs().max()))
        _REACH[key] = tuple(r + 1 for r in found)
    return _REACH[key]


def colours(n_fine: int, n_coarse: int, reach_: int) -> int:
    """On one axis, how far apart two coarse nodes sharing a colour must be: each column's residual support (its hat's
    two coarse intervals widened by ``reach_`` fine nodes each side) lies within the half-way points to the next
    node of its colour when m H > 2 (H + reach), H the coarse spacing in fine nodes; at most every node its own."""
    spacing = (n_fine - 1) / (n_coarse - 1)
    return min(n_coarse, math.floor(2.0 + 2.0 * reach_ / spacing) + 1)


def _owners(n_fine: int, n_coarse: int, m: int, colour: int, device: torch.device) -> torch.Tensor:
    """(n_fine,) long: for each fine node, the nearest coarse node of ``colour`` (index ≡ colour mod m), -1 if none."""
    position = torch.arange(n_fine, dtype=torch.float64, device=device) * (n_coarse - 1) / (n_fine - 1)
    k = colour + m * torch.round((position - colour) / m).long()
    k = torch.where(k < colour, k + m, k)  # below the colour's first node: the first
    k = torch.where(k >= n_coarse, k - m, k)  # past its last: the last
    return torch.where((k >= 0) & (k < n_coarse), k, torch.full_like(k, -1))


class _Layout:
    """The colouring of one fine and coarse grid for C unknowns: per column (a colour and a component), its coarse
    direction (ones at the colour's nodes, in that component) and, for every fine node, its owner among the column's
    coarse unknowns (an index into the C × coarse nodes, -1 where none). Built once per grids (:func:`_layout`)."""

    def __init__(self, grid: tuple[int, ...], coarse: tuple[int, ...], reaches: tuple[int, ...], channels: int,
                 device: torch.device):
        self.ms = tuple(colours(n, m, r) for n, m, r in zip(grid, coarse, reaches))
        self.grid, self.coarse, self.channels = grid, coarse, channels
        nodes = math.prod(coarse)
        strides = [math.prod(coarse[a + 1:]) for a in range(len(coarse))]
        directions, owners = [], []
        for colour in itertools.product(*[range(m) for m in self.ms]):
            held = torch.ones(coarse, dtype=torch.bool, device=device)
            owner = torch.zeros(grid, dtype=torch.long, device=device)
            valid = torch.ones(grid, dtype=torch.bool, device=device)
            for axis, (n, mc, m, c) in enumerate(zip(grid, coarse, self.ms, colour)):
                shape = [1] * len(grid)
                shape[axis] = mc
                held = held & (torch.arange(mc, device=device) % m == c).reshape(shape)
                own = _owners(n, mc, m, c, device)
                shape[axis] = n
                owner = owner + (own.clamp_min(0) * strides[axis]).reshape(shape)
                valid = valid & (own >= 0).reshape(shape)
            for comp in range(channels):
                direction = torch.zeros(channels, *coarse, dtype=torch.float64, device=device)
                direction[comp] = held.double()
                directions.append(direction)
                owners.append(torch.where(valid, owner + comp * nodes, torch.full_like(owner, -1)).flatten())
        self.directions = torch.stack(directions)  # (K, C, *coarse)
        self.owners = torch.stack(owners)  # (K, N)
        self.valid = self.owners >= 0

    @property
    def unknowns(self) -> int:
        """n_c: C × coarse nodes."""
        return self.channels * math.prod(self.coarse)

    def gather(self, derivatives: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """G = J_Pᵀ J_P (S, n_c, n_c) and J_Pᵀ r (S, n_c, 1) from the columns' derivatives (K, S, R, *grid) and the
        residual r (S, R, *grid), R residual components: each node's products summed at its owners' pair, one column
        against all at a time (all pairs at once would hold K² fields, 2.7 GB at 512² for a batch of 16)."""
        k, s, n_c = len(derivatives), derivatives.shape[1], self.unknowns
        stacked = derivatives.flatten(3)  # (K, S, R, N)
        gram = torch.zeros(s, n_c * n_c, dtype=stacked.dtype, device=stacked.device)
        for i in range(k):
            product = (stacked[i][None] * stacked).sum(2)  # (K, S, N): column i's derivative times every column's
            keep = self.valid[i][None] & self.valid  # (K, N)
            index = self.owners[i][None] * n_c + self.owners  # (K, N)
            gram.index_add_(1, index[keep], product.permute(1, 0, 2)[:, keep])
        rhs = torch.zeros(s, n_c, dtype=stacked.dtype, device=stacked.device)
        product = (stacked * residual.flatten(2)[None]).sum(2)  # (K, S, N)
        rhs.index_add_(1, self.owners[self.valid], product.permute(1, 0, 2)[:, self.valid])
        return gram.reshape(s, n_c, n_c), rhs[..., None]


@lru_cache(maxsize=16)
def _layout(grid: tuple[int, ...], coarse: tuple[int, ...], reaches: tuple[int, ...], channels: int,
            device: torch.device) -> _Layout:
    """The colouring of these grids, built once (every pass of a training meets the same few)."""
    return _Layout(grid, coarse, reaches, channels, device)


def _loss(family: Family, u: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return family.loss().residual(u, instances).square().flatten(1).sum(1)


def least_squares_minimiser(family: Family, u: torch.Tensor, instances: torch.Tensor, nodes: int,
                            clock: PartClock | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The minimiser of |r(w)|² over w ∈ u + range(P) for float64 fields ``u`` (S, [C,] *grid) of ``family`` (capability
    ``least_squares``): Gauss–Newton on the coarse space of ``nodes`` a side (the module docstring).

    Returns
    -------
    w : torch.Tensor
        The minimisers, like ``u``.
    iterations : torch.Tensor
        (S,) int: each instance's Gauss–Newton steps taken.

    Raises
    ------
    CoarseNewtonError
        When an instance's residual is not finite at ``u``.
    """
    clock = clock if clock is not None else PartClock()
    vector = components(family) > 1
    channels = components(family)
    grid = tuple(u.shape[2:] if vector else u.shape[1:])
    coarse = coarse_grid(grid, nodes)
    transfers = [dense_interpolation(n, m, u) for n, m in zip(grid, coarse)]
    layout = _layout(grid, coarse, reach(family, u, instances), channels, u.device)
    s = u.shape[0]
    free = as_blocks(fixed_nodes(family, instances, u.dtype).logical_not(), vector).to(u.dtype)
    coarse_free = as_blocks(fixed_nodes(family.at_resolution(coarse), instances, u.dtype).logical_not(),
                            vector).expand(s, channels, *coarse)
    losses = _loss(family, u, instances)
    refuse_not_finite(losses, "x".join(map(str, coarse)))
    w = u.clone()
    iterations = torch.zeros(s, dtype=torch.long)
    active = torch.ones(s, dtype=torch.bool, device=u.device)
    for _ in range(MAX_ITERATIONS):
        index = active.nonzero().flatten()
        if len(index) == 0:
            break
        wa, pa, fa, cfa = w[index], instances[index], free[index], coarse_free[index]
        n = len(index)
        with clock.part(JACOBIAN, u.device):
            # One forward derivative of the batch repeated once per colour and component (one call: a call's own
            # cost, not its size, dominated one per colour at 33^2).
            columns = len(layout.directions)
            fine = along_axes(layout.directions[:, None].to(u.dtype) * cfa, transfers, False) * fa
            repeated = pa.repeat((columns,) + (1,) * (pa.ndim - 1))
            r, d = residual_jvp(family, wa.repeat((columns,) + (1,) * (wa.ndim - 1)), as_fields(fine.flatten(0, 1), vector),
                        repeated)
            derivatives = as_blocks(d, vector).unflatten(0, (columns, n))
            r = as_blocks(r[:n], vector)
        with clock.part(OPERATOR, u.device):
            # J_Pᵀ r from the same derivatives as G (no backward pass): each node's J P entry times its residual.
            gram, b = layout.gather(derivatives, r)
            b = b * cfa.reshape(n, -1, 1)
            fixed = ~cfa.reshape(n, -1)
            diagonal = torch.diagonal(gram, dim1=1, dim2=2)
            scale = diagonal.amax(dim=1, keepdim=True).clamp_min(1e-300)
            diagonal += torch.where(fixed, scale, _DAMPING * diagonal + 1e-14 * scale)
        with clock.part(FACTORISATION, u.device):
            factor, info = torch.linalg.cholesky_ex(gram)
        with clock.part(SOLVES, u.device):
            delta = -torch.cholesky_solve(b, factor).reshape(n, channels, *coarse)
            step = as_fields(along_axes(delta * cfa, transfers, False) * fa, vector)
        e0 = losses[index]
        slope = 2.0 * (b.flatten(1) * delta.flatten(1)).sum(1)  # dL along the step: < 0 where G is definite
        alpha = torch.ones(n, dtype=u.dtype, device=u.device)
        taken = torch.zeros(n, dtype=torch.bool, device=u.device)
        e_new = e0.clone()
        shape = (-1,) + (1,) * (u.ndim - 1)
        with clock.part(LINE_SEARCH, u.device):
            for _ in range(_HALVINGS):
                e = _loss(family, wa + alpha.reshape(shape) * step, pa)
                fresh = ~taken & torch.isfinite(e) & (e <= e0 + _ARMIJO * alpha * slope)
                e_new = torch.where(fresh, e, e_new)
                taken = taken | fresh
                if bool(taken.all()):
                    break
                alpha = torch.where(taken, alpha, 0.5 * alpha)
        ok = taken & (info == 0) & (slope < 0)
        w[index[ok]] = wa[ok] + alpha[ok].reshape(shape) * step[ok]
        losses[index[ok]] = e_new[ok]
        iterations[index[ok].cpu()] += 1
        size = (alpha.reshape(shape) * step).abs().flatten(1).amax(1) / wa.abs().flatten(1).amax(1).clamp_min(1e-300)
        # Stop where the step is below the tolerance, or no step lowers |r|² (a kink of the limiter or the flux).
        going = ok & (size > TOLERANCE)
        active[index] = going
    clock.count(NEWTON_STEPS, int(iterations.sum()))
    clock.count(MINIMISED, s)
    return w, iterations


def coarse_least_squares(family: Family, u: torch.Tensor, instances: torch.Tensor, nodes: int,
                         clock: PartClock | None = None) -> torch.Tensor:
    """The field ``u`` (S, [C,] *grid) corrected to the least-squares minimiser of ``family``'s residual over
    u + range(P), in u's dtype, solved in float64; its gradient in u is the identity (the module docstring: exact
    for the same loss at the minimiser)."""
    with torch.inference_mode(False), torch.no_grad():
        u64 = u.detach().clone().double()
        p64 = instances.detach().clone()
        p64 = p64.double() if p64.is_floating_point() else p64
        w, _ = least_squares_minimiser(family, u64, p64, nodes, clock)
    return u + (w - u64).to(u.dtype)


def gauss_newton_norms(family: Family, instances: torch.Tensor, at: torch.Tensor, *fields: torch.Tensor
                       ) -> list[torch.Tensor]:
    """Each of ``fields`` (S, [C,] *grid) in the Gauss-Newton norm of the family's residual at the field ``at``,
    ||x||_J = |J(at) x| per instance (S,), J the residual's Jacobian there (one forward derivative per field), in
    float64: for a residual the norm of what its linearisation makes of an error, as the energy norm is for an energy
    (:func:`diffnet.multigrid.hessian.energy_norms`)."""
    with torch.inference_mode(False), torch.no_grad():
        at = at.detach().clone().double()
        p = instances.detach().clone()
        p = p.double() if p.is_floating_point() else p
        return [torch.linalg.vector_norm(residual_jvp(family, at, x.detach().double(), p)[1].flatten(1), dim=1)
                for x in fields]
