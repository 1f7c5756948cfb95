"""Galerkin coarse levels: a coarse level of a multigrid schedule trained on the fine grid's
functional of its prolonged output, E_h(P u_H), instead of a rediscretised coarse problem."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from diffnet.generators.multilevel import prolong
from diffnet.protocol.wrapper import INSTANCE_MEMBERS, Wrapper

if TYPE_CHECKING:
    from diffnet.protocol.family import Family

__all__ = ["GalerkinLoss"]


@dataclass(frozen=True)
class GalerkinLoss(Wrapper):
    """The family a coarse generator trains on under ``multigrid.coarse_loss = "galerkin"``.

    The generator sees the coarse grid's inputs and emits a coarse field; that output is
    prolonged bilinearly to the fine grid (the nodal transfer the deepened stack uses, so
    the next level starts exactly where this one ends), the fine family imposes its
    boundary conditions there, and the loss is the fine family's. A coarse level so
    trained learns the fine grid's smooth components, not its own grid's discretisation
    error, which the finer levels would otherwise have to remove again.

    Parameters
    ----------
    coarse, fine
        The family on the coarse level's grid and on the finest grid.

    Passes on the fine family's name, grid and unknowns; its own: the coarse inputs, the fine field of the coarse
    output, the fine loss, and of the capabilities only ``domain``; withholds the rest (a level's family is trained
    on, never solved, evaluated or split).
    """

    wraps = "fine"
    passed_on = frozenset({"name", "resolution", "dims", "unknowns"})
    withheld = INSTANCE_MEMBERS - passed_on - {"has", "domain"} | {
        "clear_caches", "hessian", "assembled_correction", "fixed_nodes", "admissible", "at_resolution",
        "tile_loss_terms", "residual", "loss"}

    coarse: Family
    fine: Family

    @property
    def in_channels(self) -> int:
        return self.coarse.in_channels

    def inputs(self, instances: torch.Tensor) -> torch.Tensor:
        return self.coarse.inputs(instances)

    def has(self, capability: str) -> bool:
        """Only the fine family's ``domain`` carries over: the level's fields are the fine grid's."""
        return capability == "domain" and self.fine.has("domain")

    def domain(self, instances: torch.Tensor) -> torch.Tensor:
        return self.fine.domain(instances)

    def field(self, raw: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
        """The fine field of a coarse output: P raw on the fine grid, the fine boundary conditions applied."""
        return self.fine.field(prolong(raw, self.fine.resolution), instances)

    def loss_terms(self, u: torch.Tensor, instances: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.fine.loss_terms(u, instances)
