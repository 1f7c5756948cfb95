"""A loss that sees the network's error: the family's residual preconditioned by multigrid.

For a quadratic loss L(u) = 1/2 uᵀ H u - bᵀ u the excess over the minimum is 1/2 eᵀ H e: an error
of relative size delta in the smooth modes costs delta² times their small eigenvalues, and its
gradient H e weights each mode by its eigenvalue, so the smooth error, most of a trained
network's, gets a share of order h² of the gradient. With B an approximate inverse of H (one
V-cycle, :class:`diffnet.multigrid.vcycle.VCycle`), B g for the residual g = H u - b is about the error
e = u - u_h itself, every mode weighted alike: 1/2 |B g|² estimates 1/2 |e|², and |B g| over
|u - B g| (the improved field, about |u_h|; never zero, unlike an untrained network's u) the
relative error against the grid's own solution.

Two forms, the same value 1/2 |B g|² / |u - B g|² per sample:

* ``target``: 1/2 |u - sg(u - B g)|², the network pulled towards its own output improved by the
  V-cycle (sg: no gradient through the target): gradient B g.
* ``loss``: 1/2 |B g(u)|² as a function of u: gradient H B B g (one more V-cycle and one Hessian
  product per step).

The residual, the V-cycle and the loss's accumulation run in float64 whatever the network's
dtype: at 256² the residual of a 1.5e-4 smooth error is about 5e-8 of |u| per node, under float32
rounding of one stencil sum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from diffnet.multigrid.hessian import loss_gradient
from diffnet.multigrid.vcycle import VCycle

from diffnet.protocol.wrapper import INSTANCE_MEMBERS, Wrapper

if TYPE_CHECKING:
    from diffnet.protocol.family import Family

__all__ = ["FORMS", "PreconditionedLoss", "error_estimate", "preconditioned_residual"]

FORMS = ("target", "loss")


def _float64(instances: torch.Tensor) -> torch.Tensor:
    return instances.double() if instances.is_floating_point() else instances


def preconditioned_residual(family: Family, u64: torch.Tensor, p64: torch.Tensor, cycles: int) -> tuple[VCycle | None, torch.Tensor]:
    """B and B g at the float64 field u64: the V-cycles of the family's Hessian there, and the residual through them.

    A family with an ``assembled_correction(u, instances, cycles)`` gives B g itself (its assembled system's
    multigrid, where the torch V-cycle of its Hessian does not converge); B is then None."""
    own = family.loss().assembled_correction
    if own is not None:
        return None, own(u64, p64, cycles)
    precondition = VCycle.build(family, u64, p64, cycles=cycles)
    return precondition, precondition(loss_gradient(family, u64, p64) * precondition.free)


def error_estimate(family: Family, u: torch.Tensor, instances: torch.Tensor, cycles: int = 1) -> torch.Tensor:
    """|B g| / |u - B g| per sample (S,), in float64: the estimated relative error of fields u (S, *grid)
    against the grid's own solution of the family's loss."""
    u64 = u.detach().double()
    _, d = preconditioned_residual(family, u64, _float64(instances), cycles)
    dims = tuple(range(1, u.ndim))
    return (d.square().sum(dims) / (u64 - d).square().sum(dims)).sqrt()


@dataclass(frozen=True)
class PreconditionedLoss(Wrapper):
    """The family a generator trains on under ``train.loss = "preconditioned"``: ``family``'s inputs
    and field, and the loss term ``preconditioned`` = 1/2 |B g|² / |u - B g|² per sample (constant
    denominator: no gradient through it).

    Passes on what ``family`` says of its instances, its inputs, field and Hessian (the V-cycle's operator, not the
    Hessian of the preconditioned term); its own: the loss and the family on another grid.

    Parameters
    ----------
    family
        A family with the ``precondition`` capability (its ``hessian`` and ``at_resolution``).
    cycles
        V-cycles in B.
    form
        ``target`` or ``loss`` (see the module docstring).
    """

    wraps = "family"
    passed_on = INSTANCE_MEMBERS | {"clear_caches", "in_channels", "inputs", "field", "hessian", "assembled_correction",
                                    "fixed_nodes", "admissible"}
    withheld = frozenset({"residual", "loss"})  # the preconditioned term is neither the residual's squares nor an energy

    family: Family
    cycles: int = 1
    form: str = "target"

    def __post_init__(self) -> None:
        if self.form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}, got {self.form!r}")

    def at_resolution(self, resolution: tuple[int, ...]) -> "PreconditionedLoss":
        return PreconditionedLoss(self.family.at_resolution(resolution), self.cycles, self.form)

    def loss_terms(self, u: torch.Tensor, instances: torch.Tensor) -> dict[str, torch.Tensor]:
        u64 = u.detach().double()
        precondition, d = preconditioned_residual(self.family, u64, _float64(instances), self.cycles)
        dims = tuple(range(1, u.ndim))
        scale = (u64 - d).square().sum(dims)  # |u_h|², about: the value is 1/2 (relative error)²
        if self.form == "target":
            value = 0.5 * (u.double() - (u64 - d)).square().sum(dims)
        else:  # value 1/2 |d|², gradient H B d (B symmetric): a linear term in u carries it
            if precondition is None:
                raise ValueError("precondition_form 'loss' needs the torch V-cycle of the family's Hessian; "
                                 "this family gives B g from its assembled system: use 'target'")
            push = precondition.operator(precondition(d))
            value = 0.5 * d.square().sum(dims) + ((u.double() - u64) * push).sum(dims)
        return {"preconditioned": value / scale}

    def tile_loss_terms(self, raw: torch.Tensor, instances: torch.Tensor, tiling: object) -> dict[str, torch.Tensor]:
        raise NotImplementedError("train.loss = 'preconditioned' does not run under a domain split "
                                  "(parallel.domain): its V-cycle needs each sample whole")
