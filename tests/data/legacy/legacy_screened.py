"""docs/families.md's tutorial family as the page had it before diffnet's subpackages (2026-11-26): its keys
in an ``Options`` class beside the dataclass, imported from the flat module paths. Kept as written, to show
that such a plugin still trains.

A screened Poisson family: -lap u + k^2 u = 1 on [0,1]^2, u = 0 on the boundary, k in [1, 10].
"""

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from diffnet.energy import at_gauss_points, dirichlet_energy, gauss_basis
from diffnet.family import Family, ParameterSpec
from diffnet.options import integer_in, interval, option
from diffnet.solvers.fem import dirichlet_system


@dataclass(frozen=True)
class ScreenedOptions:
    """``[screened_poisson]``: the range of k and the reference's refinement."""

    k_range: tuple[float, ...] = option((1.0, 10.0), "range of the screening constant k", interval)
    truth_refine: int = option(4, "the reference is the Q1 solve on a grid this many times finer", integer_in(2, 8))


def q1_solve(k: float, n: int) -> np.ndarray:
    """The Q1 FEM solution on n x n nodes: the exact minimiser of the family's energy."""
    edge = np.ones((n, n), dtype=bool)
    edge[1:-1, 1:-1] = False  # u = 0 on the boundary
    return dirichlet_system(np.ones((n, n)), edge, np.zeros((n, n)), kappa=k, f=1.0).solve("direct")


@dataclass(frozen=True)
class ScreenedPoisson(Family):
    resolution: tuple[int, ...]
    k_range: tuple[float, ...] = (1.0, 10.0)
    truth_refine: int = 4

    name = "screened_poisson"
    Options = ScreenedOptions
    in_channels = 3
    capabilities = frozenset({"reference", "floor"})

    @property
    def parameters(self) -> ParameterSpec:
        return ParameterSpec("k", (), *self.k_range, positive=True, description="the screening constant k")

    def coordinates(self) -> dict[str, np.ndarray]:
        ny, nx = self.resolution
        return {"y": np.linspace(0.0, 1.0, ny), "x": np.linspace(0.0, 1.0, nx)}

    def inputs(self, k: torch.Tensor) -> torch.Tensor:
        ny, nx = self.resolution
        y = torch.linspace(0.0, 1.0, ny, dtype=k.dtype, device=k.device)[:, None].expand(ny, nx)
        x = torch.linspace(0.0, 1.0, nx, dtype=k.dtype, device=k.device)[None, :].expand(ny, nx)
        scaled = (k / self.k_range[1])[:, None, None].expand(-1, ny, nx)
        return torch.stack([scaled, y.expand_as(scaled), x.expand_as(scaled)], dim=1)

    def field(self, raw: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return F.pad(raw[:, 0, 1:-1, 1:-1], (1, 1, 1, 1))  # u = 0 on the boundary, by construction

    def loss_terms(self, u: torch.Tensor, k: torch.Tensor) -> dict[str, torch.Tensor]:
        h = 1.0 / (self.resolution[1] - 1)
        values, _, _, weight = gauss_basis(h, h)
        at_points = at_gauss_points(u, values)
        k2 = k.to(u.dtype) ** 2
        energy = dirichlet_energy(u, torch.ones_like(u), h, h) + weight * (
            0.5 * k2 * at_points.pow(2).sum(dim=(1, 2, 3)) - at_points.sum(dim=(1, 2, 3)))
        # The optimum's energy scales like 1 / (2 pi^2 + k^2): rescaled, every k weighs alike.
        return {"energy": energy * (2 * np.pi**2 + k2)}

    def reference(self, k: np.ndarray, progress=None) -> np.ndarray:
        return np.stack([q1_solve(float(kk), self.resolution[1]) for kk in k])

    def reference_name(self) -> str:
        return "the Q1 FEM on this grid"

    def truth(self, k: np.ndarray, progress=None) -> np.ndarray:
        r, n = self.truth_refine, self.resolution[1]
        return np.stack([q1_solve(float(kk), r * (n - 1) + 1)[::r, ::r] for kk in k])

    def truth_name(self) -> str:
        return f"the Q1 FEM {self.truth_refine}x finer"

    def discrete_optimum(self, k: np.ndarray, initial=None) -> tuple[np.ndarray, np.ndarray]:
        return self.reference(k), np.ones(len(k), dtype=bool)

    def floor_name(self) -> str:
        return "the Q1 FEM on this grid"
