"""The product: a trained generator's fields as a user gets them, set up once and applied.

The network's field, then what finishes it (:class:`Finish`): the coarse correction and its sweeps, ``cycles``
times (:class:`~diffnet.product.corrected.CoarseCorrected`, by the kind of the family's loss), then the family's polish
(:class:`~diffnet.product.polished.Polished`). :class:`Product` is built in this one place (PyAMG's solver object is the
model: set up once, then applied, printing its own hierarchy): it applies itself (:meth:`Product.fields`,
:meth:`Product.differentiable`), states its chain (:meth:`Product.chain`, e.g. "U-Net -> coarse correction on 17x17
(one kept solve) -> 8 symmetric Gauss-Seidel sweeps, 3 times -> 2 Newton steps") and says what trains under it
(:func:`trained`, :meth:`Product.second_stage`). Only this module looks inside the wrappers and the two-stage
generator; every caller takes the product whole.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
import torch

from diffnet.backend.clock import NETWORK, PartClock
from diffnet.backend.layout import channels_last
from diffnet.generators.networks import describe_network
from diffnet.generators.two_stage import TwoStage
from diffnet.multigrid.hessian import is_quadratic
from diffnet.product.corrected import CoarseCorrected
from diffnet.product.polished import Polished

if TYPE_CHECKING:
    from diffnet.protocol.family import Family

__all__ = ["Finish", "Product", "first_network", "quadratic", "trained"]

# The largest grid side the quadratic probe runs on (0.1 s at 17^3, 32 s at 128^3).
_PROBE_SIDE = 17


@dataclass(frozen=True)
class Finish:
    """What finishes the network's field: ``coarse`` nodes a side of the coarse correction (0: none), ``sweeps`` after
    each correction, the correction and its sweeps ``cycles`` times, then ``polish`` of the family's polish steps
    (the engine's ``model.coarse_correction``, ``model.sweeps``, ``model.cycles``, ``model.polish``)."""

    coarse: int = 0
    sweeps: int = 0
    cycles: int = 1
    polish: int = 0

    def __post_init__(self) -> None:
        if self.coarse and self.coarse < 3:
            raise ValueError(f"a coarse correction needs at least 3 nodes a side, got {self.coarse}")
        if (self.sweeps or self.cycles > 1) and not self.coarse:
            raise ValueError("sweeps and cycles follow a coarse correction")
        if self.cycles < 1 or (self.cycles > 1 and not self.sweeps):
            raise ValueError(f"cycles must be 1, or more with sweeps (got {self.cycles} with {self.sweeps} sweeps)")
        if self.polish < 0:
            raise ValueError(f"polish: at least 0 steps, got {self.polish}")


def _centre(family: Family) -> torch.Tensor:
    """One instance, the middle of the training range, as a float64 batch of one."""
    low, high = family.parameters.bounds()
    return torch.as_tensor(0.5 * (low + high), dtype=torch.float64)[None]


@lru_cache(maxsize=32)
def _quadratic(family: Family) -> bool:
    small = family.at_resolution(tuple(min(n, _PROBE_SIDE) for n in family.resolution))
    return is_quadratic(small, _centre(small))


def quadratic(family: Family) -> bool:
    """Whether the family's loss is a quadratic energy (its coarse correction then one kept solve per instance): as its
    :class:`~diffnet.protocol.loss.Energy` declares, else probed once per family on at most 17 nodes a side."""
    if family.loss().kind != "energy":
        return False
    try:
        return _quadratic(family)
    except TypeError:  # a family that is not hashable: probed each time
        return _quadratic.__wrapped__(family)


def trained(fields: Family, family: Family, finish: Finish, clock: PartClock | None = None) -> Family:
    """What a first-stage generator trains on: ``fields`` (the family on a level's grid, or its preconditioned loss)
    with ``finish``'s coarse correction for ``family``'s loss on its fields, without the sweeps and cycles (inference
    only); ``fields`` itself without a correction."""
    if not finish.coarse:
        return fields
    return CoarseCorrected(fields, family, finish.coarse, clock if clock is not None else PartClock(), quadratic(family))


def first_network(model: torch.nn.Module) -> torch.nn.Module:
    """The first network of a generator: a two-stage generator's first, or the generator itself."""
    return model.first if isinstance(model, TwoStage) else model


def _finished(family: Family, finish: Finish, clock: PartClock) -> Family:
    """The family whose field is the product's: corrected and swept, then polished, as ``finish`` says."""
    out = family
    if finish.coarse:
        out = CoarseCorrected(family, family, finish.coarse, clock, quadratic(family), finish.sweeps, finish.cycles)
    if finish.polish:
        # Newton's polish of a nonlinear energy ends at the grid's minimiser: its adjoint is the gradient.
        newton = family.loss().kind == "energy" and family.has("differentiable") and not quadratic(family)
        out = Polished(out, finish.polish, clock, family if newton else None)
    return out


class Product:
    """A trained generator's fields, finished: built once (a family, the generator, :class:`Finish`), then applied.

    Parameters
    ----------
    family : Family
        The family on the product's grid (the run's).
    model : torch.nn.Module
        The generator: one network, or a :class:`~diffnet.generators.two_stage.TwoStage` of two.
    finish : Finish
        What finishes the network's field.
    clock : PartClock, optional
        Gathers the seconds of the product's parts (the network(s), the correction's parts, the sweeps, the polish).
    """

    def __init__(self, family: Family, model: torch.nn.Module, finish: Finish = Finish(),
                 clock: PartClock | None = None) -> None:
        self.family, self.model, self.finish = family, model, finish
        self.clock = clock if clock is not None else PartClock()
        if finish.polish and not family.has("polish"):
            raise ValueError(f"polish: the {family.name} family declares no polish step (capability 'polish')")
        self.finished = _finished(family, finish, self.clock)  # the family whose field makes the product's fields

    # -- what it is --------------------------------------------------------------------------------------------
    def steps(self) -> list[str]:
        """The chain's links, in order: the network(s), the correction, its sweeps and cycles, the polish."""
        two = isinstance(self.model, TwoStage)
        network = describe_network(self.model.first if two else self.model)
        out = [network + (f", then a second {describe_network(self.model.second.net)} fed its preconditioned "
                          f"residual B g ({self.model.cycles} V-cycle{'s' if self.model.cycles != 1 else ''})"
                          if two else "")]
        corrected = self.finished.inner if isinstance(self.finished, Polished) else self.finished
        if isinstance(corrected, CoarseCorrected):
            links = corrected.steps()
            if corrected.cycles > 1:
                links[-1] += f", {corrected.cycles} times"
            out += links
        if isinstance(self.finished, Polished):
            out.append(self.finished.steps_text())
        return out

    def chain(self) -> str:
        """The product as one line: 'U-Net -> coarse correction on 17x17 (one kept solve) -> 8 symmetric Gauss-Seidel
        sweeps, 3 times -> 2 Newton steps'."""
        return " -> ".join(self.steps())

    def name(self) -> str:
        """A short name for tables and plots: 'DiffNet', or 'DiffNet + coarse correction, 8 sweeps x3, 2 Newton
        steps'."""
        parts = []
        if self.finish.coarse:
            parts.append("coarse correction" + (f", {self.finish.sweeps} sweeps" if self.finish.sweeps else "")
                         + (f" x{self.finish.cycles}" if self.finish.cycles > 1 else ""))
        if isinstance(self.finished, Polished):
            parts.append(self.finished.steps_text())
        return "DiffNet" + (" + " + ", ".join(parts) if parts else "")

    @property
    def exact_parameter_gradients(self) -> bool:
        """Whether :meth:`differentiable` gives exact gradients in the instances: the family is ``differentiable``, and
        the product ends at a nonlinear energy's minimiser (Newton's polish: the adjoint), or no step without them
        follows the network (a polish of V-cycles; a residual's correction and sweeps; sweeps with a nonlinear energy's
        linearisation, which moves with the instance)."""
        return self.family.has("differentiable") and getattr(self.finished, "exact_parameter_gradients", True)

    def why_no_exact_gradients(self) -> str:
        """The step that has no exact gradient in the instances, as a phrase ('' where every step has)."""
        if isinstance(self.finished, Polished) and not self.finished.exact_parameter_gradients:
            return f"{self.finished.steps_text()}: numpy steps without gradients"
        if isinstance(self.finished, CoarseCorrected) and not self.finished.exact_parameter_gradients:
            return ("a residual's least-squares correction and sweeps" if self.finished.kind == "residual" else
                    "sweeps after a nonlinear energy's coarse minimiser: their linearisation moves with the instance")
        return "" if self.family.has("differentiable") else f"the {self.family.name} family is not 'differentiable'"

    # -- applied -------------------------------------------------------------------------------------------------
    def _pair(self) -> tuple[torch.nn.Module, Family]:
        """The network a forward pass runs and the family whose ``inputs`` and ``field`` it runs under."""
        if isinstance(self.model, TwoStage):
            return self.model.pair(self.finished, clock=self.clock, base=self.family)
        return self.model, self.finished

    @torch.inference_mode()
    def fields(self, instances: np.ndarray, batch: int = 16, tiling=None) -> np.ndarray:
        """The product's fields of ``instances`` (one row each), float64 numpy (S, [C,] *grid), by one forward pass per
        ``batch`` instances: the network's input in channels-last order (1.2-1.4x faster on the CPU here), its field
        finished, zero outside a cut domain. With a ``tiling`` (a domain split, collective over its ranks) the network
        runs on this rank's tile and every rank gets the whole fields."""
        from diffnet.grid.nodal import inside_only, node_data

        network, family = self._pair()
        network.eval()
        weight = next(network.parameters())
        out = []
        for start in range(0, len(instances), batch):
            p = torch.as_tensor(instances[start: start + batch], dtype=weight.dtype, device=weight.device)
            x = family.inputs(p)
            with self.clock.part(NETWORK, weight.device):
                if tiling is None:
                    raw = network(channels_last(x))
                else:
                    raw = tiling.gather(network(channels_last(tiling.local(x).contiguous()), tiling))
            out.append(family.field(raw, p).double().cpu().numpy())
        fields = np.concatenate(out, axis=0)
        if not self.family.has("domain"):
            return fields
        # Masked by the domain of the instances as the network saw them (in the weights' dtype): the family's
        # discretisation of each, already built, not a second one from the float64 rows.
        seen = torch.as_tensor(np.asarray(instances), dtype=weight.dtype).double().numpy()
        domain = node_data(self.family.domain(seen), len(seen), tuple(self.family.resolution),
                           f"{self.family.name}.domain(instances)")
        return inside_only(fields, domain)

    def differentiable(self, instances: torch.Tensor) -> torch.Tensor:
        """The fields of ``instances`` (a float64 tensor, one row each) as :meth:`fields` makes them, float64 and
        differentiable in ``instances`` (exactly where :attr:`exact_parameter_gradients`): through the network, the
        coarse correction and the sweeps (their exact sensitivities, :mod:`diffnet.multigrid.sensitivity`). One batch:
        the caller chunks. A family on a cut domain gets zero outside it (its geometry held)."""
        from diffnet.grid.nodal import inside_only, node_data

        network, family = self._pair()
        weight = next(network.parameters())
        with torch.inference_mode(False), torch.enable_grad():
            p = instances.to(device=weight.device, dtype=weight.dtype)
            u = family.field(network(channels_last(family.inputs(p))), p).double()
        if not self.family.has("domain"):
            return u
        rows = p.detach().double().cpu().numpy()
        domain = node_data(self.family.domain(rows), len(rows), tuple(self.family.resolution),
                           f"{self.family.name}.domain(instances)")
        return u * torch.as_tensor(inside_only(np.ones(tuple(u.shape)), domain), device=u.device)

    def clear_caches(self) -> None:
        """Forget what the product keeps per instance (coarse spaces, a cut domain's quadrature): the next fields pay
        their own set-up, as a timed comparison needs."""
        self.finished.clear_caches()

    # -- its parts -----------------------------------------------------------------------------------------------
    def first_stage(self) -> "Product | None":
        """A two-stage generator's first network alone, finished alike (None for one network)."""
        if not isinstance(self.model, TwoStage):
            return None
        return Product(self.family, self.model.first, self.finish, self.clock)

    def without_polish(self) -> "Product":
        """The same product without its polish steps (the field they start from)."""
        return self if not self.finish.polish else Product(self.family, self.model, replace(self.finish, polish=0),
                                                           self.clock)

    def second_stage(self, loss: Family) -> tuple[torch.nn.Module, Family]:
        """The second network of a two-stage generator and the family it trains under: the product's fields as u1,
        trained on ``loss`` (the finest level's trained family)."""
        if not isinstance(self.model, TwoStage):
            raise ValueError("a second stage needs a two-stage generator (train.second_stage_epochs)")
        return self.model.pair(self.finished, loss, self.clock, base=self.family)

    def __repr__(self) -> str:
        return f"Product({self.family.name} {list(self.family.resolution)}: {self.chain()})"
