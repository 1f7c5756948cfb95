"""Reaction-diffusion family -div(nu grad u) + kappa^2 u = f, u = 0 on the boundary of [0,1]^2."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from diffnet.instances.boundary import SIDE_DOC, side_check
from diffnet.discretisation.energy import reaction_diffusion_energy, reaction_diffusion_stencil
from diffnet.protocol.options import nonnegative, one_of, option
from diffnet.families.kl_family import KLFamily
from diffnet.solvers.fem import FEMSystem
from diffnet.generators.tiling import element_sum

__all__ = ["ReactionDiffusionFamily", "energy_scale"]


def energy_scale(nu_mean: torch.Tensor, kappa: float, f: float) -> torch.Tensor:
    """|J| of the best single-mode field A sin(pi x) sin(pi y) for constant nu = nu_mean.

    Minimising J over A gives J = -(4 f / pi^2)^2 / (2 (nu pi^2 / 2 + kappa^2 / 4)); its
    magnitude is the per-sample scale the energy is divided by, since the solution, and
    with it J, scales like f / nu across the diffusivity family.
    """
    load = 4.0 * f / math.pi**2
    return load * load / (2.0 * (nu_mean * math.pi**2 / 2.0 + kappa * kappa / 4.0))


@dataclass(frozen=True)
class ReactionDiffusionFamily(KLFamily):
    """-div(nu grad u) + kappa^2 u = f with a Dirichlet value or a flux on each side (default u = 0 on every
    side); nu from the KL family (or constant).

    The loss is the Q1 energy integral [1/2 nu |grad u|^2 + 1/2 kappa^2 u^2 - f u],
    divided per sample by :func:`energy_scale`; it is negative at the solution.
    """

    nu_model: str = option("kl", "ν: the KL family, or `\"constant\"` (= `viscosity`)", one_of("kl", "constant"),
                           key="diffusivity")
    viscosity: float = option(0.01, "the constant ν with `diffusivity = \"constant\"`", nonnegative)
    kappa: float = option(1.0, "κ (reaction term κ²u)", nonnegative)
    source: float = option(1.0, "constant source f (non-zero)",
                           lambda v: None if v != 0 else "must be non-zero (f = 0 has the solution u = 0)")
    x0: str = option("u=0", SIDE_DOC.format("x = 0"), side_check)
    x1: str = option("u=0", SIDE_DOC.format("x = 1"), side_check)
    y0: str = option("u=0", SIDE_DOC.format("y = 0"), side_check)
    y1: str = option("u=0", SIDE_DOC.format("y = 1"), side_check)

    name = "reaction_diffusion"

    @property
    def nu_constant(self) -> float:
        """``viscosity`` with the key diffusivity = "constant"; else the KL family's (``constant``, 0 by default)."""
        return self.viscosity if self.nu_model == "constant" else self.constant

    @classmethod
    def check_options(cls, options, *, n_train: int, sampling: str,
                      resolution: tuple[int, ...]) -> None:
        super().check_options(options, n_train=n_train, sampling=sampling, resolution=resolution)
        if options.diffusivity == "constant" and options.viscosity <= 0:
            raise ValueError("viscosity: the constant diffusivity must be > 0 (got 0)")

    def describe(self) -> str:
        return f"{super().describe()} kappa={self.kappa} f={self.source}"

    def loss_terms(self, u: torch.Tensor, instances: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-sample normalised energy ``energy``, shape (S,)."""
        nu = self.diffusivity(instances.to(u.dtype))
        j = reaction_diffusion_energy(u, nu, self.kappa, self.source, *self.spacing) - self._flux_work(u)
        return {"energy": j / energy_scale(nu.mean(dim=(1, 2)), self.kappa, self.source)}

    def hessian(self, u: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
        """The Hessian of :meth:`loss_terms` in u: (K + kappa^2 M) divided by the energy scale."""
        nu = self.diffusivity(instances.to(u.dtype))
        scale = energy_scale(nu.mean(dim=(1, 2)), self.kappa, self.source).reshape(-1, 1, 1, 1)
        return reaction_diffusion_stencil(nu, self.kappa, *self.spacing) / scale

    def tile_loss_terms(self, raw: torch.Tensor, instances: torch.Tensor, tiling) -> dict[str, torch.Tensor]:
        """:meth:`loss_terms` under a domain split: the tile's field, the energy of its own elements
        summed over the tiles (the scale from the whole grid's nu, which every tile computes)."""
        s = raw.shape[0]
        free, lift, flux = (tiling.local(f.expand(s, *f.shape)) for f in self._boundary_fields(raw))
        u = lift + raw[:, 0] * free
        nu_full = self.diffusivity(instances.to(u.dtype))
        energy = lambda v, c: reaction_diffusion_energy(v, c, self.kappa, self.source, *self.spacing)  # noqa: E731
        j = element_sum(energy, tiling, u, tiling.local(nu_full)) - tiling.sum(self._flux_work(u, flux))
        return {"energy": j / energy_scale(nu_full.mean(dim=(1, 2)), self.kappa, self.source)}

    def _fem_system(self, nu: np.ndarray) -> FEMSystem:
        return self._box_system(nu, self.kappa, self.source)
