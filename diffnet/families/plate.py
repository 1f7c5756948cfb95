"""The KL Poisson family on a plate with a hole: -∇·(ν∇u) = 0 on the unit square minus a disc whose
centre and radius are part of the instance, with the box's conditions per side and an insulated hole
(or a Dirichlet value on it).

An instance is the m KL coefficients of ν (as :mod:`diffnet.families.poisson`) followed by the hole's
centre (x, y) and radius, each in its own training range. The network reads log ν and the signed
distance; the loss is the immersed Q1 energy (:mod:`diffnet.discretisation.immersed`: cut cells around the hole,
Nitsche's terms where the hole carries a value) less the box fluxes' work; the floor is the same-grid
immersed solution, the truth a body-fitted P1 FEM on a triangulation of the plate with its hole.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from diffnet.instances.boundary import BoxBoundary, Side, parse_side, side_check
from diffnet.protocol.family import Family, ParameterSpec
from diffnet.instances.geometry import Box, Difference, Disc, grid_points, check_hole_range, hole_error
from diffnet.discretisation.immersed import immersed_energy
from diffnet.instances.kl import kl_modes
from diffnet.protocol.options import integer_in, interval, option
from diffnet.families.immersed_family import ImmersedFamily
from diffnet.families.poisson import PoissonFamily

__all__ = ["PlateWithHoleFamily"]


def _hole_check(text: str) -> str | None:
    error = side_check(text)
    if error is None and parse_side(text).kind == "flux" and parse_side(text).value != 0.0:
        return "the hole is insulated (\"flux=0\") or holds a value (\"u=VALUE\")"
    return error


@dataclass(frozen=True)
class PlateWithHoleFamily(ImmersedFamily, PoissonFamily):
    """-∇·(ν∇u) = 0 on the unit square minus a disc (the instance's last three entries: centre x, y and
    radius), ν from the KL family (the first ``kl_terms`` entries), conditions per side of the square
    (default u = 1 at x = 0, u = 0 at x = 1, insulated y sides) and on the hole (default insulated)."""

    hole_x: tuple[float, ...] = option((0.35, 0.65), "range of the hole's centre x", interval)
    hole_y: tuple[float, ...] = option((0.35, 0.65), "range of the hole's centre y", interval)
    hole_r: tuple[float, ...] = option((0.1, 0.2), "range of the hole's radius", interval)
    hole: str = option("flux=0", "the hole's boundary: \"flux=0\" (insulated) or \"u=VALUE\"", _hole_check)
    truth_refine: int = option(4, "evaluation: the body-fitted (P1) reference's mesh is this many times finer than "
                               "the grid (2..16)", integer_in(2, 16))

    name = "plate"
    in_channels = 4  # log nu, the signed distance, y, x
    capabilities = ImmersedFamily.capabilities | {"input_fields"}
    tile_loss_terms = Family.tile_loss_terms  # the whole grid's loss from the gathered tiles

    @classmethod
    def check_options(cls, options, *, n_train: int, sampling: str, resolution: tuple[int, ...]) -> None:
        super().check_options(options, n_train=n_train, sampling=sampling, resolution=resolution)
        check_hole_range(options.hole_x, options.hole_y, options.hole_r)

    def describe(self) -> str:
        return (f"{super().describe()} hole x in {list(self.hole_x)}, y in {list(self.hole_y)}, r in "
                f"{list(self.hole_r)}, {self.hole}")

    @property
    def parameters(self) -> ParameterSpec:
        m = self.kl_terms
        lo, hi = self.coeff_range
        names = tuple(f"a{i}" for i in range(1, m + 1)) + ("hole_x", "hole_y", "hole_r")
        return ParameterSpec("p", (m + 3,), (lo,) * m + (self.hole_x[0], self.hole_y[0], self.hole_r[0]),
                             (hi,) * m + (self.hole_x[1], self.hole_y[1], self.hole_r[1]), names=names,
                             description="KL coefficients and the hole (x, y, r)")

    def draw(self, n: int, distribution: str, seed: int) -> np.ndarray:
        return Family.draw(self, n, distribution, seed)

    def shape(self, instances: np.ndarray) -> Difference:
        """The plate of one instance: the square (and beyond) less its hole."""
        x, y, r = np.asarray(instances, dtype=np.float64)[self.kl_terms:]
        return Difference(Box((-1.0, -1.0), (2.0, 2.0)), Disc((x, y), r))

    def check_instances(self, instances: np.ndarray) -> None:
        """Each hole within the family's ranges, at least two cells across and a cell clear of the plate's sides."""
        Family.check_instances(self, instances)
        spec = self.parameters
        low, high = spec.bounds()
        for i, p in enumerate(np.asarray(instances, dtype=np.float64)):
            for j in range(self.kl_terms, self.kl_terms + 3):  # the hole's entries: a range of shapes, not extrapolated
                if not low[j] <= p[j] <= high[j]:
                    raise ValueError(f"instance {i}: {spec.names[j]} = {p[j]:g} is outside the holes' range "
                                     f"[{low[j]:g}, {high[j]:g}]")
            error = hole_error(*p[self.kl_terms:], self.resolution)
            if error is not None:
                raise ValueError(f"instance {i}: {error}")

    # -- the diffusivity and the network's inputs -----------------------------------------
    def diffusivity(self, instances: torch.Tensor) -> torch.Tensor:
        """Nodal ν (S, N_y, N_x) of the instances' KL coefficients (their first ``kl_terms`` entries)."""
        return super().diffusivity(instances[:, : self.kl_terms])

    def input_fields(self, instances: np.ndarray) -> tuple[np.ndarray, list[str]]:
        labels = [f"ν, hole ({p[-3]:.2f}, {p[-2]:.2f}), r {p[-1]:.2f}" for p in np.asarray(instances)]
        return np.log10(self.diffusivity_numpy(instances)), labels

    def input_channels(self, instances: torch.Tensor, sdf: torch.Tensor) -> list[torch.Tensor]:
        return [torch.log(self.diffusivity(instances)), sdf]

    def coefficient(self, instances: np.ndarray) -> np.ndarray:
        return self.diffusivity_numpy(np.asarray(instances)[None])[0]

    # -- the field and the loss ---------------------------------------------------------------
    def field(self, raw: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
        """The lift of the sides' values plus the network's output off the Dirichlet nodes, on the active nodes."""
        return PoissonFamily.field(self, raw, instances) * self._active(instances, raw)

    @property
    def cut_condition(self) -> Side:
        """The hole's condition (``hole``)."""
        return parse_side(self.hole)

    @property
    def box_conditions(self) -> BoxBoundary:
        return self.boundary

    def loss_terms(self, u: torch.Tensor, instances: torch.Tensor) -> dict[str, torch.Tensor]:
        """The immersed energy less the sides' fluxes' work, divided by the lift's energy on the whole square."""
        nu = self.diffusivity(instances.to(u.dtype))
        _, lift, _ = self._boundary_fields(u)
        energy = immersed_energy(u, nu, self._data(instances), **self._energy_arguments())
        return {"energy": (energy - self._flux_work(u)) / self._scale(lift, nu)}

    hessian = ImmersedFamily.hessian  # the cut domain's, not the box's stencil of the KL family
    # -- the body-fitted truth ------------------------------------------------------------
    def body_fitted(self, instances: np.ndarray, h: float) -> np.ndarray:
        from diffnet.solvers.bodyfitted import Loop, body_fitted_solve

        m = self.kl_terms
        a = np.asarray(instances, dtype=np.float64)
        x0, y0, r = a[m:]
        n = max(4, int(np.ceil(1.0 / h)))
        s = np.linspace(0.0, 1.0, n, endpoint=False)
        one, zero = np.ones(n), np.zeros(n)
        # The square counter-clockwise from (0, 0): y0, x1, y1, x0 (tags 0..3), then the hole (tag 4).
        square = np.concatenate([np.stack([s, zero], 1), np.stack([one, s], 1), np.stack([1 - s, one], 1),
                                 np.stack([zero, 1 - s], 1)])
        tags = np.repeat([0, 1, 2, 3], n)
        k = max(16, int(np.ceil(2 * np.pi * r / h)))
        theta = np.linspace(0.0, 2.0 * np.pi, k, endpoint=False)
        hole = np.stack([x0 + r * np.cos(theta), y0 + r * np.sin(theta)], 1)[::-1]  # clockwise
        sides = self.boundary.sides
        side = parse_side(self.hole)
        conditions = {0: (sides["y0"].kind, sides["y0"].value), 1: (sides["x1"].kind, sides["x1"].value),
                      2: (sides["y1"].kind, sides["y1"].value), 3: (sides["x0"].kind, sides["x0"].value),
                      4: (side.kind, side.value)}
        lam, _ = kl_modes(self.eta, m, np.zeros(1))

        def nu(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            phx, phy = kl_modes(self.eta, m, x.ravel())[1], kl_modes(self.eta, m, y.ravel())[1]
            return np.exp(((a[:m] * lam)[:, None] * phx * phy).sum(0)).reshape(x.shape)

        solution = body_fitted_solve([Loop(square, tags), Loop(hole, np.full(k, 4), hole=(x0, y0))], conditions, h,
                                     nu=nu)
        inside = self.shape(a).on_grid(self.resolution) <= 0
        out = np.zeros(self.resolution)
        out[inside] = solution.at(grid_points(self.resolution)[inside])
        return out
