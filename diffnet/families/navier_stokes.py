"""Steady incompressible Navier–Stokes: the lid-driven cavity over the Reynolds number.

The unit square, the lid y = 1 moving at u = 1 (its corners at rest: the regularised cavity), the other walls at
rest; an instance is the Reynolds number Re (lid speed and side 1, so ν = 1/Re). The unknowns are the velocity
(u, v) and the pressure p, nodal on the Q1 grid, the pressure pinned to 0 at the corner (0, 0) (only its gradient is
defined). The loss is the stabilised Q1 residual's squares (:mod:`diffnet.discretisation.navier_stokes`), a
:class:`~diffnet.protocol.loss.Residual`: no energy has the Navier–Stokes equations as its stationary point. The
floor is the same residual's root on the same grid and the truth that root ``truth_refine`` times finer, both by
Newton with a sparse LU from the nearest rung of a continuation ladder in Re (:mod:`diffnet.solvers.navier_stokes`).

What a fluid engineer reads: the vorticity (recovered to the nodes), the stream function (its Q1 solve), the
pressure made mean-free (``pressure``); and the centreline extrema of Ghia, Ghia & Shin (1982) with the primary
vortex's stream function (``quantities``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from diffnet.discretisation.navier_stokes import navier_stokes_residual, vorticity
from diffnet.protocol.family import Family, ParameterSpec
from diffnet.protocol.loss import Residual
from diffnet.protocol.options import integer_in, option
from diffnet.solvers.classical import q1_to_grid
from diffnet.solvers.hyperelasticity import NewtonStats
from diffnet.solvers.navier_stokes import (RUNG, boundary_tensors, cavity_solve, ladder_solution, nearest_rung,
                                           stream_function)
from diffnet.solvers.sparse_lu import LU_METHODS, available

__all__ = ["CavityFamily"]

VELOCITY = ("u", "v")


def _re_range(v: tuple[float, ...]) -> str | None:
    if len(v) != 2 or not all(np.isfinite(v)) or not 1.0 <= v[0] < v[1] <= 2000.0:
        return (f"need [low, high] with 1 <= low < high <= 2000 (the steady cavity, reached by continuation in Re), "
                f"got {list(v)}")
    return None


def _odd(n: int, axis: str) -> str | None:
    return None if n % 2 else f"{axis}: the centrelines x = 1/2 and y = 1/2 need an odd number of nodes, got {n}"


def _lu(n: int) -> str:
    """The sparse LU of the Newton steps on n x n nodes (three unknowns a node): the fastest installed for that size."""
    return available(3 * n * n)


@lru_cache(maxsize=64)
def _solution(re: float, n: int, lu: str) -> np.ndarray:
    """The root on n x n nodes at ``re`` from the ladder's nearest rung, kept per process (the truth's fine solves
    serve its fields, derived fields and quantities); read-only."""
    out = cavity_solve(re, n, initial=ladder_solution(nearest_rung(re), n, lu), lu=lu)
    out.setflags(write=False)
    return out


@dataclass(frozen=True)
class CavityFamily(Family):
    """The lid-driven cavity on the unit square's node grid (N, N), N odd; fields (S, 3, N, N): u, v, p."""

    resolution: tuple[int, ...]
    re_range: tuple[float, ...] = option((100.0, 1000.0), "range of the Reynolds number Re (lid speed 1, side 1)",
                                         _re_range)
    test_re: tuple[float, ...] = option((100.0, 400.0, 1000.0, 650.0), "the held-out Reynolds numbers (Ghia et al.'s "
                                        "tables are at 100, 400 and 1000)", lambda v: None if len(v) else "need one or more")
    truth_refine: int = option(4, "evaluation: the truth is the same scheme's root on a grid with this many times the "
                               "intervals (2..8)", integer_in(2, 8))

    name = "navier_stokes"
    in_channels = 3  # Re / 1000 and the coordinates
    unknowns = ("u", "v", "p")
    vectors = {"velocity": VELOCITY}
    velocities = ("velocity",)
    capabilities = frozenset({"reference", "floor", "classical", "polish", "derived", "quantities"})
    classical_methods = {"newton-lu": "Newton, each step a sparse LU (PARDISO where installed, from 30,000 unknowns; "
                                      "SuperLU below), from the nearest other Re of the ladder 100, 200, ... already "
                                      "solved, assembly counted"}
    classical_baseline = None

    @classmethod
    def check_options(cls, options: object, *, n_train: int, sampling: str, resolution: tuple[int, ...]) -> None:
        super().check_options(options, n_train=n_train, sampling=sampling, resolution=resolution)
        if len(resolution) != 2 or resolution[0] != resolution[1]:
            raise ValueError(f"problem.resolution: the cavity is the unit square on N x N nodes, got {list(resolution)}")
        bad = _odd(resolution[0], "problem.resolution")
        if bad:
            raise ValueError(bad)
        lo, hi = options.re_range
        outside = [r for r in options.test_re if not lo <= r <= hi]
        if outside:
            raise ValueError(f"test_re: {outside[0]:g} lies outside re_range [{lo:g}, {hi:g}]")

    def fixed_heldout(self) -> np.ndarray:
        return np.asarray(self.test_re, dtype=np.float64)

    def describe(self) -> str:
        lo, hi = self.re_range
        return (f"steady Navier-Stokes, the lid-driven cavity, Re in [{lo:g}, {hi:g}]; stabilised Q1-Q1 "
                f"(SUPG/PSPG/grad-div), Newton-{self.lu}")

    @property
    def lu(self) -> str:
        """The sparse LU of every Newton step on this grid: the fastest installed for its size
        (:func:`~diffnet.solvers.sparse_lu.available`)."""
        return _lu(self.resolution[0])

    @property
    def polish_step(self) -> str:
        return f"{LU_METHODS[self.lu].split(' (')[0]} Newton step"

    # -- instances ------------------------------------------------------------------------
    @property
    def parameters(self) -> ParameterSpec:
        return ParameterSpec("re", (), *self.re_range, positive=True, names=("Re",),
                             description="the Reynolds number Re (lid speed 1, side 1)")

    def check_instances(self, instances) -> None:
        """Every Re inside the family's range (closed): beyond it the network was not trained and the steady solution
        is reached by continuation only from inside."""
        super().check_instances(instances)
        re = np.asarray(instances, dtype=np.float64).reshape(len(instances))
        lo, hi = self.re_range
        bad = np.flatnonzero((re < lo) | (re > hi))
        if bad.size:
            raise ValueError(f"instance {bad[0]}: Re = {re[bad[0]]:g} lies outside the family's range [{lo:g}, {hi:g}] "
                             f"(navier_stokes.re_range)")

    def coordinates(self) -> dict[str, np.ndarray]:
        n = self.resolution[0]
        return {"y": np.linspace(0.0, 1.0, n), "x": np.linspace(0.0, 1.0, n)}

    @property
    def spacing(self) -> tuple[float, float]:
        h = 1.0 / (self.resolution[0] - 1)
        return (h, h)

    def inputs(self, re: torch.Tensor) -> torch.Tensor:
        n = self.resolution[0]
        axis = torch.linspace(0.0, 1.0, n, dtype=re.dtype, device=re.device)
        s = len(re)
        return torch.stack([(re.reshape(s, 1, 1) / 1000.0).expand(s, n, n), axis[:, None].expand(s, n, n),
                            axis[None, :].expand(s, n, n)], dim=1)

    def _boundary(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        fixed, values = boundary_tensors(self.resolution[0])
        return fixed.to(like.device), values.to(like.device, like.dtype)

    def field(self, raw: torch.Tensor, re: torch.Tensor) -> torch.Tensor:
        """The walls' velocities and the pinned pressure imposed by construction; the network gives the rest."""
        fixed, values = self._boundary(raw)
        return torch.where(fixed, values, raw)

    # -- the loss ----------------------------------------------------------------------
    def residual(self, fields: torch.Tensor, re: torch.Tensor) -> torch.Tensor:
        """The stabilised residual (S, 3, N, N), zero at the fixed unknowns, the weak-form integrals over h: its
        squares sum to the loss and approximate the strong residual's integral of squares."""
        fixed, _ = self._boundary(fields)
        r = navier_stokes_residual(fields, 1.0 / re.to(fields.dtype), self.spacing)
        return torch.where(fixed, torch.zeros((), dtype=fields.dtype, device=fields.device),
                           r * (self.resolution[0] - 1))

    def loss_terms(self, fields: torch.Tensor, re: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"residual": self.residual(fields, re).square().sum(dim=(1, 2, 3))}

    def loss(self) -> Residual:
        return Residual(self.loss_terms, self.residual)

    # -- the classical side ---------------------------------------------------------------
    def _solve(self, re: np.ndarray, n: int) -> np.ndarray:
        lu = _lu(n)
        return np.stack([_solution(float(r), n, lu) for r in np.asarray(re, dtype=np.float64).reshape(-1)])

    def reference(self, re: np.ndarray, progress=None) -> np.ndarray:
        return self._solve(re, self.resolution[0])

    def reference_name(self) -> str:
        return f"the stabilised Q1 scheme on this grid (Newton, {LU_METHODS[self.lu]})"

    @property
    def _fine(self) -> int:
        return self.truth_refine * (self.resolution[0] - 1) + 1

    def truth(self, re: np.ndarray, progress=None) -> np.ndarray:
        r = self.truth_refine
        return self._solve(re, self._fine)[..., ::r, ::r]

    def truth_name(self) -> str:
        return f"the same scheme {self.truth_refine}x finer ({self._fine}x{self._fine})"

    def discrete_optimum(self, re: np.ndarray, initial: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        if initial is None:
            return self.reference(re), np.ones(len(re), dtype=bool)
        n = self.resolution[0]
        return (np.stack([cavity_solve(float(r), n, initial=u, lu=self.lu) for r, u in zip(np.ravel(re), initial)]),
                np.ones(len(re), dtype=bool))

    def floor_name(self) -> str:
        return "the scheme's root on this grid"

    def polish(self, re: np.ndarray, fields: np.ndarray, k: int) -> np.ndarray:
        """``k`` Newton steps (each a sparse LU) from the network's fields (S, 3, N, N)."""
        n = self.resolution[0]
        return np.stack([cavity_solve(float(r), n, initial=u, steps=k, lu=self.lu)
                         for r, u in zip(np.ravel(re), np.asarray(fields, dtype=np.float64))])

    def classical_configurations(self) -> dict[str, list[int]]:
        return {"newton-lu": [n for n in (17, 33, 65, 129, 257) if n <= 2 * self.resolution[0]]}

    def classical_solver(self, method: str, grid: int) -> "CavitySolve":
        """Newton from the nearest other rung on ``grid``; the ladder up to the range's top is solved here, before
        any solve is timed (a user sweeping Re has solved it)."""
        if method not in self.classical_methods:
            raise ValueError(f"unknown method {method!r}; choose from {', '.join(self.classical_methods)}")
        lu = _lu(grid)
        ladder_solution(RUNG * float(np.ceil(self.re_range[1] / RUNG)), grid, lu)
        return CavitySolve(grid, lu)

    def classical_to_grid(self, method: str, native: np.ndarray, re: np.ndarray) -> np.ndarray:
        """A solution carried onto this grid's nodes, unknown by unknown (bilinear on its elements)."""
        return np.stack([q1_to_grid(self, component) for component in native])

    # -- what a fluid engineer reads ------------------------------------------------------
    def derived(self, re, fields) -> dict:
        """Vorticity (recovered to the nodes), stream function (its Q1 solve), and the pressure with its mean over the
        square removed (its trapezoidal mean, the Q1 integral), each (S, N, N)."""
        fields = np.asarray(fields, dtype=np.float64)
        n = fields.shape[-1]
        h = 1.0 / (n - 1)
        weights = np.outer(*[np.r_[0.5, np.ones(n - 2), 0.5] * h] * 2)
        p = fields[:, 2]
        return {"vorticity": vorticity(fields, (h, h)), "stream_function": stream_function(fields),
                "pressure": p - (p * weights).sum(axis=(1, 2))[:, None, None]}

    def truth_derived(self, re) -> dict:
        """The truth's derived fields from its own fine solution, read at this grid's nodes."""
        r = self.truth_refine
        return {k: v[..., ::r, ::r] for k, v in self.derived(re, self._solve(re, self._fine)).items()}

    def quantities(self, re, fields) -> dict:
        """Ghia, Ghia & Shin's (1982) centreline extrema: the least u on x = 1/2, the least and largest v on y = 1/2;
        and the primary vortex's stream function, the least ψ."""
        fields = np.asarray(fields, dtype=np.float64)
        c = fields.shape[-1] // 2
        return {"u_min": fields[:, 0, :, c].min(axis=1), "v_min": fields[:, 1, c, :].min(axis=1),
                "v_max": fields[:, 1, c, :].max(axis=1), "psi_min": stream_function(fields).min(axis=(1, 2))}

    def truth_quantities(self, re) -> dict:
        return self.quantities(re, self._solve(re, self._fine))


@dataclass
class CavitySolve:
    """A classical solve of one instance on ``grid`` nodes a side: Newton with a sparse LU from the ladder's nearest
    rung other than the instance itself (50-100 apart in Re), which is solved once per process and not timed (a
    user sweeping Re has it); the Jacobians' assembly and every factorisation are inside the call. ``last`` is the
    latest call's :class:`NewtonStats`."""

    grid: int
    lu: str
    last: NewtonStats | None = None

    def __call__(self, re: np.ndarray) -> np.ndarray:
        r = float(np.asarray(re).reshape(()))
        start = ladder_solution(nearest_rung(r, other=True), self.grid, self.lu)
        steps: list = []
        out = cavity_solve(r, self.grid, initial=start, lu=self.lu, stats=steps)
        self.last = NewtonStats(newton_steps=len(steps))
        return out

