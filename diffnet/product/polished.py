"""The product finished classically: its fields then k iterations of the family's polish step (``model.polish``).

A family with the ``polish`` capability names a classical iteration that improves a field it is given (Newton sweeps
of Burgers' implicit scheme, V-cycles of a Q1 energy's Hessian). With ``model.polish = k`` every command that runs a
trained generator gives the network's field (corrected where so configured) after k of them: a hybrid, reported as
the run's product in its evaluation, ``compare``, ``infer`` and the Python API. Inference only, and without
gradients: the polish is the family's numpy code (the first stage trains without it; a second stage, which trains
through the product, is refused with it; inverse problems take central differences).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from diffnet.backend.clock import POLISH, PartClock
from diffnet.protocol.wrapper import INSTANCE_MEMBERS, Wrapper

if TYPE_CHECKING:
    from diffnet.protocol.family import Family

__all__ = ["Polished"]


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

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"polish: at least one step (got {self.steps})")
        if not self.inner.has("polish"):
            raise ValueError(f"polish: the {self.inner.name} family declares no polish step (capability 'polish')")

    #: The polish is the family's numpy iteration: nothing flows back through it.
    exact_parameter_gradients = False

    def steps_text(self) -> str:
        """'2 Newton steps' (the family's ``polish_step``), for the product's chain."""
        return f"{self.steps} {self.inner.polish_step}{'s' if self.steps != 1 else ''}"

    def field(self, raw: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
        u = self.inner.field(raw, instances)
        if torch.is_grad_enabled() and u.requires_grad:
            # Silently detaching would hand back a field whose gradient is the zero's.
            raise RuntimeError("model.polish: the polish step has no gradient; the product is for inference only "
                               "(train the first stage without it, take central differences for gradients)")
        # A family's polish may differentiate its own residual (Burgers' Newton): outside the caller's inference mode.
        with self.clock.part(POLISH), torch.inference_mode(False), torch.enable_grad():
            polished = self.inner.polish(instances.detach().double().cpu().numpy(),
                                         u.detach().double().cpu().numpy(), self.steps)
        return torch.as_tensor(polished, dtype=torch.float64, device=u.device)

    def at_resolution(self, resolution: tuple[int, ...]) -> "Polished":
        return Polished(self.inner.at_resolution(resolution), self.steps, self.clock)

    def tile_loss_terms(self, raw: torch.Tensor, instances: torch.Tensor, tiling: object) -> dict[str, torch.Tensor]:
        raise NotImplementedError("model.polish is for inference only: nothing trains under it")
