"""The product's exact coarse-space correction of an energy: the smooth error removed by construction.

A trained generator's error sits in the smooth modes (at 128², 90 % of its square in the modes a
17² grid holds, docs/results.md), and a loss sees those modes least: the energy's gradient weights
each mode by its eigenvalue. For a family whose loss is a quadratic energy
E(u) = 1/2 uᵀ A u - fᵀ u in the free nodal values (the Q1 energies), the best field in
ũ + range(P) has a closed form, one small solve per instance:

    u = ũ + P A_c⁻¹ Pᵀ (f - A ũ) = ũ - P A_c⁻¹ Pᵀ g(ũ),    A_c = Pᵀ A P,    g = ∇E,

the A-orthogonal projection of ũ's error onto the coarse space: the energy's exact minimiser over
ũ + range(P). It is applied to the network's field ũ in every pass, training and inference alike
(:class:`diffnet.multigrid.corrected.CoarseCorrected`), so the network is left the part of the solution a coarse grid cannot hold.

* **P**: multilinear interpolation from a node grid of ``nodes`` per side (at most half the level's
  intervals, :func:`coarse_grid`) to the field's grid, without rows at the family's fixed nodes
  (Dirichlet, outside a cut domain) nor columns at the coarse grid's.
* **A**: the family's Hessian stencil (capability ``precondition``) on its free nodes. For a loss that
  is not quadratic, :func:`coarse_correction` is one Newton step of the linearisation at ũ (trained through
  with the linearisation's gradient, the cubic-reaction plugin ended at 563x its floor, 3.41x without); the
  generator takes the exact minimiser instead, by damped Newton on this coarse space
  (:mod:`diffnet.multigrid.minimiser`; :class:`diffnet.multigrid.corrected.CoarseCorrected` chooses).
* **A_c** = Pᵀ A P from A's stencil by one contraction per axis and fine offset with the products of
  the interpolation weights (:meth:`CoarseSpace._coarse_operator`). The grids need not nest (a
  128-node grid has a prime 127 intervals), and then a coarse node couples to the nodes two away,
  never three: a 5^d-point coarse stencil, scattered into a dense matrix and Cholesky-factorised per
  instance (289 unknowns at 17²; 729 in 3-D at 9³).
* **Gradient.** The backward pass is the transpose of the correction's Jacobian, I - A P A_c⁻¹ Pᵀ
  (the linearisation held fixed): exact for a quadratic loss. For the energy itself, Pᵀ ∇E(u) = 0 at
  the corrected field, so the gradient reaching the network is ∇E(u) unchanged; for the
  preconditioned loss it is the loss's gradient with its coarse part (in A's inner product) removed.
  In the instances' parameters, where they need a gradient: -∂_p [w · ∇E(u; p)] with w = P A_c⁻¹ Pᵀ g, the
  implicit function theorem's term (:mod:`.sensitivity`), which holding A fixed would leave out.
* In float64 whatever the network's dtype (the correction of a 1e-4 smooth error is resolved by
  residuals of 1e-8 of the field), returned in the field's dtype; CPU or CUDA.
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from diffnet.backend.budget import cache_bytes
from diffnet.backend.clock import FACTORISATION, GRADIENT, HESSIAN, OPERATOR, SOLVES, PartClock
from diffnet.multigrid.hessian import block_hessian, fixed_nodes, loss_gradient
from diffnet.multigrid.stencil import apply_stencil, as_blocks, as_fields, components, free_couplings
from diffnet.multigrid.factor import BandedFactor, factor_bytes, factorise_stencil, solve_factors
from diffnet.multigrid.sweeps import apply_sweeps
from diffnet.multigrid.vcycle import along_axes, dense_interpolation

if TYPE_CHECKING:
    from diffnet.protocol.family import Family

__all__ = ["CoarseSpace", "Correct", "coarse_correction", "coarse_grid", "corrected_field",
           "forget_coarse_spaces"]


def coarse_grid(resolution: tuple[int, ...], nodes: int) -> tuple[int, ...]:
    """The coarse node grid of a correction with ``nodes`` per side on a field of ``resolution``: at most
    ``nodes``, and at most half the intervals of the field's grid (so that A_c couples coarse nodes at
    most two apart; on a grid that small the network would otherwise be corrected into the FEM solution)."""
    if nodes < 3:
        raise ValueError(f"a coarse grid needs at least 3 nodes per side, got {nodes}")
    return tuple(max(2, min(nodes, (n - 1) // 2 + 1)) for n in resolution)


def coupling_reach(transfers: list[torch.Tensor]) -> int:
    """How many coarse nodes apart P^T A P couples, for A coupling each fine node to its neighbours and the
    per-axis interpolations ``transfers``: 1 where the grids nest (a coarse node every other fine node), else 2."""
    reach = 0
    for p in transfers:
        support = (p != 0).double()
        neighbours = torch.ones(len(p), len(p), dtype=torch.float64, device=p.device).triu(-1).tril(1)
        coupled = (support.T @ neighbours @ support).nonzero()
        reach = max(reach, int((coupled[:, 0] - coupled[:, 1]).abs().max()))
    return reach


def _float64(x: torch.Tensor) -> torch.Tensor:
    return x.double() if x.is_floating_point() else x


@dataclass
class CoarseSpace:
    """The coarse space of one batch: P, the free nodes on both grids, A's stencil and A_c's factors.

    Build it with :meth:`build`; :meth:`project` is P A_c⁻¹ Pᵀ, the A-orthogonal projector's
    action on a residual.
    """

    transfers: list[torch.Tensor]  # per axis, (n_fine, n_coarse) interpolation
    free: torch.Tensor  # (S, C, *grid) bool (C = 1 for one unknown)
    coarse_free: torch.Tensor  # (S, C, *coarse) bool
    hessian: torch.Tensor  # (S, C, C, 3^d, *grid): A at every node (the backward pass's transpose)
    factors: list[BandedFactor | torch.Tensor]  # per instance, A_c's Cholesky factor (:class:`~diffnet.multigrid.factor.BandedFactor`, or dense)
    vector: bool = False  # fields (S, C, *grid) outside, not (S, *grid)
    load: torch.Tensor | None = None  # (S, C, *grid): b of E(u) = 1/2 uᵀ A u - bᵀ u + const, so that ∇E(u) = A u - b

    @classmethod
    def build(cls, family: Family, u: torch.Tensor, instances: torch.Tensor, nodes: int,
              clock: PartClock | None = None, quadratic: bool = False) -> "CoarseSpace":
        """The coarse space of ``family`` at the float64 field ``u`` (S, [C,] *grid) with ``nodes`` coarse nodes a side
        (``clock``: the seconds of its parts).

        With ``quadratic`` (the family's energy is; the configuration refuses the correction otherwise) an
        instance's space does not depend on the field: each instance's is built the first time this process
        meets it and kept (:mod:`diffnet.backend.budget`), and serves every later correction of it, the second stage's and
        the next epoch's alike. Else it is the linearisation at ``u``, built for this batch. The family's Hessian
        is formed in float64: from float32 coefficients A_c's rounding, times its condition number (about 1e3
        for a KL diffusivity on 9^2), reached 2e-5 of the correction."""
        clock = clock if clock is not None else PartClock()
        vector = components(family) > 1
        grid = tuple(u.shape[2:] if vector else u.shape[1:])
        coarse = coarse_grid(grid, nodes)
        transfers = [dense_interpolation(n, m, u) for n, m in zip(grid, coarse)]
        # On a GPU no host copy of the instances, which a CUDA graph could not capture: built for every batch.
        if u.is_cuda or not quadratic:
            parts = cls._build_new(family, u, instances, transfers, coarse, vector, clock)
        else:
            parts = cls._kept(family, u, instances, transfers, coarse, vector, clock)
        return cls.of(transfers, parts, vector)

    @classmethod
    def of(cls, transfers: list[torch.Tensor], parts: list["_Instance"], vector: bool) -> "CoarseSpace":
        """The coarse space of a batch of instances' spaces ``parts`` (one P: ``transfers``)."""
        stack = lambda name: torch.stack([getattr(part, name) for part in parts])  # noqa: E731
        return cls(transfers, stack("free"), stack("coarse_free"), stack("hessian"), [part.factor for part in parts],
                   vector, stack("load"))

    @classmethod
    def _kept(cls, family: Family, u: torch.Tensor, instances: torch.Tensor, transfers: list[torch.Tensor],
              coarse: tuple[int, ...], vector: bool, clock: PartClock) -> list["_Instance"]:
        """The instances' kept coarse spaces (:mod:`diffnet.backend.budget`), those not met before built and kept."""
        keys = [(family, coarse, u.dtype, row.tobytes())
                for row in instances.detach().double().cpu().numpy().reshape(len(instances), -1)]
        parts: list[_Instance | None] = [_SPACES.get(key) for key in keys]
        for key, part in zip(keys, parts):
            if part is not None:
                _SPACES.move_to_end(key)
        missing = [k for k, part in enumerate(parts) if part is None]
        if missing:
            index = torch.as_tensor(missing, device=u.device)
            chosen = instances.index_select(0, index.to(instances.device))
            # Built at the instance's lift (its field of a zero network output), not at the field met first: the kept
            # load b = A w - ∇E(w) is the same for any w only up to rounding, and a space built at whichever field a
            # process met first made a run resumed in a new process differ from the uninterrupted one in the last bits.
            with torch.no_grad():
                lift = family.field(torch.zeros(len(missing), components(family), *u.shape[u.ndim - len(coarse):],
                                                dtype=u.dtype, device=u.device), chosen).to(u.dtype)
            built = cls._build_new(family, lift, chosen, transfers, coarse, vector, clock)
            for k, part in zip(missing, built):
                parts[k] = part
                _remember(keys[k], part)  # may forget older instances, this batch's own among them: read from parts
        return parts

    @classmethod
    def _build_new(cls, family: Family, u: torch.Tensor, instances: torch.Tensor, transfers: list[torch.Tensor],
                   coarse: tuple[int, ...], vector: bool, clock: PartClock, shift: bool = False) -> list["_Instance"]:
        """The coarse spaces of instances not met before, one per instance (``shift``: an indefinite A_c shifted until
        it is positive definite, :func:`~diffnet.multigrid.factor.factorise_stencil`)."""
        with clock.part(HESSIAN, u.device):
            hessian, free = block_hessian(family, u, instances)
            coarse_free = as_blocks(fixed_nodes(family.at_resolution(coarse), instances, u.dtype).logical_not(), vector)
        with clock.part(GRADIENT, u.device):  # b = A u - ∇E(u), so that ∇E(w) = A w - b for any w where E is quadratic
            load = apply_stencil(hessian, as_blocks(u, vector)) - as_blocks(loss_gradient(family, u, instances), vector)
        # A on the free nodes, the operator of the energy's minimiser. P is zero at the fixed nodes, so Pᵀ A P needs
        # no identity rows there, and the factorisation reads one triangle: no symmetrising either (the full
        # on_free_nodes was a fifth of an elasticity instance's build).
        stencil = free_couplings(hessian, free)
        space = cls(transfers, free, coarse_free, hessian, [], vector)
        with clock.part(OPERATOR, u.device):
            values = space._coarse_operator(stencil, coupling_reach(transfers))
        # A coarse node whose basis function lies on fixed fine nodes only adds nothing: an identity row.
        centre = (values.shape[-1] - 1) // 2
        diagonal = torch.stack([values[:, a, a, :, centre] for a in range(values.shape[1])], dim=1).flatten(1)
        empty = (diagonal.abs() <= 1e-12 * diagonal.abs().amax(dim=1, keepdim=True)).reshape(space.coarse_free.shape)
        coarse_free = space.coarse_free & ~empty
        with clock.part(FACTORISATION, u.device):
            factors = factorise_stencil(values, coarse_free.flatten(1), coarse, "the coarse correction's A_c", shift)
        return [_Instance(free[k], coarse_free[k], hessian[k], factors[k], load[k]) for k in range(len(values))]

    def prolong(self, coarse: torch.Tensor) -> torch.Tensor:
        """P x: a coarse field (S, [C,] *coarse) on the fine grid, zero at the fixed nodes."""
        blocks = as_blocks(coarse, self.vector)
        return as_fields(along_axes(blocks * self.coarse_free, self.transfers, False) * self.free, self.vector)

    def restrict(self, fine: torch.Tensor) -> torch.Tensor:
        """Pᵀ r: a fine residual (S, [C,] *grid) on the coarse grid, zero at the coarse fixed nodes."""
        blocks = as_blocks(fine, self.vector)
        return as_fields(along_axes(blocks * self.free, self.transfers, True) * self.coarse_free, self.vector)

    def project(self, r: torch.Tensor) -> torch.Tensor:
        """P A_c⁻¹ Pᵀ r for a batch r (S, [C,] *grid)."""
        rc = self.restrict(r)
        x = solve_factors(self.factors, rc.reshape(rc.shape[0], -1, 1)).reshape(rc.shape)
        return self.prolong(x)

    def gradient(self, u: torch.Tensor) -> torch.Tensor:
        """∇E(u) = A u - b of the quadratic energy, at fields u (S, [C,] *grid): one stencil product, not a pass
        of autograd through the energy (2-3x cheaper: each correction of a product needs one)."""
        return self.apply_hessian(u) - as_fields(self.load, self.vector)

    def apply_hessian(self, x: torch.Tensor) -> torch.Tensor:
        """A x with the family's Hessian (every node) for fields x (S, [C,] *grid)."""
        return as_fields(apply_stencil(self.hessian, as_blocks(x, self.vector)), self.vector)

    def _coarse_operator(self, stencil: torch.Tensor, reach: int = 2) -> torch.Tensor:
        """A_c = Pᵀ A P as a coarse block stencil (S, C, C, n, w^d), w = 2 reach + 1, for A the block stencil on the
        free nodes (S, C, C, 3^d, *grid): entry [a, b, I, O] couples unknown a at coarse node I to unknown b at I + O
        (O in :func:`itertools.product` order over (-reach, ..., reach)^d; entries that point outside the grid are
        not read). ``reach`` (:func:`coupling_reach`): 2 holds every coupling; 1 where the grids nest (each
        contraction then (3/5)^d of the work: 17³ x 3 elasticity unknowns 4x cheaper).

        Entry (I, I + O) of block (a, b) is sum_o sum_i P[i, I] a_o[i] P[i + o, I + O] over the fine
        offsets o and nodes i; P is a product of per-axis interpolations, so for each o the sum over i is
        one contraction per axis with Q_a[i, I, O_a] = p_a[i, I] p_a[i + o_a, I + O_a] (|O_a| <= reach), a few matrix
        products instead of a probe per coupling."""
        coarse = tuple(self.coarse_free.shape[2:])
        dims = len(coarse)
        s, c, n = stencil.shape[0], stencil.shape[1], math.prod(coarse)
        # Rows at fixed fine nodes and couplings to them are out of A on the free nodes; P's rows there are
        # zero, so the identity rows of the stencil must not count: keep the free rows only.
        stencil = stencil * self.free[:, :, None, None].to(stencil.dtype)
        width = 2 * reach + 1
        spans = []  # per axis and fine offset: (n_fine, n_coarse * width)
        for p in self.transfers:
            nf, nc = p.shape
            by_offset = {}
            for o in (-1, 0, 1):
                shifted = torch.zeros_like(p)
                shifted[max(-o, 0): nf - max(o, 0)] = p[max(o, 0): nf - max(-o, 0)]
                q = torch.zeros(nf, nc, width, dtype=p.dtype, device=p.device)
                for big in range(-reach, reach + 1):
                    q[:, max(-big, 0): nc - max(big, 0), big + reach] = (
                        p[:, max(-big, 0): nc - max(big, 0)] * shifted[:, max(big, 0): nc - max(-big, 0)])
                by_offset[o] = q.reshape(nf, nc * width)
            spans.append(by_offset)
        # Every block (a, b) of every instance at once: one batch of S C² stencils (9x fewer, larger products in 3-D).
        flat = stencil.reshape(s * c * c, *stencil.shape[3:])
        # Contract fine axis `axis` (then at position 1) into (I_a, O_a), moved last, for every fine offset;
        # offsets that differ in that axis only are summed before the next axis: 3^d + ... + 3 products
        # instead of d 3^d (2.6x fewer operations in 3-D).
        level = {offset: flat[:, k] for k, offset in enumerate(itertools.product((-1, 0, 1), repeat=dims))}
        for axis in range(dims):
            summed: dict[tuple[int, ...], torch.Tensor] = {}
            for offset, x in level.items():  # offset: the offsets of the axes not yet contracted
                y = torch.movedim(x, 1, -1) @ spans[axis][offset[0]]
                summed[offset[1:]] = summed[offset[1:]] + y if offset[1:] in summed else y
            level = summed
        # level[()]: (S C², I_0 O_0, ..., I_{d-1} O_{d-1}) flattened per axis -> (S, C, C, *coarse, w^d)
        total = level[()].reshape(s * c * c, *[v for m in coarse for v in (m, width)])
        total = total.permute(0, *range(1, 2 * dims + 1, 2), *range(2, 2 * dims + 2, 2))
        return total.reshape(s, c, c, n, width**dims)


