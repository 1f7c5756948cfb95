"""The family a generator's fields come from under ``model.coarse_correction``: the family's fields corrected on a
coarse space, by one kept solve for a quadratic energy (:mod:`.coarse`), by damped Newton for any other
(:mod:`.minimiser`) or by Gauss–Newton for a sum of squared residuals (:mod:`.gauss_newton`), and for the latter two
the pull that keeps the network's own coarse part near its corrected one.
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
from diffnet.protocol.wrapper import INSTANCE_MEMBERS, Wrapper

if TYPE_CHECKING:
    from diffnet.protocol.family import Family

__all__ = ["PULL", "CoarseCorrected"]


# The weight of the pull of the network's field towards its coarse minimiser (a nonlinear loss's correction only).
PULL = 1e-3


@dataclass(frozen=True)
class CoarseCorrected(Wrapper):
    """A family whose fields are corrected on a coarse space (``model.coarse_correction``).

    ``inner`` gives the fields and the loss (the family, its preconditioned loss, a second stage);
    ``energy`` the family whose energy's coarse minimiser is taken (the family itself, whatever wraps it in ``inner``):
    with ``quadratic`` (its loss is) one closed-form solve, each instance's coarse space built once and kept; else
    damped Newton on the coarse space (:func:`diffnet.multigrid.minimiser.coarse_minimiser`); with ``least_squares``
    (a family whose loss is squared residuals, without a Hessian stencil) Gauss–Newton on it
    (:func:`diffnet.multigrid.gauss_newton.coarse_least_squares`, no sweeps); then ``smoothing``
    symmetric Gauss-Seidel sweeps with the fine Hessian (:mod:`diffnet.multigrid.smoother`); the correction and its
    sweeps ``cycles`` times, a two-grid iteration from the network's field (the sweeps' rough error, left behind by
    the first correction, carries a smooth part the next correction removes, which no number of sweeps reaches:
    Poisson 256², one cycle of 32 sweeps 2.2x the floor, three of 8 sweeps 1.00x, docs/results.md). Passes on what ``inner``
    says of its instances, its inputs and its Hessian; its own: the field, the loss, the fixed nodes, the kept caches
    and the family on another grid. ``clock`` gathers the seconds of the correction's parts (forward and backward)
    and the Newton iterations.
    """

    wraps = "inner"
    passed_on = INSTANCE_MEMBERS | {"in_channels", "inputs", "hessian", "assembled_correction", "admissible"}
    withheld = frozenset({"residual"})  # its loss carries the pull beside the residual's squares

    inner: Family
    energy: Family
    nodes: int
    clock: PartClock = field(default_factory=PartClock, compare=False)
    quadratic: bool = True
    smoothing: int = 0
    least_squares: bool = False
    cycles: int = 1

    def __post_init__(self) -> None:
        if self.least_squares and (self.quadratic or self.smoothing):
            raise ValueError("a least-squares coarse correction is neither a quadratic energy's nor followed by sweeps")
        if self.cycles < 1 or (self.cycles > 1 and not self.smoothing):
            raise ValueError(f"cycles must be 1, or more with sweeps between the corrections (got {self.cycles} "
                             f"with {self.smoothing} sweeps)")

    @property
    def exact_parameter_gradients(self) -> bool:
        """Whether the corrected fields have exact gradients in the instances: not through sweeps with a nonlinear
        energy's linearisation at its coarse minimiser, which moves with the instance (a third derivative: not built),
        nor through a least-squares minimiser (its field's gradient is the network's only)."""
        return not self.least_squares and (self.quadratic or not self.smoothing)

    def coarse_text(self) -> str:
        """The coarse grid on the field's grid, as '17x17'."""
        return "x".join(map(str, coarse_grid(self.resolution, self.nodes)))

    def describe_correction(self) -> str:
        """One phrase for the run's banner and reports: 'an exact coarse correction on 17x17[, then 2 Gauss-Seidel
        sweeps][, 3 times]'."""
        sweeps = f", then {self.smoothing} Gauss-Seidel sweep{'s' if self.smoothing != 1 else ''}" if self.smoothing else ""
        how = " (least squares, Gauss-Newton)" if self.least_squares else ""
        times = f", {self.cycles} times" if self.cycles > 1 else ""
        return f"an exact coarse correction on {self.coarse_text()}{how}{sweeps}{times}"

    def field(self, raw: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
        u = self.inner.field(raw, instances)
        if self.least_squares:
            corrected = coarse_least_squares(self.energy, u, instances, self.nodes, self.clock)
        else:
            corrected = u
            for _ in range(self.cycles):
                corrected = (coarse_correction(self.energy, corrected, instances, self.nodes, self.clock, quadratic=True,
                                               smoothing=self.smoothing) if self.quadratic else
                             coarse_minimiser(self.energy, corrected, instances, self.nodes, self.clock, self.smoothing))
        if not self.quadratic and torch.is_grad_enabled() and u.requires_grad:
            corrected.uncorrected = u  # the network's own field, for the pull in :meth:`loss_terms`
        return corrected

    def loss_terms(self, u: torch.Tensor, instances: torch.Tensor) -> dict[str, torch.Tensor]:
        """The inner family's loss terms and, for a nonlinear loss in training, ``coarse``: :data:`PULL` times
        1/2 |ũ - sg(u)|² / |u|², the network's field pulled towards the corrected one. The backward pass of the
        correction removes the coarse part of every other term's gradient, so without it the network's coarse
        part is free, and drifted to 10x the field (the trained Neo-Hookean network, issue 66): harmless for a
        quadratic energy's one solve, 6 Newton iterations per pass for a nonlinear one. ũ - u lies in range(P):
        the pull acts where the other terms do not."""
        terms = self.inner.loss_terms(u, instances)
        uncorrected = getattr(u, "uncorrected", None)
        if uncorrected is not None:
            dims = tuple(range(1, u.ndim))
            target = u.detach()
            terms["coarse"] = PULL * 0.5 * (uncorrected - target).square().sum(dims) / target.square().sum(dims)
        return terms

    def clear_caches(self) -> None:
        """Forget the kept coarse spaces and what the family keeps per instance: a timed pass then pays its own set-up."""
        forget_coarse_spaces()
        self.inner.clear_caches()

    def fixed_nodes(self, instances: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The family's fixed nodes (the correction vanishes there, and probing its field would not tell)."""
        return fixed_nodes(self.energy, instances, dtype)

    def at_resolution(self, resolution: tuple[int, ...]) -> "CoarseCorrected":
        return CoarseCorrected(self.inner.at_resolution(resolution), self.energy.at_resolution(resolution),
                               self.nodes, self.clock, self.quadratic, self.smoothing, self.least_squares, self.cycles)

    def tile_loss_terms(self, raw: torch.Tensor, instances: torch.Tensor, tiling: object) -> dict[str, torch.Tensor]:
        raise NotImplementedError("model.coarse_correction does not run under a domain split (parallel.domain): "
                                  "its coarse solve needs each sample whole")
