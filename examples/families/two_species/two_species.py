"""Two coupled screened species: -lap u1 + k^2 u1 - c u2 = 1 and -lap u2 + k^2 u2 - c u1 = 0 on [0,1]^2,
both zero on the boundary; k in [1, 10], the coupling c in [0, 0.9]. Two unknowns, u1 and u2."""

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from diffnet import (Energy, Family, ParameterSpec, at_gauss_points, dirichlet_energy, dirichlet_system,
                     gauss_basis, integer_in, option)


def q1_solve(k: float, c: float, n: int) -> np.ndarray:
    """The coupled Q1 solution (2, n, n): w = u1 + u2 and u1 - u2 decouple into -lap w + (k^2 -+ c) w = 1."""
    edge = np.ones((n, n), dtype=bool)
    edge[1:-1, 1:-1] = False  # both species zero on the boundary
    plus, minus = (dirichlet_system(np.ones((n, n)), edge, np.zeros((n, n)), kappa=np.sqrt(k * k + s * c),
                                    f=1.0).solve("direct") for s in (-1.0, 1.0))
    return np.stack([(plus + minus) / 2, (plus - minus) / 2])


@dataclass(frozen=True)
class TwoSpecies(Family):
    """Two coupled screened species u1, u2 on the unit square, zero on its boundary. Its keys (``[two_species]``)
    are the fields made with ``option``."""

    resolution: tuple[int, ...]
    truth_refine: int = option(4, "the reference is the Q1 solve on a grid this many times finer", integer_in(2, 8))

    name = "two_species"
    in_channels = 4
    unknowns = ("u1", "u2")  # two output channels; field returns (S, 2, N_y, N_x)
    capabilities = frozenset({"reference", "floor"})

    @property
    def parameters(self) -> ParameterSpec:
        return ParameterSpec("p", (2,), (1.0, 0.0), (10.0, 0.9), names=("k", "c"),
                             description="the screening constant k and the coupling c")

    def coordinates(self) -> dict[str, np.ndarray]:
        ny, nx = self.resolution
        return {"y": np.linspace(0.0, 1.0, ny), "x": np.linspace(0.0, 1.0, nx)}

    def inputs(self, p: torch.Tensor) -> torch.Tensor:
        ny, nx = self.resolution
        y = torch.linspace(0.0, 1.0, ny, dtype=p.dtype, device=p.device)[:, None].expand(ny, nx)
        x = torch.linspace(0.0, 1.0, nx, dtype=p.dtype, device=p.device)[None, :].expand(ny, nx)
        k, c = ((p[:, i] * scale)[:, None, None].expand(-1, ny, nx) for i, scale in ((0, 0.1), (1, 1.0)))
        return torch.stack([k, c, y.expand_as(k), x.expand_as(k)], dim=1)

    def field(self, raw: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        return F.pad(raw[:, :, 1:-1, 1:-1], (1, 1, 1, 1))  # both zero on the boundary, by construction

    def loss_terms(self, u: torch.Tensor, p: torch.Tensor) -> dict[str, torch.Tensor]:
        h = 1.0 / (self.resolution[1] - 1)
        values, _, _, weight = gauss_basis(h, h)
        u1, u2 = at_gauss_points(u[:, 0], values), at_gauss_points(u[:, 1], values)
        k2, c = p[:, 0].to(u.dtype) ** 2, p[:, 1].to(u.dtype)
        ones = torch.ones_like(u[:, 0])
        energy = dirichlet_energy(u[:, 0], ones, h, h) + dirichlet_energy(u[:, 1], ones, h, h) + weight * (
            0.5 * k2 * (u1**2 + u2**2).sum(dim=(1, 2, 3)) - c * (u1 * u2).sum(dim=(1, 2, 3)) - u1.sum(dim=(1, 2, 3)))
        return {"energy": energy * (2 * np.pi**2 + k2)}  # rescaled: every k weighs alike

    def loss(self) -> Energy:
        return Energy(self.loss_terms)  # its Hessian: read off the loss by probes

    def reference(self, p: np.ndarray, progress=None) -> np.ndarray:
        return np.stack([q1_solve(k, c, self.resolution[1]) for k, c in p])

    def reference_name(self) -> str:
        return "the coupled Q1 FEM on this grid"

    def truth(self, p: np.ndarray, progress=None) -> np.ndarray:
        r, n = self.truth_refine, self.resolution[1]
        return np.stack([q1_solve(k, c, r * (n - 1) + 1)[:, ::r, ::r] for k, c in p])

    def truth_name(self) -> str:
        return f"the coupled Q1 FEM {self.truth_refine}x finer"

    def discrete_optimum(self, p: np.ndarray, initial=None) -> tuple[np.ndarray, np.ndarray]:
        return self.reference(p), np.ones(len(p), dtype=bool)

    def floor_name(self) -> str:
        return "the coupled Q1 FEM on this grid"
