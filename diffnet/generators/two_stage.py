"""A second stage: a second network that corrects a trained first one, u = u1 + eps v.

The first network's field u1 sits at an error the optimiser no longer reduces (the plateau of
docs/physics.md). Multi-stage networks (Wang & Lai, J. Comput. Phys. 2024) fit what is left
with a second network on a rescaled target. Here the target comes from no data: the first
stage's preconditioned gradient d1 = B g1 (``B`` V-cycles of the loss's Hessian, ``g1`` the loss's gradient
at u1, :mod:`diffnet.multigrid.preconditioned`) is about its error, so ``eps = rms(d1)`` per sample sets
the scale, the second network sees the family's inputs and d1 / eps (one channel per unknown field),
and its field v (with the family's homogeneous boundary conditions) is of order one:

    u = u1 + eps (field(v) - field(0)).

It trains on the same loss as the first stage (the loss of u) with the first network frozen.

:class:`TwoStage` holds both networks (one checkpoint); :meth:`TwoStage.pair` gives the second
network and the family it runs under (:class:`SecondStage`): its ``inputs`` run the first
network and the V-cycle and carry u1 and eps to ``field`` as two more channels, which the
network passes through untouched (:class:`SecondNetwork`), so the usual ``model(family.inputs(p))``
then ``family.field(raw, p)`` works for training and inference alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from diffnet.backend.clock import NETWORK, VCYCLE, PartClock
from diffnet.backend.layout import channels_last
from diffnet.multigrid.preconditioned import preconditioned_residual
from diffnet.multigrid.stencil import components
from diffnet.protocol.wrapper import INSTANCE_MEMBERS, Wrapper

if TYPE_CHECKING:
    from diffnet.protocol.family import Family

__all__ = ["TwoStage", "SecondStage", "SecondNetwork"]


class SecondNetwork(nn.Module):
    """The second network: ``net`` on the family's inputs and the scaled correction; the last input
    channels (u1, one per unknown field, and eps) pass through to its output unchanged.

    Parameters
    ----------
    net : nn.Module
        The network; it takes the family's input channels plus ``unknowns`` and gives ``unknowns``.
    unknowns : int
        The family's number of unknown fields C.
    """

    def __init__(self, net: nn.Module, unknowns: int = 1) -> None:
        super().__init__()
        self.net = net
        self.unknowns = unknowns

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        carried = self.unknowns + 1
        return torch.cat([self.net(x[:, :-carried]).to(x.dtype), x[:, -carried:]], dim=1)


class TwoStage(nn.Module):
    """A two-stage generator: ``first`` (any generator of the finest grid, e.g. a
    :class:`~diffnet.generators.networks.LevelStack`) and ``second`` (a :class:`SecondNetwork`).

    Not called itself: :meth:`pair` gives the module and the family a forward pass runs.

    Parameters
    ----------
    first, second : nn.Module
        The two networks; ``second`` takes the family's input channels plus one per unknown field.
    cycles : int
        V-cycles in the B that gives the second network its input.
    """

    def __init__(self, first: nn.Module, second: SecondNetwork, cycles: int = 1) -> None:
        super().__init__()
        self.first = first
        self.second = second
        self.cycles = cycles

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        raise TypeError("a TwoStage generator runs as model, second = two_stage.pair(family)")

    def pair(self, family: Family, loss: Family | None = None, clock: PartClock | None = None,
             base: Family | None = None) -> tuple[SecondNetwork, "SecondStage"]:
        """The second network and the family it runs under on ``family``'s fields (trained on ``loss``, default the
        family's own; ``base``: the family whose loss's B g feeds it, default ``family``; ``clock`` gathers the
        seconds of the first network and the V-cycle in its inputs)."""
        clock = clock if clock is not None else PartClock()
        return self.second, SecondStage(family, self.first, loss, self.cycles, clock, base)


def _rows(values: torch.Tensor, ndim: int) -> torch.Tensor:
    return values.reshape(-1, *([1] * (ndim - 1)))


@dataclass(frozen=True)
class SecondStage(Wrapper):
    """The family the second network runs under: ``family``'s parameters, u = u1 + eps v, ``trained``'s terms.

    ``inputs(p)`` (S, I + 2 C + 1, *grid) for I input channels and C unknown fields: the family's I
    channels, d1 / eps (C), then u1 (C) and eps (broadcast), which :class:`SecondNetwork` passes through;
    ``field(raw, p)`` reads them back. ``in_channels`` is I + C, what the second network itself sees.
    Passes on what ``family`` says of its instances, its Hessian and fixed nodes (those of the field u it
    corrects); withholds ``at_resolution`` (the second stage runs on the finest grid only).
    """

    wraps = "family"
    passed_on = INSTANCE_MEMBERS | {"clear_caches", "hessian", "assembled_correction", "fixed_nodes", "admissible"}
    # trained on ``trained``'s terms, which are neither an Energy nor a Residual of its own
    withheld = frozenset({"at_resolution", "residual", "loss"})

    family: Family
    first: nn.Module
    trained: Family | None = None  # the family whose loss trains the second network (default: ``family``)
    cycles: int = 1
    clock: PartClock = field(default_factory=PartClock, compare=False)
    base: Family | None = None  # the family whose loss's B g feeds the second network (default: ``family``)

    @property
    def in_channels(self) -> int:
        return self.family.in_channels + components(self.family)

    def inputs(self, instances: torch.Tensor) -> torch.Tensor:
        x = self.family.inputs(instances)
        with torch.no_grad():
            with self.clock.part(NETWORK, x.device):
                raw = self.first(channels_last(x))
            u1 = self.family.field(raw, instances)
        # The residual needs autograd (the loss's gradient): outside inference mode, on plain copies.
        with torch.inference_mode(False), torch.enable_grad(), self.clock.part(VCYCLE, x.device):
            p64 = instances.clone().double() if instances.is_floating_point() else instances.clone()
            d = preconditioned_residual(self.base or self.family, u1.clone().double(), p64, self.cycles)[1]
        grid = d.shape[d.ndim - len(self.family.resolution):]
        if grid != x.shape[2:]:
            raise ValueError(f"a second stage needs the family's inputs on its field's grid: inputs "
                             f"{tuple(x.shape[2:])}, field {tuple(grid)}")
        eps = d.square().mean(dim=tuple(range(1, d.ndim))).sqrt().clamp_min(1e-30)
        scaled = (d / _rows(eps, d.ndim)).to(x.dtype)
        if components(self.family) == 1:  # one unknown: fields (S, *grid), one channel each
            scaled, u1 = scaled[:, None], u1[:, None]
        return torch.cat([x, scaled, u1.to(x.dtype), _rows(eps, x.ndim).expand_as(x[:, :1]).to(x.dtype)], dim=1)

    def field(self, raw: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
        c = components(self.family)
        v, u1, eps = raw[:, :c], raw[:, c : 2 * c], raw[:, 2 * c].flatten(1)[:, :1]
        u1 = u1 if c > 1 else u1[:, 0]
        zero = self.family.field(torch.zeros_like(v), instances)  # the lift: v carries homogeneous conditions
        return u1 + _rows(eps, u1.ndim) * (self.family.field(v, instances) - zero)

    def loss_terms(self, u: torch.Tensor, instances: torch.Tensor) -> dict[str, torch.Tensor]:
        return (self.trained or self.family).loss_terms(u, instances)

    def tile_loss_terms(self, raw: torch.Tensor, instances: torch.Tensor, tiling: object) -> dict[str, torch.Tensor]:
        raise NotImplementedError("a second stage does not run under a domain split (parallel.domain): "
                                  "its V-cycle needs each sample whole")
