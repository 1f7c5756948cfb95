"""Steady incompressible Navier–Stokes past a cylinder: the DFG benchmark 2D-1 (Schäfer & Turek 1996), the
cylinder's centre and radius the instance.

The channel [0, 2.2] x [0, 0.41] on an (N_y, N_x) node grid, ν = 10⁻³, the parabolic inflow of peak 0.3 at x = 0, the
walls at rest, the do-nothing outflow at x = 2.2 (:mod:`diffnet.solvers.cylinder`); the cylinder (x, y, r) is cut out
of the grid and its wall held by Nitsche's terms (:mod:`diffnet.discretisation.immersed_flow`). The unknowns u, v, p
are nodal on the Q1 grid; the nodes no fluid element touches are held at 0, those of the cut elements inside the
cylinder are unknowns of the scheme (reported zero: the field lives in the fluid, the ``domain``). The loss is the
stabilised residual's squares, a :class:`~diffnet.protocol.loss.Residual`. The floor is the same residual's root on
the same grid and the truth that root ``truth_refine`` times finer, both by Newton with a sparse LU.

What a fluid engineer reads: the vorticity (recovered to the nodes) and the benchmark's quantities, the drag and
lift coefficients (the force on the cylinder over ½ U_mean² D) and the pressure drop across the cylinder.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from diffnet.discretisation.navier_stokes import vorticity
from diffnet.protocol.family import Family, ParameterSpec
from diffnet.protocol.loss import Residual
from diffnet.protocol.options import integer_in, interval, option
from diffnet.solvers.classical import q1_to_grid
from diffnet.solvers.cylinder import (BENCHMARK, HEIGHT, LENGTH, NU, channel, channel_boundary, channel_residual,
                                      coefficients, cylinder_solve, discretised, extended)
from diffnet.solvers.hyperelasticity import NewtonStats
from diffnet.solvers.sparse_lu import LU_METHODS, available

__all__ = ["CylinderFamily", "cylinder_error"]

VELOCITY = ("u", "v")
QUANTITIES = ("drag", "lift", "pressure_drop")


def cylinder_error(x: float, y: float, r: float, spacing: tuple[float, float]) -> str | None:
    """What keeps the cylinder (x, y, r) from being resolved in the channel on a grid of ``spacing`` (h_x, h_y): under
    two cells across, or within a cell of a wall, the inflow or the outflow (None when it is fine)."""
    h = max(spacing)
    if r < h:
        return f"the cylinder's radius {r:.3g} is under a cell ({h:.3g}): thinner than the grid resolves"
    if min(y - r, HEIGHT - y - r, x - r, LENGTH - x - r) < h:
        return (f"the cylinder (x {x:.3g}, y {y:.3g}, r {r:.3g}) touches or comes within a cell ({h:.3g}) of the "
                f"channel's walls [0, {LENGTH}] x [0, {HEIGHT}]; it must lie inside the flow")
    return None


def _spacing(resolution) -> tuple[float, float]:
    ny, nx = resolution
    return LENGTH / (nx - 1), HEIGHT / (ny - 1)


@lru_cache(maxsize=256)
def _solution(geometry: tuple[float, float, float], resolution: tuple[int, int]) -> np.ndarray:
    """The root around ``geometry`` on ``resolution``, kept per process (the truth's fine solves serve its fields,
    derived fields and quantities); read-only."""
    out = cylinder_solve(geometry, resolution)
    out.setflags(write=False)
    return out


@lru_cache(maxsize=1024)
def _held(geometry: tuple[float, float, float], resolution: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~diffnet.solvers.cylinder.channel_boundary` of one cylinder as tensors, built once per process (the field
    and the residual need them at every training step); never written."""
    return tuple(torch.as_tensor(a) for a in channel_boundary(resolution, discretised(geometry, resolution).active))


def _rows(instances) -> np.ndarray:
    """Instances, a tensor or an array, as float64 rows (S, 3)."""
    if isinstance(instances, torch.Tensor):
        instances = instances.detach().cpu().double().numpy()
    return np.asarray(instances, dtype=np.float64).reshape(-1, 3)


def _key(row) -> tuple[float, float, float]:
    return tuple(float(v) for v in np.ravel(row))


def _at_nodes(fine: np.ndarray, refine: int) -> np.ndarray:
    return fine[..., ::refine, ::refine]


