"""A plane-stress plate with a circular hole in uniaxial tension, written as the structural engineer of issue 64
wrote it: two unknowns (u_x, u_y), the ``domain`` capability (the hole's signed distance, so that files, plots
and errors leave the hole out), and the hole an "ersatz" material (E = 1e-3 inside it) in the built-in
elasticity family's Q1 machinery.

An instance is the hole's centre (x, y), its radius and the Poisson ratio; the side x = 0 is held, x = 1 pulled
by a unit traction, y = 0 and y = 1 free. Reference and floor: the same-grid Q1 solution (AMG-CG with the
rigid-body modes); truth: the same 4x finer; the classical search and the polish are the built-in family's.
"""

from dataclasses import dataclass

import numpy as np
import torch

from diffnet import ParameterSpec, option
from diffnet.grid.material import POISSON_RATIO
from diffnet.instances.boundary import vector_side_check
from diffnet.families.elasticity import ElasticityFamily

SOFT = 1e-3  # Young's modulus inside the hole (the plate's is 1)


@dataclass(frozen=True)
class PlateHole(ElasticityFamily):
    """The unit plate less a disc, plane stress; the displacement (S, 2, N_y, N_x)."""

    x1: str = option("traction=1,0", "the side x = 1 (as x0)", vector_side_check(2))

    name = "plate_hole"
    in_channels = 4  # the signed distance, nu, y, x
    capabilities = ElasticityFamily.capabilities | {"domain"}

    @property
    def parameters(self) -> ParameterSpec:
        lower, upper = POISSON_RATIO
        return ParameterSpec("hole", (4,), (0.4, 0.4, 0.1, 0.2), (0.6, 0.6, 0.18, 0.35),
                             names=("cx", "cy", "r", "nu"), description="the hole's centre and radius, and nu",
                             limits=((0.0, 0.0, 0.0, lower), (1.0, 1.0, 0.5, upper)))

    def domain(self, hole: np.ndarray) -> np.ndarray:
        """The signed distance to the plate's boundary (the square's sides and the hole), (S, N_y, N_x)."""
        c = self.coordinates()
        y, x = np.meshgrid(c["y"], c["x"], indexing="ij")
        hole = np.asarray(hole, dtype=np.float64).reshape(-1, 4)
        to_hole = hole[:, 2, None, None] - np.hypot(x - hole[:, 0, None, None], y - hole[:, 1, None, None])
        return np.maximum(to_hole, -np.minimum(np.minimum(x, 1 - x), np.minimum(y, 1 - y)))

    def young(self, hole: torch.Tensor) -> torch.Tensor:
        sdf = torch.as_tensor(self.domain(hole.detach().cpu().numpy()), dtype=hole.dtype, device=hole.device)
        return torch.where(sdf > 0, SOFT, 1.0).to(hole.dtype)

    def inputs(self, hole: torch.Tensor) -> torch.Tensor:
        sdf = torch.as_tensor(self.domain(hole.detach().cpu().numpy()), dtype=hole.dtype, device=hole.device)
        nu = hole[:, -1, None, None].expand_as(sdf)
        c = self.coordinates()
        y, x = (torch.as_tensor(v, dtype=hole.dtype, device=hole.device) for v in np.meshgrid(c["y"], c["x"], indexing="ij"))
        return torch.stack([sdf, nu, y.expand_as(sdf), x.expand_as(sdf)], dim=1)

    def describe(self) -> str:
        return f"plane {self.plane}, a soft disc as the hole"