@dataclass
class _Instance:
    """One instance's coarse space: its free nodes on both grids, its Hessian stencil, A_c's factor."""

    free: torch.Tensor
    coarse_free: torch.Tensor
    hessian: torch.Tensor
    factor: BandedFactor | torch.Tensor
    load: torch.Tensor

    @property
    def nbytes(self) -> int:
        return sum(t.element_size() * t.nelement() for t in (self.free, self.coarse_free, self.hessian, self.load)) + \
            factor_bytes(self.factor)


# The instances' coarse spaces, within their share of the process's budget (diffnet.backend.budget). An elasticity
# instance at 64² is 1.6 MB (its Hessian stencil 1.2 MB, A_c's banded factor 0.3 MB): a rank's shard of 1024 training
# instances on the 32² and 64² levels, 2.1 GB, fits the default share, so that no epoch after the first forms a
# Hessian or factorises again (training repeated every factorisation every epoch: 45 % of the shipped elasticity
# run's time, issue 65); past it the least recently used is built again when met.
_SPACES: OrderedDict = OrderedDict()  # key -> _Instance, least recently used first
_SPACE_BYTES = [0]


def _remember(key: tuple, part: _Instance) -> None:
    _SPACES[key] = part
    _SPACE_BYTES[0] += part.nbytes
    while _SPACE_BYTES[0] > cache_bytes("coarse spaces") and len(_SPACES) > 1:
        _SPACE_BYTES[0] -= _SPACES.popitem(last=False)[1].nbytes


