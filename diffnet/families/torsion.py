"""A family over shapes: the torsion problem -Δu = 1 in a star-shaped domain, u = 0 on its boundary,
the shape the only parameter.

The domain is r < r(θ) = r0 (1 + Σ_k a_k cos kθ + b_k sin kθ) about the unit square's centre; an
instance is its 2K Fourier coefficients. The network reads the signed distance on the grid (and the
coordinates); its field lives on the immersed Q1 space of the shape (:mod:`diffnet.discretisation.immersed`: cut-cell
quadrature, Nitsche's boundary terms), whose minimiser is the floor; the truth is a body-fitted P1
solve on a triangulation of the true shape (:mod:`diffnet.solvers.bodyfitted`). The torsion of a
disc, u = (R² - r²)/4, is its closed-form check (tests/science/test_geometry.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from diffnet.protocol.family import Family, ParameterSpec
from diffnet.instances.geometry import Star, grid_points
from diffnet.discretisation.immersed import immersed_energy
from diffnet.protocol.options import integer_in, option, positive
from diffnet.families.immersed_family import ImmersedFamily

__all__ = ["StarTorsionFamily"]

_CENTRE = (0.5, 0.5)


@dataclass(frozen=True)
class StarTorsionFamily(ImmersedFamily, Family):
    """-Δu = 1 in a star-shaped domain of the unit square, u = 0 on its boundary; the instance is the shape."""

    resolution: tuple[int, int]
    modes: int = option(3, "K: Fourier modes of the boundary (an instance is a_1..a_K, b_1..b_K)", integer_in(1, 8))
    r0: float = option(0.3, "the star's mean radius r0 (its centre is (0.5, 0.5))", positive)
    amplitude: float = option(0.08, "each coefficient's range [-A, A]", positive)
    truth_refine: int = option(4, "evaluation: the body-fitted (P1) reference's mesh is this many times finer than "
                               "the grid (2..16)", integer_in(2, 16))

    name = "torsion"
    in_channels = 3  # the signed distance, y, x
    dims = 2
    source = 1.0  # -Δu = 1; u = 0 on the star (cut_condition's default)

    @classmethod
    def check_options(cls, options, *, n_train: int, sampling: str, resolution: tuple[int, ...]) -> None:
        spread = 2 * options.modes * options.amplitude
        if not (options.r0 * (1 - spread) > 0 and options.r0 * (1 + spread) < 0.5):
            raise ValueError(f"amplitude: with r0 = {options.r0} and {options.modes} modes the radius r0 (1 ± 2KA) "
                             f"spans [{options.r0 * (1 - spread):g}, {options.r0 * (1 + spread):g}]; it must stay in "
                             "(0, 0.5), inside the unit square")

    def describe(self) -> str:
        return f"-lap u = 1 on stars r0={self.r0}, K={self.modes}, coefficients in [-{self.amplitude}, {self.amplitude}]"

    @property
    def parameters(self) -> ParameterSpec:
        k = self.modes
        names = tuple(f"a{i}" for i in range(1, k + 1)) + tuple(f"b{i}" for i in range(1, k + 1))
        return ParameterSpec("shape", (2 * k,), -self.amplitude, self.amplitude, names=names,
                             description="Fourier coefficients of the boundary radius")

    def shape(self, instances: np.ndarray) -> Star:
        """The domain of one instance (2K coefficients)."""
        p = np.asarray(instances, dtype=np.float64)
        return Star(_CENTRE, self.r0, tuple(p[: self.modes]), tuple(p[self.modes:]))

    def check_instances(self, instances: np.ndarray) -> None:
        """Each shape within the family's range, inside the unit square with a cell to spare, and no thinner
        than the grid resolves (its smallest radius at least two cells)."""
        super().check_instances(instances)
        h = 1.0 / (min(self.resolution) - 1)
        rows = np.asarray(instances, dtype=np.float64).reshape(len(instances), -1)
        bad = np.argwhere(np.abs(rows) > self.amplitude)
        if len(bad):  # a shape outside the family is not extrapolated: its geometry may not even be a star
            i, j = bad[0]
            raise ValueError(f"instance {i}: {self.parameters.names[j]} = {rows[i, j]:g} is outside the shapes' range "
                             f"[-{self.amplitude:g}, {self.amplitude:g}]")
        for i, p in enumerate(rows):
            star = self.shape(p)
            radii = star.radius(np.linspace(0.0, 2.0 * np.pi, 2048, endpoint=False))[0]
            if radii.min() < 2 * h:
                raise ValueError(f"instance {i}: the shape's smallest radius {radii.min():.3g} is under two cells "
                                 f"({2 * h:.3g}) of the {'x'.join(map(str, self.resolution))} grid: thinner than it resolves")
            if radii.max() > 0.5 - h:
                raise ValueError(f"instance {i}: the shape reaches {radii.max():.3g} from the centre, within a cell of "
                                 "the unit square's side; it must lie inside the grid")

    # -- the loss -----------------------------------------------------------------------
    def loss_terms(self, u: torch.Tensor, instances: torch.Tensor) -> dict[str, torch.Tensor]:
        """The immersed energy ∫ ½|∇u|² - u (+ Nitsche's terms), divided per instance by the magnitude of a
        disc's of equal area, A²/(16π) (the energy at the solution is about -1)."""
        data = self._data(instances)
        nu = torch.ones_like(u)
        scale = torch.as_tensor([d.cells.area() ** 2 / (16 * np.pi) for d in data], dtype=u.dtype, device=u.device)
        return {"energy": immersed_energy(u, nu, data, f=self.source) / scale}

    def derived(self, instances: np.ndarray, fields: np.ndarray) -> dict[str, np.ndarray]:
        """The shear stresses per unit 2Gθ (G the shear modulus, θ the twist per length), τ_xz = ∂u/∂y and
        τ_yz = -∂u/∂x of Prandtl's stress function u (-Δu = 1 here, -Δφ = 2Gθ in the usual scaling), and their
        magnitude, at the inside nodes (:meth:`~diffnet.families.immersed_family.ImmersedFamily.gradients`)."""
        grad = self.gradients(instances, fields)
        return {"tau_xz": grad[:, 1], "tau_yz": -grad[:, 0], "tau": np.hypot(grad[:, 0], grad[:, 1])}

    # -- the references -----------------------------------------------------------------
    def body_fitted(self, instances: np.ndarray, h: float) -> np.ndarray:
        from diffnet.solvers.bodyfitted import Loop, body_fitted_solve

        star = self.shape(instances)
        n = max(64, int(np.ceil(2 * np.pi * star.r0 * 2 / h)))  # boundary vertices about h apart
        solution = body_fitted_solve([Loop(star.boundary(n), np.zeros(n, dtype=int))], {0: ("u", 0.0)}, h, f=1.0)
        sdf = star.on_grid(self.resolution)
        out = np.zeros(self.resolution)
        inside = sdf <= 0
        out[inside] = solution.at(grid_points(self.resolution)[inside])
        return out
