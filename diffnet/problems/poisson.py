"""Poisson family -div(nu grad u) = 0 over Karhunen-Loève diffusivities in any dimension: u = 1 at x = 0,
u = 0 at x = 1 (x the last axis), zero flux on the other sides."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from diffnet.energy import dirichlet_energy, dirichlet_stencil
from diffnet.kl import kl_modes, kl_roots
from diffnet.problems.kl_family import KLFamily, KLOptions
from diffnet.solvers.fem import FEMSystem, poisson_system
from diffnet.tiling import axis_coordinates, element_sum, zero_boundary

__all__ = ["kl_roots", "kl_modes", "KLOptions", "KLFamily", "PoissonProblem"]


@dataclass(frozen=True)
class PoissonProblem(KLFamily):
    """-div(nu grad u) = 0 on [0,1]^d; u = 1 at x = 0, u = 0 at x = 1, zero flux on the other sides.

    The loss is the Q1 energy J(u) = integral 1/2 nu |grad u|^2 of the network's field,
    divided per sample by the energy of the lift u = 1 - x (that is 1/2 integral nu):
    over a in [-3, 3]^6 nu spans about seven decades, and without the division the
    samples with large nu would own the gradient.
    """

    name = "poisson"
    Options = KLOptions

    def _energy(self, u: torch.Tensor, nu: torch.Tensor) -> torch.Tensor:
        """The Q1 energy per sample."""
        return dirichlet_energy(u, nu, *self.spacing)

    def _fem_system(self, nu: np.ndarray) -> FEMSystem:
        return poisson_system(nu)

    def hessian(self, u: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        """The Hessian of :meth:`loss_terms` in u: the stiffness stencil divided by the lift's energy."""
        nu = self.diffusivity(params.to(u.dtype))
        scale = self._energy(self._lift(u), nu).reshape(-1, *([1] * u.ndim))
        return dirichlet_stencil(nu, *self.spacing) / scale

    def field(self, raw: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        """u = (1 - x) + M * N, with the mask M zero on the Dirichlet planes x = 0, 1."""
        x = torch.linspace(0.0, 1.0, self.resolution[-1], dtype=raw.dtype, device=raw.device)
        return (1.0 - x) + F.pad(raw[:, 0, ..., 1:-1], (1, 1))

    def loss_terms(self, u: torch.Tensor, params: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-sample energy divided by that of the lift u = 1 - x (1/2 integral of nu), shape (S,)."""
        nu = self.diffusivity(params.to(u.dtype))
        return {"energy": self._energy(u, nu) / self._energy(self._lift(u), nu)}

    def _lift(self, u: torch.Tensor) -> torch.Tensor:
        """The lift 1 - x on u's grid, dtype and device, in u's shape."""
        return (1.0 - torch.linspace(0.0, 1.0, self.resolution[-1], dtype=u.dtype, device=u.device)).expand_as(u)

    def tile_loss_terms(self, raw: torch.Tensor, params: torch.Tensor, tiling) -> dict[str, torch.Tensor]:
        """:meth:`loss_terms` under a domain split: the tile's field, the energies of its own elements
        summed over the tiles."""
        axis = len(self.resolution) - 1
        x = axis_coordinates(tiling, axis, raw)
        u = (1.0 - x) + zero_boundary(raw[:, 0], tiling, [axis])
        nu = tiling.local(self.diffusivity(params.to(u.dtype)))
        lift = (1.0 - x).expand_as(u)
        return {"energy": element_sum(self._energy, tiling, u, nu) / element_sum(self._energy, tiling, lift, nu)}