def forget_coarse_spaces() -> None:
    """Drop every kept coarse space (a timed solve then builds its own: ``compare`` and ``uq`` time each pass's
    set-up)."""
    _SPACES.clear()
    _SPACE_BYTES[0] = 0


class Correct(torch.autograd.Function):
    """u = ũ + delta forward; backward the transpose of the correction's Jacobian, g - A P A_c⁻¹ Pᵀ g with A and A_c
    the space's (module docstring; for a nonlinear energy, at the minimiser: :mod:`.minimiser`), and, where the
    instances ``instances`` need a gradient, -∂_p [w · ∇E(u; p)] with w = P A_c⁻¹ Pᵀ g at the corrected field ``at``
    (float64) of ``family`` (:mod:`.sensitivity`)."""

    @staticmethod
    def forward(ctx, u: torch.Tensor, delta: torch.Tensor, instances: torch.Tensor | None, space: CoarseSpace,
                clock: PartClock, family=None, at: torch.Tensor | None = None) -> torch.Tensor:
        ctx.space, ctx.clock, ctx.family, ctx.at, ctx.instances = space, clock, family, at, instances
        return u + delta

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        space = ctx.space
        dp = None
        with ctx.clock.part(SOLVES, grad.device):
            g = grad.double()
            w = space.project(g)
            back = g - space.apply_hessian(w)
            if ctx.instances is not None and ctx.needs_input_grad[2]:
                from diffnet.multigrid.sensitivity import parameter_vjp

                dp = parameter_vjp(ctx.family, [ctx.at], [w], ctx.instances).to(ctx.instances.dtype)
        return back.to(grad.dtype), None, dp, None, None, None, None


