"""Poisson family -div(nu grad u) = 0 over Karhunen-Loève diffusivities in any dimension, with a Dirichlet
value or a Neumann flux on each side of the box (default: u = 1 at x = 0, u = 0 at x = 1, zero flux on
the other sides)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from diffnet.instances.boundary import SIDE_DOC, side_check
from diffnet.discretisation.energy import dirichlet_energy, dirichlet_stencil
from diffnet.protocol.options import option
from diffnet.families.kl_family import KLFamily
from diffnet.solvers.fem import FEMSystem
from diffnet.generators.tiling import element_sum

__all__ = ["PoissonFamily"]

@dataclass(frozen=True)
class PoissonFamily(KLFamily):
    """-div(nu grad u) = 0 on [0,1]^d with a Dirichlet value or a flux on each side (keys
    x0, x1, y0, y1[, z0, z1]; default u = 1 at x = 0, u = 0 at x = 1, zero flux elsewhere).

    The field is the lift of the Dirichlet values (:meth:`diffnet.instances.boundary.BoxBoundary.lift`; 1 - x by
    default) plus the network's output off the Dirichlet nodes. The loss is the Q1 energy
    J(u) = integral 1/2 nu |grad u|^2 - integral over the flux sides of q u, divided per sample by the
    lift's energy (1/2 integral nu by default; 1/2 integral nu where the lift is zero): over
    a in [-3, 3]^6 nu spans about seven decades, and without the division the samples with large nu
    would own the gradient.
    """

    x0: str = option("u=1", SIDE_DOC.format("x = 0"), side_check)
    x1: str = option("u=0", SIDE_DOC.format("x = 1"), side_check)
    y0: str = option("flux=0", SIDE_DOC.format("y = 0"), side_check)
    y1: str = option("flux=0", SIDE_DOC.format("y = 1"), side_check)

    name = "poisson"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.boundary.dirichlet:
            raise ValueError(f"{self.name}: at least one side needs a Dirichlet value (\"u=...\"); with fluxes "
                             "alone the solution is defined up to a constant")

    def describe(self) -> str:
        text = super().describe()
        return text if self.sides == self.default_sides() else \
            f"{text} {self.boundary.describe()}"

    def _energy(self, u: torch.Tensor, nu: torch.Tensor) -> torch.Tensor:
        """The Q1 energy per sample."""
        return dirichlet_energy(u, nu, *self.spacing)

    def _scale(self, lift: torch.Tensor, nu: torch.Tensor) -> torch.Tensor:
        """The lift's energy per sample, or 1/2 integral nu where the lift has none (a constant lift's is
        rounding: below 1e-12 of that)."""
        energy = self._energy(lift.expand_as(nu), nu)
        # A lift whose values vary has a positive energy (nu > 0): decided from the sides, not read off the
        # GPU, so that the step has no host synchronisation (a CUDA graph cannot capture one).
        if self.boundary.varies:
            return energy
        ramp = self._energy(self._ramp(nu), nu)
        return torch.where(energy > 1e-12 * ramp, energy, ramp)

    def _ramp(self, like: torch.Tensor) -> torch.Tensor:
        """1 - x on the grid, in ``like``'s shape: its energy is 1/2 integral nu."""
        return (1.0 - torch.linspace(0.0, 1.0, self.resolution[-1], dtype=like.dtype, device=like.device)).expand_as(like)

    def hessian(self, u: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
        """The Hessian of :meth:`loss_terms` in u: the stiffness stencil divided by the loss's scale."""
        nu = self.diffusivity(instances.to(u.dtype))
        _, lift, _ = self._boundary_fields(u)
        scale = self._scale(lift, nu).reshape(-1, *([1] * u.ndim))
        return dirichlet_stencil(nu, *self.spacing) / scale

    def loss_terms(self, u: torch.Tensor, instances: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-sample energy (minus the fluxes' work) divided by the scale, shape (S,)."""
        nu = self.diffusivity(instances.to(u.dtype))
        _, lift, flux = self._boundary_fields(u)
        return {"energy": (self._energy(u, nu) - self._flux_work(u)) / self._scale(lift, nu)}

    def tile_loss_terms(self, raw: torch.Tensor, instances: torch.Tensor, tiling) -> dict[str, torch.Tensor]:
        """:meth:`loss_terms` under a domain split: the tile's field, the energies of its own elements
        and the fluxes' work on its own nodes, summed over the tiles."""
        s = raw.shape[0]
        free, lift, flux = (tiling.local(f.expand(s, *f.shape)) for f in self._boundary_fields(raw))
        u = lift + raw[:, 0] * free
        nu_full = self.diffusivity(instances.to(u.dtype))
        nu = tiling.local(nu_full)
        energy = element_sum(self._energy, tiling, u, nu) - tiling.sum(self._flux_work(u, flux))
        scale = element_sum(self._energy, tiling, lift, nu)
        if not self.boundary.varies:  # the family's, not the tile's: every tile sums alike
            ramp = element_sum(self._energy, tiling, tiling.local(self._ramp(nu_full)), nu)
            scale = torch.where(scale > 1e-12 * ramp, scale, ramp)
        return {"energy": energy / scale}

    def _fem_system(self, nu: np.ndarray) -> FEMSystem:
        return self._box_system(nu)
