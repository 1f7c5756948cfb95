"""The loss a family trains on, as an object of its own: an :class:`Energy` or a :class:`Residual`, and what each kind
lets the product build on it.

A family gives its loss by :meth:`~diffnet.protocol.family.Family.loss`. Its *kind* decides which steps can finish
the network's field and which the configuration refuses (:data:`STEPS`, read by the engine's checks and the product,
declared once here):

======================  ===============================================  ==============================================
step                    :class:`Energy` E(u)                             :class:`Residual` L(u) = |r(u)|²
======================  ===============================================  ==============================================
coarse correction       E's minimiser over ũ + range(P): one solve       the least-squares minimiser over ũ + range(P),
                        (quadratic E), else damped Newton                Gauss–Newton
sweeps                  symmetric Gauss–Seidel with E's Hessian          symmetric Gauss–Seidel on JᵀJ (each node's
                                                                         Gauss–Newton step, colour by colour)
preconditioned loss,    V-cycles of E's Hessian (a 3^d-point stencil)    (JᵀJ is not a 3^d stencil: refused)
second stage, estimate
the norm it reports     the energy norm |e|_H                            the Gauss–Newton norm |J e|
======================  ===============================================  ==============================================

A plain :class:`Loss` (terms only, e.g. a central residual whose squares are not one per node) trains, and none of
these steps apply. What a loss declares is checked against the loss itself before training (its Hessian stencil
against autograd's Hessian-vector product, its residual's squares against its terms:
:func:`diffnet.multigrid.hessian.stencil_mismatch`, ``deepfusion.analysis.selfcheck``).

Imports nothing of diffnet: the members are the family's own torch functions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

__all__ = ["Energy", "KINDS", "Loss", "Residual", "STEPS", "refusal"]

Terms = Callable[[torch.Tensor, torch.Tensor], Mapping[str, torch.Tensor]]

#: step -> (what it is called, {kind: what the step is for that kind}); a kind not named does not admit the step.
STEPS: dict[str, tuple[str, dict[str, str]]] = {
    "coarse_correction": ("the coarse correction", {
        "energy": "its minimiser over u~ + range(P), one solve if quadratic, else damped Newton",
        "residual": "its least-squares minimiser over u~ + range(P), Gauss-Newton"}),
    "sweeps": ("sweeps", {"energy": "symmetric Gauss-Seidel with its Hessian",
                          "residual": "symmetric Gauss-Seidel on its Gauss-Newton operator J^T J"}),
    "preconditioned": ("the preconditioned loss", {"energy": "V-cycles of its Hessian, a 3^d-point stencil"}),
    "second_stage": ("a second stage", {"energy": "fed V-cycles of its Hessian, a 3^d-point stencil"}),
}

#: each kind, as messages name it
KINDS = {"energy": "an energy (diffnet.Energy)", "residual": "a residual's squares (diffnet.Residual)",
         "loss": "a loss of no declared kind (neither diffnet.Energy nor diffnet.Residual)"}


@dataclass(frozen=True)
class Loss:
    """A loss of no declared kind: per-sample ``terms(u, instances) -> {name: (S,)}`` whose sum trains the network,
    and nothing known of its structure (no coarse correction, sweeps or preconditioner).

    Attributes
    ----------
    terms : callable
        ``terms(u, instances)``: the per-sample loss terms (usually the family's ``loss_terms``).
    """

    terms: Terms
    kind: ClassVar[str] = "loss"

    def value(self, u: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
        """The summed terms per sample, (S,)."""
        return sum(self.terms(u, instances).values())

    def describe(self) -> str:
        """What the loss is, for banners and reports."""
        return KINDS[self.kind]


@dataclass(frozen=True)
class Energy(Loss):
    """An energy E(u) = sum of ``terms``, minimised by the grid's solution, whose Hessian couples each node to its
    3^d neighbours only (a Q1 element energy, linear or not).

    Attributes
    ----------
    hessian : callable, optional
        ``hessian(u, instances)``: E's Hessian at u as a (S, 3^d, *grid) stencil, (S, C, C, 3^d, *grid) for C unknowns;
        default: read off the terms by 3^d Hessian-vector probes (:func:`diffnet.multigrid.hessian.probe_stencil`).
        Either way checked against autograd's Hessian-vector product before training.
    quadratic : bool, optional
        Whether E is quadratic in u (its coarse correction is then one kept solve); default: probed (the Hessian at
        two fields).
    assembled_correction : callable, optional
        ``assembled_correction(u, instances, cycles)``: B g itself (S, *grid), where the torch V-cycle of the stencil
        does not converge (a cut domain's assembled multigrid; the preconditioned loss's ``target`` form only).
    admissible : callable, optional
        ``admissible(u, instances) -> (S,) bool``: the fields E admits (a solid: det F > 0); a coarse minimiser's line
        search keeps an admissible field so. Default: every field.
    """

    hessian: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    quadratic: bool | None = None
    assembled_correction: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor] | None = None
    admissible: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    kind: ClassVar[str] = "energy"


@dataclass(frozen=True)
class Residual(Loss):
    """A loss that is the squares of one residual per node, L(u) = |r(u)|², zero at the grid's solution.

    Attributes
    ----------
    residual : callable
        ``residual(u, instances)``: (S, *grid) at fields u (S, *grid), (S, C, *grid) for C unknowns: zero at the fixed
        nodes, scaled so that one sample's squares sum to its summed ``terms`` (checked before training); a torch
        function of u with forward-mode derivatives (``torch.autograd.forward_ad``) and local: a node's value reaches
        the residual a few nodes away, not across the grid (measured once per grid: its *reach*).
    """

    residual: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    kind: ClassVar[str] = "residual"

    def __post_init__(self) -> None:
        if not callable(self.residual):
            raise TypeError(f"Residual needs a residual(u, instances) function, got {self.residual!r:.60}")


def refusal(loss: Loss, step: str) -> str | None:
    """Why ``loss`` does not admit ``step`` (a key of :data:`STEPS`), one clause naming its kind and the kinds that
    do ('its loss is a residual's squares (diffnet.Residual), and a second stage needs an energy (diffnet.Energy:
    fed V-cycles of its Hessian, ...)'); None when it does."""
    name, kinds = STEPS[step]
    if loss.kind in kinds:
        return None
    needs = " or ".join(f"{KINDS[k][:-1]}: {what})" for k, what in kinds.items())
    return f"its loss is {KINDS[loss.kind]}, and {name} needs {needs}"
