"""Groundwater heads with wells: -div(nu grad u) = sum_k q_k g(x - x_k) over Karhunen-Loève conductivities, each
well's rate q_k a parameter of the instance beside the KL coefficients (issue 75: the family an inverse problem
with pumping tests needs)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from diffnet.backend.constants import constant
from diffnet.discretisation.energy import source_work
from diffnet.families.poisson import PoissonFamily
from diffnet.protocol.family import Family, ParameterSpec
from diffnet.protocol.options import interval, option, positive
from diffnet.solvers.fem import FEMSystem

__all__ = ["GroundwaterFamily"]


def _unit_coordinates(values: tuple[float, ...]) -> str | None:
    if not values or not all(0.0 <= v <= 1.0 for v in values):
        return "must be one or more coordinates in [0, 1]"
    return None


def well_sources(rates: torch.Tensor, x: tuple[float, ...], y: tuple[float, ...], radius: float,
                 resolution: tuple[int, int]) -> torch.Tensor:
    """sum_k q_k g(x - x_k) at the nodes of the unit square's grid ``resolution`` (N_y, N_x), (S, N_y, N_x), for
    rates (S, K): g the normalised Gaussian exp(-|r|^2 / 2 rho^2) / (2 pi rho^2) of radius ``radius``, so that a
    well well inside the square injects q_k (a negative rate pumps)."""
    def shapes() -> np.ndarray:
        yy, xx = np.meshgrid(*(np.linspace(0.0, 1.0, n) for n in resolution), indexing="ij")
        r2 = (xx[None] - np.asarray(x)[:, None, None]) ** 2 + (yy[None] - np.asarray(y)[:, None, None]) ** 2
        return np.exp(-r2 / (2.0 * radius**2)) / (2.0 * math.pi * radius**2)

    g = constant(("wells", x, y, radius, tuple(resolution)), shapes, rates)
    return torch.einsum("sk,k...->s...", rates, g)


@dataclass(frozen=True)
class GroundwaterFamily(PoissonFamily):
    """-div(nu grad u) = sum_k q_k g(x - x_k) on [0,1]^2: the Poisson family's KL conductivity and sides (default
    head 1 at x = 0, 0 at x = 1, no flow elsewhere) with wells at (``well_x``, ``well_y``), each a Gaussian source of
    radius ``well_radius`` whose rate q_k (injection > 0, pumping < 0) is an instance parameter: an instance is
    (a_1, ..., a_m, q_1, ..., q_K). The loss is the Poisson family's energy less the sources' work, over the same
    scale; the network sees the source field beside log nu and the coordinates."""

    well_x: tuple[float, ...] = option((0.3, 0.7), "the wells' x coordinates", _unit_coordinates)
    well_y: tuple[float, ...] = option((0.5, 0.5), "the wells' y coordinates (as many as `well_x`)", _unit_coordinates)
    well_radius: float = option(0.05, "radius ρ of each well's Gaussian source exp(-r²/2ρ²)/(2πρ²)", positive)
    rate_range: tuple[float, ...] = option((-1.0, 1.0), "range of each well's rate q_k (injection > 0, pumping < 0)",
                                           interval)

    name = "groundwater"
    in_channels = 4  # log nu, the wells' source, the coordinates

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.well_x) != len(self.well_y):
            raise ValueError(f"{self.name}: well_x has {len(self.well_x)} coordinates, well_y {len(self.well_y)}: "
                             "one pair per well")

    @property
    def wells(self) -> int:
        return len(self.well_x)

    @property
    def parameters(self) -> ParameterSpec:
        (lo, hi), (qlo, qhi), m, k = self.coeff_range, self.rate_range, self.kl_terms, self.wells
        return ParameterSpec("a", (m + k,), (lo,) * m + (qlo,) * k, (hi,) * m + (qhi,) * k,
                             distributions=("uniform", "normal"),
                             names=tuple(f"a[{i}]" for i in range(m)) + tuple(f"q[{i}]" for i in range(k)),
                             description="KL coefficients, then the wells' rates")

    def draw(self, n: int, distribution: str, seed: int) -> np.ndarray:
        """Uniform on the training range; ``normal``: the KL coefficients standard normal (their expansion's own
        law), the rates uniform on their range."""
        out = super().draw(n, "uniform", seed)
        if distribution == "normal":
            out[:, : self.kl_terms] = np.random.default_rng(seed + 1).standard_normal((n, self.kl_terms))
        return out

    def diffusivity(self, instances: torch.Tensor) -> torch.Tensor:
        """Nodal nu (S, *resolution) of the instances' KL coefficients."""
        return super().diffusivity(instances[:, : self.kl_terms])

    def source(self, instances: torch.Tensor) -> torch.Tensor:
        """The wells' nodal source (S, *resolution) of the instances' rates."""
        return well_sources(instances[:, self.kl_terms:], self.well_x, self.well_y, self.well_radius,
                            tuple(self.resolution))

    def inputs(self, instances: torch.Tensor) -> torch.Tensor:
        """Network input (S, 4, *resolution): log nu, the source (scaled by ρ², order one at a well of unit rate),
        then the coordinates."""
        base = super().inputs(instances)
        scaled = self.source(instances.to(base.dtype)) * (2.0 * math.pi * self.well_radius**2)
        return torch.cat([base[:, :1], scaled[:, None], base[:, 1:]], dim=1)

    def loss_terms(self, u: torch.Tensor, instances: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-sample energy less the fluxes' and the sources' work, divided by the scale, shape (S,)."""
        p = instances.to(u.dtype)
        nu = self.diffusivity(p)
        _, lift, _ = self._boundary_fields(u)
        work = self._flux_work(u) + source_work(u, self.source(p), *self.spacing)
        return {"energy": (self._energy(u, nu) - work) / self._scale(lift, nu)}

    def tile_loss_terms(self, raw: torch.Tensor, instances: torch.Tensor, tiling) -> dict[str, torch.Tensor]:
        """Under a domain split, the protocol's exact default (the tiles gathered, :meth:`loss_terms` on the whole
        grid): the Poisson family's tile-local energy does not carry the sources."""
        return Family.tile_loss_terms(self, raw, instances, tiling)

    def input_fields(self, instances: np.ndarray) -> tuple[np.ndarray, list[str]]:
        """log10 of each instance's conductivity, labelled with its rates."""
        p = np.asarray(instances, dtype=np.float64)
        labels = ["ν, q = (" + ", ".join(f"{v:.2f}" for v in row[self.kl_terms:]) + ")" for row in p]
        return np.log10(self.diffusivity_numpy(p)), labels

    def fem_system(self, instances: np.ndarray) -> FEMSystem:
        """The Q1 system of one instance (m + K,): the conductivity's stiffness, the wells' load."""
        p = torch.as_tensor(np.asarray(instances, dtype=np.float64)[None])
        return self._box_system(self.diffusivity(p)[0].numpy(), f=self.source(p)[0].numpy())

    def describe(self) -> str:
        wells = ", ".join(f"({x:g}, {y:g})" for x, y in zip(self.well_x, self.well_y))
        return f"{super().describe()}; wells at {wells}, ρ = {self.well_radius:g}, q in {list(self.rate_range)}"
