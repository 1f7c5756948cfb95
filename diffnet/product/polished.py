"""The product finished classically: its fields then k iterations of the family's polish step (``model.polish``).

A family with the ``polish`` capability names a classical iteration that improves a field it is given (Newton sweeps
of Burgers' implicit scheme, V-cycles of a Q1 energy's Hessian). With ``model.polish = k`` every command that runs a
trained generator gives the network's field (corrected where so configured) after k of them: a hybrid, reported as
the run's product in its evaluation, ``compare``, ``infer`` and the Python API. Nothing trains through it: the polish
is the family's numpy code (the first stage trains without it; a second stage, which trains through the product, is
refused with it).

**Gradients in the instances.** A nonlinear energy's polish is Newton's method, which ends at the grid's minimiser
u_h(p) whatever field it starts from (one or two steps from the network's: quadratic convergence). Its derivative
in p is then that of u_h, by the implicit function theorem: the adjoint, one sparse direct solve with the Hessian at
the polished field (:func:`diffnet.multigrid.sensitivity.minimiser_vjp`, the classical route's own), whatever came
before it (the network, its correction and sweeps drop out). Inverse problems take these instead of central
differences. A quadratic energy's polish (V-cycles, each a fixed contraction) and a residual's have none: there the
product is for inference only, and inverse problems difference it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from diffnet.backend.clock import POLISH, PartClock
from diffnet.protocol.wrapper import INSTANCE_MEMBERS, Wrapper

if TYPE_CHECKING:
    from diffnet.protocol.family import Family

__all__ = ["AtMinimiser", "Polished"]


class AtMinimiser(torch.autograd.Function):
    """The polished fields (S, [C,] *grid) forward, as the grid's minimiser u_h(p) of ``energy``'s loss; backward the
    adjoint in the instances (:func:`~diffnet.multigrid.sensitivity.minimiser_vjp`)."""

    @staticmethod
    def forward(ctx, instances: torch.Tensor, fields: torch.Tensor, energy: "Family") -> torch.Tensor:
        ctx.energy = energy
        ctx.save_for_backward(instances.detach(), fields.detach())
        return fields.detach().clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        from diffnet.multigrid.sensitivity import minimiser_vjp

        instances, fields = ctx.saved_tensors
        return minimiser_vjp(ctx.energy, fields, instances.double(), grad).to(instances.dtype), None, None


@dataclass(frozen=True)
class Polished(Wrapper):
    """``inner``'s fields then ``steps`` iterations of its family's ``polish`` (float64, on the host).

    Passes on everything but the field and the family on another grid: the loss, the Hessian, the inputs are those of
    the field it finishes. ``clock`` gathers the polish's seconds (part ``polish``).
    """

    wraps = "inner"
    passed_on = INSTANCE_MEMBERS | {"in_channels", "inputs", "hessian", "assembled_correction", "admissible",
                                    "fixed_nodes", "clear_caches", "loss_terms", "residual"}
    withheld = frozenset({"loss", "output_loss_terms"})  # nothing trains under it

    inner: Family
    steps: int
    clock: PartClock = field(default_factory=PartClock, compare=False)
    energy: "Family | None" = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"polish: at least one step (got {self.steps})")
        if not self.inner.has("polish"):
            raise ValueError(f"polish: the {self.inner.name} family declares no polish step (capability 'polish')")

    @property
    def exact_parameter_gradients(self) -> bool:
        """Whether the polished fields have gradients in the instances: the adjoint of a nonlinear energy's minimiser,
        which Newton's polish ends at."""
        return self.energy is not None

    def steps_text(self) -> str:
        """'2 Newton steps' (the family's ``polish_step``), for the product's chain."""
        return f"{self.steps} {self.inner.polish_step}{'s' if self.steps != 1 else ''}"

    def field(self, raw: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
        wanted = torch.is_grad_enabled() and (raw.requires_grad or instances.requires_grad)
        if wanted and self.energy is None:
            # Silently detaching would hand back a field whose gradient is the zero's.
            raise RuntimeError("model.polish: this polish step has no gradient (not Newton on a nonlinear energy); "
                               "the product is for inference only (take central differences for gradients)")
        with torch.no_grad():  # the minimiser's gradient does not depend on where the polish starts
            u = self.inner.field(raw.detach(), instances.detach())
        # A family's polish may differentiate its own residual (Burgers' Newton): outside the caller's inference mode.
        with self.clock.part(POLISH), torch.inference_mode(False), torch.enable_grad():
            polished = self.inner.polish(instances.detach().double().cpu().numpy(),
                                         u.detach().double().cpu().numpy(), self.steps)
        out = torch.as_tensor(polished, dtype=torch.float64, device=u.device)
        return AtMinimiser.apply(instances, out, self.energy) if wanted else out

    def at_resolution(self, resolution: tuple[int, ...]) -> "Polished":
        return Polished(self.inner.at_resolution(resolution), self.steps, self.clock,
                        self.energy.at_resolution(resolution) if self.energy is not None else None)

    def tile_loss_terms(self, raw: torch.Tensor, instances: torch.Tensor, tiling: object) -> dict[str, torch.Tensor]:
        raise NotImplementedError("model.polish is for inference only: nothing trains under it")
