"""3-D Poisson family -div(nu grad u) = 0 on [0,1]^3 with a Karhunen-Loeve log-diffusivity.

u = 1 at x = 0, u = 0 at x = 1, zero flux on the other four faces;
nu = exp(sum_i a_i lambda_i^{3/2} phi_i(x) phi_i(y) phi_i(z)) with the 1-D modes of the 2-D
family (:func:`diffnet.kl.kl_modes`). lambda_i^{3/2} is the square root of the
separable eigenvalue lambda_i^3, as the 2-D family's lambda_i is that of lambda_i^2; with
lambda_i alone nu would span 15 decades at 33^3. The loss is the trilinear Q1 energy
(:mod:`diffnet.energy3d`), whose minimiser is the Q1 FEM solution on the grid.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from diffnet.classical import Q1Classical
from diffnet.constants import constant
from diffnet.energy3d import dirichlet_energy_3d, dirichlet_stencil_3d
from diffnet.family import Family
from diffnet.kl import kl_basis
from diffnet.options import integer_in, option
from diffnet.problems.poisson import KLCoefficients, KLOptions, LiftedEnergy

__all__ = ["KL3DOptions", "Poisson3D"]


@dataclass(frozen=True)
class KL3DOptions(KLOptions):
    """``[poisson3d]``: the 3-D Karhunen-Loève diffusivity family and the evaluation's reference."""

    # 2x finer in 3-D: 4x at 65^3 would be 257^3 = 17 M unknowns per instance.
    truth_refine: int = option(2, "evaluation: the independent reference is the Q1 FEM on a grid with this many "
                               "times the intervals (2..8)", integer_in(2, 8))


