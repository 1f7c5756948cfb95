"""C uncoupled fields on a plate with a hole, the hole an "ersatz" material (ν = 1e-3 inside it) and the domain
capability marking it out: -∇·(ν∇u_c) = c + 1 on the unit square, u_c = 0 on its sides, for c = 0 .. C - 1.

A user's plugin as docs/families.md describes one, for the tests of per-node data against fields of C = 1, 2, 3
unknowns (HoleFields1, HoleFields2, HoleFields3): each unknown has a source of its own, so a mask or a
statistic paired with the wrong unknown or instance shows. An instance is the hole's centre x and radius (its
centre y is 1/2); the reference and floor are the same-grid Q1 solves, the truth the Q1 solve twice as fine.
"""

from dataclasses import dataclass, replace

import numpy as np
import torch

from diffnet import Family, ParameterSpec, dirichlet_system, integer_in, option, reaction_diffusion_energy
from diffnet.solvers.classical import q1_to_grid

SOFT = 1e-3  # the hole's diffusivity


@dataclass(frozen=True)
class HoleFields(Family):
    """C fields on the unit square with a soft hole; the hole is outside the domain."""

    resolution: tuple[int, ...]
    load: float = option(1.0, "scale of the sources (field c has (c + 1) load)")
    truth_refine: int = option(2, "the truth is the Q1 solve this many times finer", integer_in(2, 4))

    name = "hole_fields"
    in_channels = 3  # the signed distance, y, x
    capabilities = frozenset({"reference", "floor", "domain", "classical"})
    classical_methods = {"direct": "the Q1 system by a sparse direct solve"}
    classical_baseline = None

    @property
    def parameters(self) -> ParameterSpec:
        return ParameterSpec("hole", (2,), (0.35, 0.1), (0.65, 0.2), names=("cx", "r"),
                             description="the hole's centre x and radius", limits=((0.0, 0.0), (1.0, 0.5)))

    def coordinates(self) -> dict[str, np.ndarray]:
        ny, nx = self.resolution
        return {"y": np.linspace(0.0, 1.0, ny), "x": np.linspace(0.0, 1.0, nx)}

    def domain(self, hole: np.ndarray) -> np.ndarray:
        """The ``domain`` capability: the signed distance (S, N_y, N_x)."""
        return self.sdf(hole)

    def sdf(self, hole: np.ndarray) -> np.ndarray:
        """The signed distance to the plate's boundary (the square's sides and the hole), (S, N_y, N_x)."""
        c = self.coordinates()
        y, x = np.meshgrid(c["y"], c["x"], indexing="ij")
        hole = np.asarray(hole, dtype=np.float64).reshape(-1, 2)
        to_hole = hole[:, 1, None, None] - np.hypot(x - hole[:, 0, None, None], y - 0.5)
        return np.maximum(to_hole, -np.minimum(np.minimum(x, 1 - x), np.minimum(y, 1 - y)))

    def nu(self, hole: np.ndarray) -> np.ndarray:
        return np.where(self.sdf(hole) > 0, SOFT, 1.0)

    def inputs(self, hole: torch.Tensor) -> torch.Tensor:
        sdf = torch.as_tensor(self.sdf(hole.detach().cpu().numpy()), dtype=hole.dtype, device=hole.device)
        c = self.coordinates()
        y, x = (torch.as_tensor(v, dtype=hole.dtype, device=hole.device) for v in np.meshgrid(c["y"], c["x"], indexing="ij"))
        return torch.stack([sdf, y.expand_as(sdf), x.expand_as(sdf)], dim=1)

    def field(self, raw: torch.Tensor, hole: torch.Tensor) -> torch.Tensor:
        u = torch.nn.functional.pad(raw[:, :, 1:-1, 1:-1], (1, 1, 1, 1))  # zero on the square's sides
        return u if len(self.unknowns) > 1 else u[:, 0]

    def loss_terms(self, u: torch.Tensor, hole: torch.Tensor) -> dict[str, torch.Tensor]:
        h = 1.0 / (self.resolution[1] - 1)
        nu = torch.as_tensor(self.nu(hole.detach().cpu().numpy()), dtype=u.dtype, device=u.device)
        fields = u[:, None] if len(self.unknowns) == 1 else u
        energy = sum(reaction_diffusion_energy(fields[:, c], nu, 0.0, self.load * (c + 1), h, h)
                     for c in range(fields.shape[1]))
        return {"energy": energy}

    def _solve(self, hole: np.ndarray) -> np.ndarray:
        n = self.resolution[1]
        edge = np.ones((n, n), dtype=bool)
        edge[1:-1, 1:-1] = False
        nu = self.nu(hole[None])[0]
        out = np.stack([dirichlet_system(nu, edge, np.zeros((n, n)), f=self.load * (c + 1)).solve("direct")
                        for c in range(len(self.unknowns))])
        return out if len(self.unknowns) > 1 else out[0]

    def reference(self, hole: np.ndarray, progress=None) -> np.ndarray:
        return np.stack([self._solve(p) for p in np.asarray(hole, dtype=np.float64)])

    def reference_name(self) -> str:
        return "the Q1 solve on this grid"

    def truth(self, hole: np.ndarray, progress=None) -> np.ndarray:
        r, n = self.truth_refine, self.resolution[1]
        fine = replace(self, resolution=(r * (n - 1) + 1,) * 2)
        return fine.reference(hole)[..., ::r, ::r]

    def truth_name(self) -> str:
        return f"the Q1 solve {self.truth_refine}x finer"

    def discrete_optimum(self, hole: np.ndarray, initial=None) -> tuple[np.ndarray, np.ndarray]:
        return self.reference(hole), np.ones(len(hole), dtype=bool)

    def floor_name(self) -> str:
        return "the Q1 solve on this grid"

    def classical_configurations(self) -> dict[str, list[int]]:
        n = self.resolution[1]
        return {"direct": [g for g in (5, 9, 17, 33) if g < n] + [n]}

    def classical_solver(self, method: str, grid: int):
        coarse = replace(self, resolution=(grid, grid))
        return lambda hole: coarse.reference(np.asarray(hole)[None])[0]

    def classical_to_grid(self, method: str, native: np.ndarray, hole: np.ndarray) -> np.ndarray:
        return q1_to_grid(self, native) if native.ndim == 2 else np.stack([q1_to_grid(self, c) for c in native])


@dataclass(frozen=True)
class HoleFields1(HoleFields):
    unknowns = ("u",)


@dataclass(frozen=True)
class HoleFields2(HoleFields):
    unknowns = ("u1", "u2")


@dataclass(frozen=True)
class HoleFields3(HoleFields):
    unknowns = ("u1", "u2", "u3")
