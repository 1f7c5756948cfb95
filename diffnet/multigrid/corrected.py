"""The problem a generator's fields come from under ``model.coarse_correction``: the family's fields corrected on a
coarse space, by one kept solve for a quadratic energy (:mod:`.coarse`) or by damped Newton for any other
(:mod:`.minimiser`), and for the latter the pull that keeps the network's own coarse part near its corrected one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from diffnet.backend.clock import PartClock
from diffnet.multigrid.coarse import coarse_correction, coarse_grid, forget_coarse_spaces
from diffnet.multigrid.hessian import fixed_nodes
from diffnet.multigrid.minimiser import coarse_minimiser

if TYPE_CHECKING:
    from diffnet.protocol.family import Family

__all__ = ["PULL", "CoarseCorrected"]


# The weight of the pull of the network's field towards its coarse minimiser (a nonlinear energy's correction only).
PULL = 1e-3


@dataclass(frozen=True)
class CoarseCorrected:
    """A problem whose fields are corrected on a coarse space (``model.coarse_correction``).

    ``problem`` gives the fields and the loss (the family, its preconditioned loss, a second stage);
    ``family`` the energy whose coarse minimiser is taken: with ``quadratic`` (its loss is) one closed-form solve,
    each instance's coarse space built once and kept; else damped Newton on the coarse space
    (:func:`diffnet.multigrid.minimiser.coarse_minimiser`); then ``smoothing`` symmetric Gauss-Seidel sweeps with the
    fine Hessian (:mod:`diffnet.multigrid.smoother`). Every member but ``field`` is the problem's.
    ``clock`` gathers the seconds of the correction's parts (forward and backward) and the Newton iterations.
    """

    problem: Family
    family: Family
    nodes: int
    clock: PartClock = field(default_factory=PartClock, compare=False)
    quadratic: bool = True
    smoothing: int = 0

    def __getattr__(self, name: str) -> object:
        if name in ("problem", "family", "nodes", "clock", "quadratic", "smoothing", "exact_parameter_gradients"):
            raise AttributeError(name)
        return getattr(self.problem, name)

    @property
    def exact_parameter_gradients(self) -> bool:
        """Whether the corrected fields have exact gradients in the instances: not through sweeps with a nonlinear
        energy's linearisation at its coarse minimiser, which moves with the instance (a third derivative: not built)."""
        return self.quadratic or not self.smoothing

    def coarse_text(self) -> str:
        """The coarse grid on the field's grid, as '17x17'."""
        return "x".join(map(str, coarse_grid(self.resolution, self.nodes)))

    def describe_correction(self) -> str:
        """One phrase for the run's banner and reports: 'an exact coarse correction on 17x17[, then 2 Gauss-Seidel
        sweeps]'."""
        sweeps = f", then {self.smoothing} Gauss-Seidel sweep{'s' if self.smoothing != 1 else ''}" if self.smoothing else ""
        return f"an exact coarse correction on {self.coarse_text()}{sweeps}"

    def field(self, raw: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        u = self.problem.field(raw, params)
        if self.quadratic:
            return coarse_correction(self.family, u, params, self.nodes, self.clock, quadratic=True,
                                     smoothing=self.smoothing)
        corrected = coarse_minimiser(self.family, u, params, self.nodes, self.clock, self.smoothing)
        if torch.is_grad_enabled() and u.requires_grad:
            corrected.uncorrected = u  # the network's own field, for the pull in :meth:`loss_terms`
        return corrected

    def loss_terms(self, u: torch.Tensor, params: torch.Tensor) -> dict[str, torch.Tensor]:
        """The problem's loss terms and, for a nonlinear energy in training, ``coarse``: :data:`PULL` times
        1/2 |ũ - sg(u)|² / |u|², the network's field pulled towards the corrected one. The backward pass of the
        correction removes the coarse part of every other term's gradient, so without it the network's coarse
        part is free, and drifted to 10x the field (the trained Neo-Hookean network, issue 66): harmless for a
        quadratic energy's one solve, 6 Newton iterations per pass for a nonlinear one. ũ - u lies in range(P):
        the pull acts where the other terms do not."""
        terms = self.problem.loss_terms(u, params)
        uncorrected = getattr(u, "uncorrected", None)
        if uncorrected is not None:
            dims = tuple(range(1, u.ndim))
            target = u.detach()
            terms["coarse"] = PULL * 0.5 * (uncorrected - target).square().sum(dims) / target.square().sum(dims)
        return terms

    def clear_caches(self) -> None:
        """Forget the kept coarse spaces and what the family keeps per instance: a timed pass then pays its own set-up."""
        forget_coarse_spaces()
        self.problem.clear_caches()

    def fixed_nodes(self, params: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The family's fixed nodes (the correction vanishes there, and probing its field would not tell)."""
        return fixed_nodes(self.family, params, dtype)

    def at_resolution(self, resolution: tuple[int, ...]) -> "CoarseCorrected":
        return CoarseCorrected(self.problem.at_resolution(resolution), self.family.at_resolution(resolution),
                               self.nodes, self.clock, self.quadratic, self.smoothing)

    def tile_loss_terms(self, raw: torch.Tensor, params: torch.Tensor, tiling: object) -> dict[str, torch.Tensor]:
        raise NotImplementedError("model.coarse_correction does not run under a domain split (parallel.domain): "
                                  "its coarse solve needs each sample whole")
