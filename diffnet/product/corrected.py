"""The family a generator's fields come from under ``model.coarse_correction``: the family's fields corrected on a
coarse space and swept, by what the family's loss is (:mod:`diffnet.protocol.loss`).

An :class:`~diffnet.protocol.loss.Energy`: its minimiser over ũ + range(P), one kept solve where it is quadratic
(:mod:`diffnet.multigrid.coarse`), damped Newton where not (:mod:`diffnet.multigrid.minimiser`), then symmetric
Gauss-Seidel sweeps with its Hessian (:mod:`diffnet.multigrid.sweeps`). A :class:`~diffnet.protocol.loss.Residual`: its
least-squares minimiser over ũ + range(P) by Gauss-Newton (:mod:`diffnet.multigrid.gauss_newton`), then symmetric
Gauss-Seidel sweeps on JᵀJ (:mod:`diffnet.multigrid.residual_sweeps`). Either way the correction and its sweeps
``cycles`` times: a two-grid iteration from the network's field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from diffnet.backend.clock import PartClock
from diffnet.multigrid.coarse import coarse_correction, coarse_grid, forget_coarse_spaces
from diffnet.multigrid.gauss_newton import coarse_least_squares
from diffnet.multigrid.hessian import fixed_nodes
from diffnet.multigrid.minimiser import coarse_minimiser
from diffnet.multigrid.residual_sweeps import residual_sweeps
from diffnet.protocol.wrapper import INSTANCE_MEMBERS, Wrapper

if TYPE_CHECKING:
    from diffnet.protocol.family import Family

__all__ = ["PULL", "CoarseCorrected"]


# The weight of the pull of the network's field towards its coarse minimiser (a nonlinear loss's correction only).
PULL = 1e-3


@dataclass(frozen=True)
class CoarseCorrected(Wrapper):
    """A family whose fields are corrected on a coarse space (``model.coarse_correction``) and swept.

    ``inner`` gives the fields and the loss that trains (the family, its preconditioned loss); ``family`` the family
    whose loss (:meth:`~diffnet.protocol.family.Family.loss`: an Energy or a Residual) is minimised on the coarse space
    and swept: the family itself, whatever wraps it in ``inner``. ``quadratic``: an energy's correction is one kept solve
    per instance (the energy is quadratic), else damped Newton. ``sweeps``: symmetric Gauss-Seidel sweeps after each
    correction (an energy's with its Hessian; a residual's on JᵀJ). ``cycles``: the correction and its sweeps that many
    times, a two-grid iteration from the network's field (the sweeps' rough error, left behind by the first
    correction, carries a smooth part the next correction removes, which no number of sweeps reaches: Poisson 256²,
    one cycle of 32 sweeps 2.2x the floor, three of 8 sweeps 1.00x, docs/results.md). Passes on what ``inner`` says of
    its instances and its inputs; its own: the field, the loss, the fixed nodes, the kept caches and the family on
    another grid. ``clock`` gathers the seconds of the correction's parts (forward and backward) and the Newton
    iterations.
    """

    wraps = "inner"
    passed_on = INSTANCE_MEMBERS | {"in_channels", "inputs", "hessian", "assembled_correction", "admissible"}
    # Its training loss carries the pull beside the inner loss: not an Energy or a Residual of its own.
    withheld = frozenset({"residual", "loss"})

    inner: Family
    family: Family
    nodes: int
    clock: PartClock = field(default_factory=PartClock, compare=False)
    quadratic: bool = True
    sweeps: int = 0
    cycles: int = 1

    def __post_init__(self) -> None:
        if self.cycles < 1 or (self.cycles > 1 and not self.sweeps):
            raise ValueError(f"cycles must be 1, or more with sweeps between the corrections (got {self.cycles} "
                             f"with {self.sweeps} sweeps)")
        if self.kind not in ("energy", "residual"):
            raise ValueError(f"a coarse correction needs an energy or a residual; the {self.family.name} family's loss "
                             f"is of kind {self.kind!r}")

    @property
    def kind(self) -> str:
        """The kind of the loss it corrects with: ``"energy"`` or ``"residual"``."""
        return self.family.loss().kind

    @property
    def exact_parameter_gradients(self) -> bool:
        """Whether the corrected fields have exact gradients in the instances: not through sweeps with a nonlinear
        energy's linearisation at its coarse minimiser, which moves with the instance (a third derivative: not built),
        nor through a residual's least-squares minimiser or its sweeps (its field's gradient is the network's only)."""
        return self.kind == "energy" and (self.quadratic or not self.sweeps)

    def coarse_text(self) -> str:
        """The coarse grid on the field's grid, as '17x17'."""
        return "x".join(map(str, coarse_grid(self.resolution, self.nodes)))

    def steps(self) -> list[str]:
        """The steps it applies, each a phrase: ['coarse correction on 17x17 (one kept solve)', '8 symmetric
        Gauss-Seidel sweeps', ...] (:class:`diffnet.product.product.Product` chains them)."""
        how = {"energy": "one kept solve" if self.quadratic else "damped Newton", "residual": "Gauss-Newton"}[self.kind]
        out = [f"coarse correction on {self.coarse_text()} ({how})"]
        if self.sweeps:
            on = "" if self.kind == "energy" else " on J^T J"
            out.append(f"{self.sweeps} symmetric Gauss-Seidel sweep{'s' if self.sweeps != 1 else ''}{on}")
        return out

    def _correct(self, u: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
        """One correction and its sweeps."""
        if self.kind == "residual":
            corrected = coarse_least_squares(self.family, u, instances, self.nodes, self.clock)
            return residual_sweeps(self.family, corrected, instances, self.sweeps, self.clock) if self.sweeps else \
                corrected
        if self.quadratic:
            return coarse_correction(self.family, u, instances, self.nodes, self.clock, quadratic=True,
                                     sweeps=self.sweeps)
        return coarse_minimiser(self.family, u, instances, self.nodes, self.clock, self.sweeps)

    def field(self, raw: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
        corrected = self.inner.field(raw, instances)
        for _ in range(self.cycles):
            corrected = self._correct(corrected, instances)
        return corrected

    def loss_terms(self, u: torch.Tensor, instances: torch.Tensor) -> dict[str, torch.Tensor]:
        """The inner family's loss terms of the corrected field."""
        return self.inner.loss_terms(u, instances)

    def output_loss_terms(self, raw: torch.Tensor, instances: torch.Tensor) -> dict[str, torch.Tensor]:
        """The inner loss terms of the corrected field and, for a loss that is not a quadratic energy, ``coarse``:
        :data:`PULL` times 1/2 |ũ - sg(u)|² / |u|², the network's own field ũ pulled towards the corrected one u. The
        backward pass of the correction removes the coarse part of every other term's gradient, so without it the
        network's coarse part is free, and drifted to 10x the field (the trained Neo-Hookean network): harmless for a
        quadratic energy's one solve, 6 Newton iterations per pass for a nonlinear one. ũ - u lies in range(P): the pull
        acts where the other terms do not."""
        own = self.inner.field(raw, instances)
        corrected = own
        for _ in range(self.cycles):
            corrected = self._correct(corrected, instances)
        terms = self.inner.loss_terms(corrected, instances)
        if not (self.kind == "energy" and self.quadratic) and own.requires_grad:
            dims = tuple(range(1, corrected.ndim))
            target = corrected.detach()
            terms["coarse"] = PULL * 0.5 * (own - target).square().sum(dims) / target.square().sum(dims)
        return terms

    def clear_caches(self) -> None:
        """Forget the kept coarse spaces and what the family keeps per instance: a timed pass then pays its own set-up."""
        forget_coarse_spaces()
        self.inner.clear_caches()

    def fixed_nodes(self, instances: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The family's fixed nodes (the correction vanishes there, and probing its field would not tell)."""
        return fixed_nodes(self.family, instances, dtype)

    def at_resolution(self, resolution: tuple[int, ...]) -> "CoarseCorrected":
        return CoarseCorrected(self.inner.at_resolution(resolution), self.family.at_resolution(resolution),
                               self.nodes, self.clock, self.quadratic, self.sweeps, self.cycles)

    def tile_loss_terms(self, raw: torch.Tensor, instances: torch.Tensor, tiling: object) -> dict[str, torch.Tensor]:
        raise NotImplementedError("model.coarse_correction does not run under a domain split (parallel.domain): "
                                  "its coarse solve needs each sample whole")