def corrected_field(u: torch.Tensor, delta: torch.Tensor, instances: torch.Tensor, space: CoarseSpace, clock: PartClock,
                    family: Family, at: torch.Tensor) -> torch.Tensor:
    """u + delta, differentiable in u and, where they need a gradient, in the instances ``instances`` (:class:`Correct`)."""
    through_params = instances.requires_grad
    if torch.is_grad_enabled() and (u.requires_grad or through_params):
        return Correct.apply(u, delta, instances if through_params else None, space, clock, family, at)
    return u + delta


def coarse_correction(family: Family, u: torch.Tensor, instances: torch.Tensor, nodes: int,
                      clock: PartClock | None = None, quadratic: bool = False, sweeps: int = 0) -> torch.Tensor:
    """The field ``u`` (S, *grid) of ``family`` corrected by the energy's exact minimiser over
    u + range(P), P from the coarse grid of ``nodes`` a side (:func:`coarse_grid`); differentiable in u.

    Parameters
    ----------
    family
        A family with the ``precondition`` capability (its ``hessian`` and ``at_resolution``).
    u : torch.Tensor
        Fields (S, *resolution) from the family's ``field``, any floating dtype.
    instances : torch.Tensor
        The instances' parameters.
    nodes : int
        Coarse nodes per side.
    clock : PartClock, optional
        Gathers the seconds of the correction's parts (forward and backward).
    quadratic : bool
        The family's energy is quadratic: each instance's coarse space is kept and reused (:meth:`CoarseSpace.build`).
    sweeps : int
        Symmetric Gauss-Seidel sweeps with the fine Hessian after the correction (:mod:`.sweeps`).
    """
    clock = clock if clock is not None else PartClock()
    # The gradient of the loss needs autograd, also under inference mode: plain float64 copies.
    with torch.inference_mode(False), torch.enable_grad():
        u64 = u.detach().clone().double()
        p64 = _float64(instances.detach().clone())
        space = CoarseSpace.build(family, u64, p64, nodes, clock, quadratic)
        with clock.part(GRADIENT, u.device):
            g = space.gradient(u64) * as_fields(space.free, space.vector)
        with clock.part(SOLVES, u.device):
            delta = -space.project(g)
    corrected = corrected_field(u, delta.to(u.dtype), instances, space, clock, family, u64 + delta)
    return apply_sweeps(corrected, space.hessian, space.free, space.load, sweeps, space.vector, clock, instances, family)