@dataclass(frozen=True)
class Poisson3D(LiftedEnergy, KLCoefficients, Q1Classical, Family):
    """The 3-D KL Poisson family on an (N_z, N_y, N_x) nodal grid of [0,1]^3.

    Instance parameters are coefficient rows a (S, m), or nodal diffusivity fields
    (S, N_z, N_y, N_x) in their place.
    """

    resolution: tuple[int, int, int]
    kl_terms: int = 6
    kl_eta: float = 0.5
    coeff_range: tuple[float, float] = (-3.0, 3.0)
    truth_refine: int = 2

    name = "poisson3d"
    Options = KL3DOptions
    in_channels = 4
    dims = 3
    polish_step = "V-cycle"
    capabilities = frozenset({"reference", "floor", "classical", "polish", "input_fields", "precondition"})

    def __post_init__(self) -> None:
        if len(self.resolution) != 3 or min(self.resolution) < 3:
            raise ValueError(f"problem.resolution: the 3-D family needs [N_z, N_y, N_x] with at least 3 nodes each, "
                             f"got {list(self.resolution)}")

    def describe(self) -> str:
        return f"nu=KL3D(m={self.kl_terms}, eta={self.kl_eta}, a in {list(self.coeff_range)})"

    # -- geometry and inputs -------------------------------------------------------------
    @property
    def spacing(self) -> tuple[float, float, float]:
        """(h_x, h_y, h_z)."""
        nz, ny, nx = self.resolution
        return 1.0 / (nx - 1), 1.0 / (ny - 1), 1.0 / (nz - 1)

    def coordinates(self) -> dict[str, np.ndarray]:
        nz, ny, nx = self.resolution
        return {"z": np.linspace(0.0, 1.0, nz), "y": np.linspace(0.0, 1.0, ny), "x": np.linspace(0.0, 1.0, nx)}

    def log_modes(self) -> np.ndarray:
        """lambda_i^{3/2} phi_i(x) phi_i(y) phi_i(z) on the grid, shape (m, N_z, N_y, N_x)."""
        return kl_basis(self.kl_eta, self.kl_terms, list(self.coordinates().values()), 1.5)

    def diffusivity(self, params: torch.Tensor) -> torch.Tensor:
        """Nodal nu (S, N_z, N_y, N_x) of coefficient rows (S, m) or nu fields."""
        if params.ndim == 4:
            return params
        modes = constant(("kl3d", self.kl_eta, self.kl_terms, self.resolution), self.log_modes, params)
        return torch.exp(torch.einsum("sm,mzyx->szyx", params, modes))

    def inputs(self, params: torch.Tensor) -> torch.Tensor:
        """Network input (S, 4, N_z, N_y, N_x): log nu, then z, y and x."""
        nu = self.diffusivity(params)
        s = nu.shape[0]
        grids = torch.meshgrid(*(constant(("grid", k, self.resolution), lambda k=k: self.coordinates()[k], nu)
                                 for k in ("z", "y", "x")), indexing="ij")
        return torch.stack([torch.log(nu), *(g.expand(s, -1, -1, -1) for g in grids)], dim=1)

    def _energy(self, u: torch.Tensor, nu: torch.Tensor) -> torch.Tensor:
        return dirichlet_energy_3d(u, nu, *self.spacing)

    def _energy_stencil(self, nu: torch.Tensor) -> torch.Tensor:
        return dirichlet_stencil_3d(nu, *self.spacing)

    # -- classical solves ----------------------------------------------------------------
    def fem_system(self, params: np.ndarray):
        """The Q1 hexahedral system of one instance (a coefficient row or a nodal nu field)."""
        from diffnet.solvers.poisson3d import poisson3d_system

        return poisson3d_system(self.diffusivity_numpy(np.asarray(params)[None])[0])

    def _solutions(self, params: np.ndarray, progress, stride: int = 1) -> np.ndarray:
        shape = tuple((n - 1) // stride + 1 for n in self.resolution)
        out = np.empty((len(params), *shape))
        for k in range(len(params)):
            out[k] = self.fem_system(params[k]).solve("gmg")[::stride, ::stride, ::stride]
            if progress is not None:
                progress(k + 1, len(params))
        return out

    def reference(self, params: np.ndarray, progress=None) -> np.ndarray:
        """Q1 FEM solutions on this grid (S, N_z, N_y, N_x): geometric FMG to a tenth of the
        discretisation error (:mod:`diffnet.solvers.gmg3d`)."""
        return self._solutions(np.asarray(params, dtype=np.float64), progress)

    def reference_name(self) -> str:
        return "the Q1 FEM on this grid (geometric multigrid)"

    def discrete_optimum(self, params: np.ndarray, initial: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The same-grid Q1 FEM solution: the exact minimiser of the trained energy."""
        return self.reference(params), np.ones(len(params), dtype=bool)

    def floor_name(self) -> str:
        return "the Q1 FEM on this grid"

    def truth(self, params: np.ndarray, progress=None) -> np.ndarray:
        """The Q1 FEM on the grid ``truth_refine`` times finer, read off at this grid's nodes."""
        r = self.truth_refine
        fine = dataclasses.replace(self, resolution=tuple(r * (n - 1) + 1 for n in self.resolution))
        params = np.asarray(params, dtype=np.float64)
        if params.ndim == 4:
            params = F.interpolate(torch.as_tensor(params)[:, None], size=fine.resolution, mode="trilinear",
                                   align_corners=True)[:, 0].numpy()
        return fine._solutions(params, progress, stride=r)

    def truth_name(self) -> str:
        r = self.truth_refine
        return "Q1 FEM on " + "x".join(str(r * (n - 1) + 1) for n in self.resolution) + f" ({r}x finer)"

    def polish(self, params: np.ndarray, fields: np.ndarray, cycles: int) -> np.ndarray:
        """``cycles`` V(1,1)-cycles of the 3-D multigrid on each instance from the network's ``fields``."""
        out = np.empty_like(np.asarray(fields, dtype=np.float64))
        for k in range(len(out)):
            out[k] = self.fem_system(params[k]).multigrid().vcycles(fields[k], cycles)
        return out
