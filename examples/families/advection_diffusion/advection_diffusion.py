"""A transport family written outside DeepFusion against diffnet's public API (docs/families.md).

u_t + v u_x = eps u_xx on x in [0, 1], t in [0, T]: a Gaussian pulse u0(x) = exp(-(x - x0)^2 / (2 s0^2))
carried at a parametric speed v in [0.5, 1.5] and spread by a small diffusion. u = 0 at the inflow
x = 0; x = 1 is an outflow. The loss is the residual of an implicit scheme on the network's
space-time grid (BDF2 in t, after one backward-Euler row; second-order upwind differences for u_x;
central ones for u_xx), so its zero is that scheme's solution: the floor. The reference is the
exact solution on the whole line, the pulse moving at v and widening as s(t)^2 = s0^2 + 2 eps t
(with the defaults it stays more than four widths from both ends, where it is below 2e-4).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch
import torch.nn.functional as F

from diffnet import Family, ParameterSpec, interval, option, positive

__all__ = ["AdvectionDiffusion", "exact", "scheme_matrix"]


def exact(v: float, t: np.ndarray, x: np.ndarray, eps: float, x0: float, s0: float) -> np.ndarray:
    """The whole-line solution on the (t, x) nodes, shape (len(t), len(x))."""
    s2 = s0 * s0 + 2.0 * eps * t[:, None]
    return np.sqrt(s0 * s0 / s2) * np.exp(-((x[None, :] - x0 - v * t[:, None]) ** 2) / (2.0 * s2))


def _space_operator(n: int, dx: float, v: float, eps: float) -> sp.csr_matrix:
    """v D_x - eps D_xx on the unknown columns j = 1..n-1 (u_0 = 0 is known and zero)."""
    m = n - 1
    rows, cols, vals = [], [], []

    def add(i, j, a):
        if j >= 0:  # column -1 is the inflow node u_0 = 0
            rows.append(i), cols.append(j), vals.append(a)

    for i in range(m):  # unknown i is node j = i + 1
        if i == 0:  # first-order upwind next to the inflow
            add(i, i, v / dx), add(i, i - 1, -v / dx)
        else:
            add(i, i, 1.5 * v / dx), add(i, i - 1, -2.0 * v / dx), add(i, i - 2, 0.5 * v / dx)
        c = eps / (dx * dx)
        if i < m - 1:
            add(i, i + 1, -c), add(i, i, 2 * c), add(i, i - 1, -c)
        else:  # the outflow node: the one-sided second difference
            add(i, i, -c), add(i, i - 1, 2 * c), add(i, i - 2, -c)
    return sp.csr_matrix((vals, (rows, cols)), shape=(m, m))


def scheme_matrix(n: int, dx: float, v: float, eps: float, time_coefficient: float) -> sp.csc_matrix:
    """The matrix of one implicit time row: time_coefficient I + v D_x - eps D_xx."""
    return (time_coefficient * sp.identity(n - 1) + _space_operator(n, dx, v, eps)).tocsc()


@dataclass(frozen=True)
class AdvectionDiffusion(Family):
    """A Gaussian pulse carried at a parametric speed v and spread by a small diffusion on [0, 1] x [0, T]. Its keys
    (``[advection_diffusion]``) are the fields made with ``option``."""

    resolution: tuple[int, ...]
    v_range: tuple[float, ...] = option((0.5, 1.5), "range of the speed v (> 0: x = 0 is the inflow)", interval)
    epsilon: float = option(0.002, "diffusion ε", positive)
    t_final: float = option(0.25, "T", positive)
    x0: float = option(0.3, "initial centre of the pulse", positive)
    width: float = option(0.07, "initial standard deviation s0 of the pulse", positive)

    name = "advection_diffusion"
    in_channels = 4
    capabilities = frozenset({"reference", "floor", "classical"})

    @property
    def dt(self) -> float:
        return self.t_final / (self.resolution[0] - 1)

    @property
    def dx(self) -> float:
        return 1.0 / (self.resolution[1] - 1)

    def describe(self) -> str:
        return f"v in {list(self.v_range)} eps={self.epsilon} T={self.t_final}"

    @property
    def parameters(self) -> ParameterSpec:
        return ParameterSpec("v", (), *self.v_range, positive=True, description="the speed v")

    def coordinates(self) -> dict[str, np.ndarray]:
        nt, nx = self.resolution
        return {"t": np.linspace(0.0, self.t_final, nt), "x": np.linspace(0.0, 1.0, nx)}

    def _pulse(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(-((x - self.x0) ** 2) / (2.0 * self.width**2))

    def inputs(self, v: torch.Tensor) -> torch.Tensor:
        """The speed, the pulse carried along the characteristic x - v t (no diffusion), t / T and x."""
        nt, nx = self.resolution
        kw = {"dtype": v.dtype, "device": v.device}
        t = torch.linspace(0.0, 1.0, nt, **kw)[None, :, None]
        x = torch.linspace(0.0, 1.0, nx, **kw)[None, None, :]
        carried = self._pulse(x - v[:, None, None] * t * self.t_final)
        s = v.shape[0]
        return torch.stack([(v[:, None, None] / self.v_range[1]).expand(s, nt, nx), carried,
                            t.expand(s, nt, nx), x.expand(s, nt, nx)], dim=1)

    def field(self, raw: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """u = u0(x) on the first row, 0 on the inflow column, the network elsewhere."""
        nx = self.resolution[1]
        x = torch.linspace(0.0, 1.0, nx, dtype=raw.dtype, device=raw.device)
        u0 = (self._pulse(x) * (x > 0)).expand(raw.shape[0], 1, nx)
        return torch.cat([u0, F.pad(raw[:, 0, 1:, 1:], (1, 0))], dim=1)

    def residual(self, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The scheme's residual at every unknown node (n >= 1, j >= 1), shape (S, N_t - 1, N_x - 1)."""
        dt, dx, eps = self.dt, self.dx, self.epsilon
        first = (u[:, 1:2] - u[:, 0:1]) / dt
        bdf2 = (1.5 * u[:, 2:] - 2.0 * u[:, 1:-1] + 0.5 * u[:, :-2]) / dt
        u_t = torch.cat([first, bdf2], dim=1)[:, :, 1:]
        w = u[:, 1:]
        u_x = torch.cat([(w[:, :, 1:2] - w[:, :, 0:1]) / dx,
                         (1.5 * w[:, :, 2:] - 2.0 * w[:, :, 1:-1] + 0.5 * w[:, :, :-2]) / dx], dim=2)
        u_xx = torch.cat([(w[:, :, 2:] - 2.0 * w[:, :, 1:-1] + w[:, :, :-2]),
                          (w[:, :, -1:] - 2.0 * w[:, :, -2:-1] + w[:, :, -3:-2])], dim=2) / (dx * dx)
        return u_t + v.to(u.dtype)[:, None, None] * u_x - eps * u_xx

    def loss_terms(self, u: torch.Tensor, v: torch.Tensor) -> dict[str, torch.Tensor]:
        # The pulse's time derivative is about v / s0; the residual is measured in those units.
        scaled = self.residual(u, v) * (self.width / v.to(u.dtype)[:, None, None])
        return {"residual": scaled.pow(2).mean(dim=(1, 2))}

    # -- reference: the exact solution ------------------------------------------------
    def reference(self, v: np.ndarray, progress=None) -> np.ndarray:
        c = self.coordinates()
        return np.stack([exact(float(vk), c["t"], c["x"], self.epsilon, self.x0, self.width) for vk in v])

    def reference_name(self) -> str:
        return "the exact solution (whole line)"

    # -- floor: the scheme's own solution on this grid -----------------------------------
    def scheme(self, v: float, nt: int, nx: int) -> np.ndarray:
        """The implicit scheme marched on an (nt, nx) grid of the same domain: one sparse LU per row kind."""
        dt, dx = self.t_final / (nt - 1), 1.0 / (nx - 1)
        x = np.linspace(0.0, 1.0, nx)
        u = np.zeros((nt, nx))
        u[0] = np.exp(-((x - self.x0) ** 2) / (2.0 * self.width**2))
        u[0, 0] = 0.0
        euler = spla.splu(scheme_matrix(nx, dx, v, self.epsilon, 1.0 / dt))
        bdf2 = spla.splu(scheme_matrix(nx, dx, v, self.epsilon, 1.5 / dt))
        u[1, 1:] = euler.solve(u[0, 1:] / dt)
        for n in range(2, nt):
            u[n, 1:] = bdf2.solve((2.0 * u[n - 1, 1:] - 0.5 * u[n - 2, 1:]) / dt)
        return u

    def discrete_optimum(self, v: np.ndarray, initial=None) -> tuple[np.ndarray, np.ndarray]:
        return np.stack([self.scheme(float(vk), *self.resolution) for vk in v]), np.ones(len(v), dtype=bool)

    def floor_name(self) -> str:
        return "the implicit scheme (BDF2, second-order upwind) on this grid"

    # -- classical: the same scheme on a grid of its choosing, for ``compare`` -----------
    classical_methods = {"bdf2-upwind2": "implicit BDF2 + second-order upwind, marched row by row"}
    classical_baseline = None

    def classical_configurations(self) -> dict[str, list[int]]:
        grids = (9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025)
        return {"bdf2-upwind2": sorted({g for g in grids} | {max(self.resolution)})}

    def classical_solver(self, method: str, grid: int):
        return lambda v: self.scheme(float(np.asarray(v).reshape(())), grid, grid)

    def classical_to_grid(self, method: str, native: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Bilinear interpolation from the solver's square grid onto the network's nodes."""
        c = self.coordinates()
        t_in, x_in = np.linspace(0.0, self.t_final, native.shape[0]), np.linspace(0.0, 1.0, native.shape[1])
        along_x = np.stack([np.interp(c["x"], x_in, row) for row in native])
        return np.stack([np.interp(c["t"], t_in, col) for col in along_x.T], axis=1)
