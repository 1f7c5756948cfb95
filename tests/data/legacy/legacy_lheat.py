"""A cut-domain family as a user wrote it against the protocol before 2026-11-26, and two ports of it (issue 64,
item 7): heat in the unit square less a disc (the instance: its centre and radius), conductivity k for x >= 0.6
and 1 elsewhere, u = 0 on x = 0, a unit flux on y = 0, the hole insulated.

``LHeat`` overrides the private hooks ImmersedFamily read then (``_nu``, ``_system_arguments``, ``_box``,
``_input_channels``, ``_body_fitted``) beside its own ``discretise`` and ``loss_terms``; ``LHeatPartial`` is the port
that renamed only what raised (``_box`` to ``box_conditions``, ``_body_fitted`` to ``body_fitted``) and left ``_nu``,
which its ``loss_terms`` still reads while the engine's grid solve reads ``coefficient`` (1): trained, its floor
would be another problem than its loss; ``LHeatNoTruth`` is the current protocol without ``body_fitted``.
"""

from dataclasses import dataclass

import numpy as np
import torch

from diffnet import Box, BoxBoundary, Disc, Family, ImmersedFamily, ParameterSpec, Side, option, positive
from diffnet.discretisation.immersed import immersed, immersed_energy
from diffnet.instances.cutcell import cut_cells


@dataclass(frozen=True)
class _Heat:
    """What the three share: the keys, the instance, the shape and the conductivity (mixed in first)."""

    resolution: tuple[int, ...]
    k: float = option(5.0, "conductivity for x >= 0.6 (1 elsewhere)", positive)
    truth_refine: int = option(2, "the truth's mesh is this many times finer than the grid")

    name = "l_heat"
    in_channels = 3  # the signed distance, y, x
    cut_condition = Side("flux", 0.0)

    @property
    def parameters(self) -> ParameterSpec:
        return ParameterSpec("hole", (3,), (0.35, 0.35, 0.08), (0.65, 0.65, 0.15), names=("cx", "cy", "r"))

    def shape(self, hole: np.ndarray):
        cx, cy, r = hole
        return Box((-1.0, -1.0), (2.0, 2.0)) - Disc((cx, cy), r)

    def conductivity(self) -> np.ndarray:
        x = np.linspace(0.0, 1.0, self.resolution[1])
        return np.broadcast_to(np.where(x >= 0.6, self.k, 1.0), self.resolution).copy()


@dataclass(frozen=True)
class LHeat(_Heat, ImmersedFamily, Family):
    """The protocol before 2026-11-26: the private hooks."""

    def discretise(self, hole: np.ndarray):
        return immersed(cut_cells(self.shape(hole), self.resolution), self._nu(hole), dirichlet=False)

    def _nu(self, hole: np.ndarray) -> np.ndarray:
        return self.conductivity()

    def _system_arguments(self, hole: np.ndarray) -> dict:
        return {}

    def _box(self, hole: np.ndarray):
        box = BoxBoundary.of({"x0": "u=0", "x1": "flux=0", "y0": "flux=1", "y1": "flux=0"}, dims=2)
        fixed, values = box.fixed(self.resolution)
        return fixed, values, box.flux_load(self.resolution)

    def _input_channels(self, hole: torch.Tensor, sdf: torch.Tensor) -> list[torch.Tensor]:
        return [sdf]

    def _body_fitted(self, hole: np.ndarray, h: float) -> np.ndarray:
        raise NotImplementedError("the body-fitted solve of this instance")

    def loss_terms(self, u: torch.Tensor, hole: torch.Tensor) -> dict[str, torch.Tensor]:
        rows = hole.detach().double().cpu().numpy()
        nu = torch.as_tensor(np.stack([self._nu(p) for p in rows]), dtype=u.dtype)
        return {"energy": immersed_energy(u, nu, self._data(hole))}


@dataclass(frozen=True)
class LHeatPartial(_Heat, ImmersedFamily, Family):
    """The port that renamed only what raised: ``_box`` to ``box_conditions``, ``_body_fitted`` to ``body_fitted``;
    ``_nu`` left, and read by its own ``discretise`` and ``loss_terms``."""

    box_conditions = BoxBoundary.of({"x0": "u=0", "x1": "flux=0", "y0": "flux=1", "y1": "flux=0"}, dims=2)

    def discretise(self, hole: np.ndarray):
        return immersed(cut_cells(self.shape(hole), self.resolution), self._nu(hole), dirichlet=False)

    def _nu(self, hole: np.ndarray) -> np.ndarray:
        return self.conductivity()

    def body_fitted(self, hole: np.ndarray, h: float) -> np.ndarray:
        raise NotImplementedError("the body-fitted solve of this instance")

    def loss_terms(self, u: torch.Tensor, hole: torch.Tensor) -> dict[str, torch.Tensor]:
        rows = hole.detach().double().cpu().numpy()
        nu = torch.as_tensor(np.stack([self._nu(p) for p in rows]), dtype=u.dtype)
        return {"energy": immersed_energy(u, nu, self._data(hole))}


@dataclass(frozen=True)
class LHeatNoTruth(_Heat, ImmersedFamily, Family):
    """The current protocol, every member but ``body_fitted``: it declares ``reference`` (the truth included)."""

    box_conditions = BoxBoundary.of({"x0": "u=0", "x1": "flux=0", "y0": "flux=1", "y1": "flux=0"}, dims=2)

    def coefficient(self, hole: np.ndarray) -> np.ndarray:
        return self.conductivity()
