"""Galerkin coarse levels: a coarse level of a multigrid schedule trained on the fine grid's
functional of its prolonged output, E_h(P u_H), instead of a rediscretised coarse problem."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from diffnet.generators.multilevel import prolong

if TYPE_CHECKING:
    from diffnet.protocol.family import Family

__all__ = ["GalerkinLoss"]


@dataclass(frozen=True)
class GalerkinLoss:
    """The problem a coarse generator trains on under ``multigrid.coarse_loss = "galerkin"``.

    The generator sees the coarse grid's inputs and emits a coarse field; that output is
    prolonged bilinearly to the fine grid (the nodal transfer the deepened stack uses, so
    the next level starts exactly where this one ends), the fine problem imposes its
    boundary conditions there, and the loss is the fine problem's. A coarse level so
    trained learns the fine grid's smooth components, not its own grid's discretisation
    error, which the finer levels would otherwise have to remove again.

    Parameters
    ----------
    coarse, fine
        The family's problems on the coarse level's grid and on the finest grid (any
        objects with ``inputs``, ``field``, ``loss_terms`` and ``resolution``).
    """

    coarse: Family
    fine: Family

    @property
    def name(self) -> str:
        return self.coarse.name

    @property
    def in_channels(self) -> int:
        return self.coarse.in_channels

    @property
    def resolution(self) -> tuple[int, int]:
        return tuple(self.fine.resolution)

    def inputs(self, params: torch.Tensor) -> torch.Tensor:
        return self.coarse.inputs(params)

    def has(self, capability: str) -> bool:
        """Only the fine family's ``domain`` carries over: the level's fields are the fine grid's."""
        return capability == "domain" and self.fine.has("domain")

    def domain(self, params: torch.Tensor) -> torch.Tensor:
        return self.fine.domain(params)

    def field(self, raw: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        """The fine field of a coarse output: P raw on the fine grid, the fine boundary conditions applied."""
        return self.fine.field(prolong(raw, self.fine.resolution), params)

    def loss_terms(self, u: torch.Tensor, params: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.fine.loss_terms(u, params)