@dataclass(frozen=True)
class CylinderFamily(Family):
    """The DFG 2D-1 channel on an (N_y, N_x) node grid; fields (S, 3, N_y, N_x): u, v, p."""

    resolution: tuple[int, ...]
    cylinder_x: tuple[float, ...] = option((0.15, 0.25), "range of the cylinder's centre x", interval)
    cylinder_y: tuple[float, ...] = option((0.15, 0.25), "range of the cylinder's centre y", interval)
    cylinder_r: tuple[float, ...] = option((0.04, 0.06), "range of the cylinder's radius", interval)
    test_cylinders: tuple[float, ...] = option(
        (*BENCHMARK, 0.17, 0.23, 0.045, 0.235, 0.175, 0.057, 0.16, 0.16, 0.055),
        "the held-out cylinders, x, y, r one after another (the first the benchmark's: centre (0.2, 0.2), radius 0.05)",
        lambda v: None if len(v) and len(v) % 3 == 0 else "need x, y, r for each cylinder (a multiple of 3 numbers)")
    truth_refine: int = option(4, "evaluation: the truth is the same scheme's root on a grid with this many times the "
                               "intervals (2..8)", integer_in(2, 8))

    name = "cylinder"
    in_channels = 3  # the signed distance to the cylinder's wall, y, x
    unknowns = ("u", "v", "p")
    vectors = {"velocity": VELOCITY}
    velocities = ("velocity",)
    capabilities = frozenset({"reference", "floor", "classical", "polish", "domain", "derived", "quantities"})
    classical_methods = {"newton-lu": "Newton, each step a sparse LU (PARDISO where installed, from 30,000 unknowns; "
                                      "SuperLU below), from the inflow profile (fewer steps than from the nearest "
                                      "solved cylinder), assembly counted"}
    classical_baseline = None

    @classmethod
    def check_options(cls, options: object, *, n_train: int, sampling: str, resolution: tuple[int, ...]) -> None:
        super().check_options(options, n_train=n_train, sampling=sampling, resolution=resolution)
        if len(resolution) != 2:
            raise ValueError(f"problem.resolution: the channel is 2-D, [N_y, N_x]; got {list(resolution)}")
        hx, hy = _spacing(resolution)
        if not 0.7 <= hx / hy <= 1.4:
            raise ValueError(f"problem.resolution: the channel's cells are {hx:.4g} x {hy:.4g} (2.2 x 0.41 over "
                             f"{list(resolution)}); take N_x - 1 near 5.4 (N_y - 1) for cells near square, e.g. [33, 177]")
        (x0, x1), (y0, y1), (r0, r1) = options.cylinder_x, options.cylinder_y, options.cylinder_r
        for x, y in ((x0, y0), (x1, y1), (x0, y1), (x1, y0)):
            error = cylinder_error(x, y, r1, (hx, hy)) or cylinder_error(x, y, r0, (hx, hy))
            if error:
                raise ValueError(f"cylinder ranges: {error}")
        tests = np.asarray(options.test_cylinders, dtype=np.float64).reshape(-1, 3)
        for k, (x, y, r) in enumerate(tests):
            if not (x0 <= x <= x1 and y0 <= y <= y1 and r0 <= r <= r1):
                raise ValueError(f"test_cylinders: cylinder {k} (x {x:g}, y {y:g}, r {r:g}) lies outside the ranges "
                                 f"cylinder_x {list(options.cylinder_x)}, cylinder_y {list(options.cylinder_y)}, "
                                 f"cylinder_r {list(options.cylinder_r)}")

    def fixed_heldout(self) -> np.ndarray:
        return np.asarray(self.test_cylinders, dtype=np.float64).reshape(-1, 3)

    def describe(self) -> str:
        return (f"steady Navier-Stokes past a cylinder (DFG 2D-1, Re 20 at r 0.05), centre x in "
                f"{list(self.cylinder_x)}, y in {list(self.cylinder_y)}, r in {list(self.cylinder_r)}; stabilised Q1-Q1 "
                f"on cut cells, Nitsche's wall, Newton-{self.lu}")

    @property
    def lu(self) -> str:
        """The sparse LU of every Newton step on this grid (:func:`~diffnet.solvers.sparse_lu.available`)."""
        return available(3 * int(np.prod(self.resolution)))

    @property
    def polish_step(self) -> str:
        return f"{LU_METHODS[self.lu].split(' (')[0]} Newton step"

    # -- instances ------------------------------------------------------------------------
    @property
    def parameters(self) -> ParameterSpec:
        return ParameterSpec("cylinder", (3,), (self.cylinder_x[0], self.cylinder_y[0], self.cylinder_r[0]),
                             (self.cylinder_x[1], self.cylinder_y[1], self.cylinder_r[1]), names=("x", "y", "r"),
                             description="the cylinder's centre (x, y) and radius r",
                             limits=((0.0, 0.0, 0.0), (LENGTH, HEIGHT, HEIGHT / 2)))

    def check_instances(self, instances) -> None:
        """Each cylinder two cells across at least, and a cell clear of the walls, the inflow and the outflow."""
        super().check_instances(instances)
        for i, (x, y, r) in enumerate(_rows(instances)):
            error = cylinder_error(x, y, r, self.spacing)
            if error:
                raise ValueError(f"instance {i}: {error}")

    def coordinates(self) -> dict[str, np.ndarray]:
        ny, nx = self.resolution
        return {"y": np.linspace(0.0, HEIGHT, ny), "x": np.linspace(0.0, LENGTH, nx)}

    @property
    def spacing(self) -> tuple[float, float]:
        return _spacing(self.resolution)

    def _data(self, instances) -> list:
        return [discretised(row, self.resolution) for row in _rows(instances)]

    def domain(self, instances) -> np.ndarray:
        """The signed distance to the cylinder's wall at the nodes (S, N_y, N_x), negative in the fluid."""
        return np.stack([d.cells.sdf for d in self._data(instances)])

    def inputs(self, instances: torch.Tensor) -> torch.Tensor:
        """The signed distance over the channel's height, then y and x over their lengths."""
        sdf = torch.as_tensor(self.domain(instances), dtype=instances.dtype, device=instances.device) / HEIGHT
        c = self.coordinates()
        y = torch.as_tensor(c["y"] / HEIGHT, dtype=instances.dtype, device=instances.device)
        x = torch.as_tensor(c["x"] / LENGTH, dtype=instances.dtype, device=instances.device)
        return torch.stack([sdf, y[:, None].expand(sdf.shape), x[None, :].expand(sdf.shape)], dim=1)

    def _boundary(self, instances, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = [_held(_key(row), tuple(self.resolution)) for row in _rows(instances)]
        fixed = torch.stack([f for f, _ in pairs]).to(like.device)
        values = torch.stack([v for _, v in pairs]).to(like.device, like.dtype)
        return fixed, values

    def field(self, raw: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
        """The walls' and inflow's velocities and the inactive nodes' zeros imposed by construction; the network
        gives the rest."""
        fixed, values = self._boundary(instances, raw)
        return torch.where(fixed, values, raw)

    # -- the loss ----------------------------------------------------------------------
    def residual(self, fields: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
        """The stabilised residual (S, 3, N_y, N_x), zero at the fixed unknowns, the weak-form integrals over the
        cell's size: its squares sum to the loss and approximate the strong residual's integral of squares."""
        fixed, values = self._boundary(instances, fields)
        r = channel_residual(fields, self._data(instances), fixed, values)
        return torch.where(fixed, torch.zeros((), dtype=fields.dtype, device=fields.device),
                           r * float(np.sqrt(np.prod(self.spacing))))

    def loss_terms(self, fields: torch.Tensor, instances: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"residual": self.residual(fields, instances).square().sum(dim=(1, 2, 3))}

    def loss(self) -> Residual:
        return Residual(self.loss_terms, self.residual)

    # -- the classical side ---------------------------------------------------------------
    def _solve(self, instances, resolution) -> np.ndarray:
        return np.stack([_solution(_key(row), tuple(resolution)) for row in _rows(instances)])

    def reference(self, instances: np.ndarray, progress=None) -> np.ndarray:
        return self._solve(instances, self.resolution)

    def reference_name(self) -> str:
        return f"the stabilised Q1 scheme on this grid's cut cells (Newton, {LU_METHODS[self.lu]})"

    @property
    def _fine(self) -> tuple[int, int]:
        return tuple(self.truth_refine * (n - 1) + 1 for n in self.resolution)

    def truth(self, instances: np.ndarray, progress=None) -> np.ndarray:
        out = []
        for k, row in enumerate(_rows(instances)):
            out.append(_at_nodes(_solution(_key(row), self._fine), self.truth_refine))
            if progress is not None:
                progress(k + 1, len(instances))
        return np.stack(out)

    def truth_name(self) -> str:
        return f"the same scheme {self.truth_refine}x finer ({'x'.join(map(str, self._fine))})"

    def discrete_optimum(self, instances: np.ndarray, initial: np.ndarray | None = None):
        if initial is None:
            return self.reference(instances), np.ones(len(instances), dtype=bool)
        return (np.stack([cylinder_solve(_key(p), self.resolution, initial=extended(_key(p), u), lu=self.lu)
                          for p, u in zip(_rows(instances), initial)]),
                np.ones(len(instances), dtype=bool))

    def floor_name(self) -> str:
        return "the scheme's root on this grid"

    def polish(self, instances: np.ndarray, fields: np.ndarray, k: int) -> np.ndarray:
        """``k`` Newton steps (each a sparse LU) from the network's fields (S, 3, N_y, N_x)."""
        return np.stack([cylinder_solve(_key(p), self.resolution, initial=u, steps=k, lu=self.lu)
                         for p, u in zip(_rows(instances), np.asarray(fields, dtype=np.float64))])

    def classical_configurations(self) -> dict[str, list[int]]:
        """Grids by their N_y (N_x follows the channel's aspect): up to twice this one's."""
        return {"newton-lu": [n for n in (17, 33, 65, 129) if n <= 2 * self.resolution[0]]}

    def _classical_resolution(self, grid: int) -> tuple[int, int]:
        ny, nx = self.resolution
        return grid, round((nx - 1) * (grid - 1) / (ny - 1)) + 1

    def classical_solver(self, method: str, grid: int) -> "CylinderSolve":
        if method not in self.classical_methods:
            raise ValueError(f"unknown method {method!r}; choose from {', '.join(self.classical_methods)}")
        return CylinderSolve(self._classical_resolution(grid), self)

    def classical_to_grid(self, method: str, native: np.ndarray, instances) -> np.ndarray:
        """A solution on another grid carried onto this one's nodes, unknown by unknown (bilinear on its elements)."""
        return np.stack([q1_to_grid(self, component) for component in native])

    # -- what a fluid engineer reads ------------------------------------------------------
    def derived(self, instances, fields) -> dict:
        """The vorticity (S, N_y, N_x), recovered to the nodes from the field extended past the wall; zero outside
        the fluid."""
        fluid = self.domain(instances) <= 0.0
        return {"vorticity": vorticity(self._extended(instances, fields), self.spacing) * fluid}

    def _extended(self, instances, fields) -> np.ndarray:
        return np.stack([extended(_key(p), u) for p, u in zip(_rows(instances),
                                                               np.asarray(fields, dtype=np.float64))])

    def truth_derived(self, instances) -> dict:
        """The truth's vorticity from its own fine solution, read at this grid's nodes."""
        fine = self._solve(instances, self._fine)
        fluid = self.domain(instances) <= 0.0
        return {"vorticity": _at_nodes(vorticity(fine, _spacing(self._fine)), self.truth_refine) * fluid}

    def quantities(self, instances, fields) -> dict:
        """Drag and lift coefficients and the pressure drop p(x - r, y) - p(x + r, y) of each field, extended past
        the wall (:func:`~diffnet.solvers.cylinder.extended`)."""
        rows = _rows(instances)
        values = [coefficients(_key(p), u) for p, u in zip(rows, self._extended(rows, fields))]
        return {k: np.array([v[k] for v in values]) for k in QUANTITIES}

    def truth_quantities(self, instances) -> dict:
        rows = _rows(instances)
        values = [coefficients(_key(p), u) for p, u in zip(rows, self._solve(rows, self._fine))]
        return {k: np.array([v[k] for v in values]) for k in QUANTITIES}


@dataclass
class CylinderSolve:
    """A classical solve of one cylinder on ``resolution``: Newton with a sparse LU from the inflow profile, the
    Jacobians' assembly and every factorisation inside the call. Not from the solution around the nearest cylinder
    already solved, the continuation a user sweeping the geometry would try: with the wall moved, that start is the
    worse one (6.2 Newton steps on 33 x 177 from the nearest of a lattice of centres every 0.05 and radii every
    0.01, against 5 from the inflow profile, measured 2026-12-07). ``last``: the latest call's :class:`NewtonStats`."""

    resolution: tuple[int, int]
    family: CylinderFamily
    last: NewtonStats | None = None

    def __call__(self, instance: np.ndarray) -> np.ndarray:
        steps: list = []
        out = cylinder_solve(_key(instance), self.resolution, stats=steps)
        self.last = NewtonStats(newton_steps=len(steps))
        return out
