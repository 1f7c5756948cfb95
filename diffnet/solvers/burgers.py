"""Godunov finite-volume reference for viscous and inviscid Burgers (exact Riemann flux, numba), and the
Burgers family's classical capability: Godunov on a sweep of cells, read at the network's nodes."""

from __future__ import annotations

import math
from typing import Callable

import numba
import numpy as np

__all__ = ["godunov_flux", "solve", "solve_on_grid", "nodal_field", "characteristics_solution", "default_cells",
           "godunov_configurations", "godunov_solver", "godunov_to_grid"]


@numba.njit(cache=True, inline="always")
def _flux(ul: float, ur: float) -> float:
    # Exact Riemann (Godunov) flux of f(u) = u^2/2; the compact form for a convex flux
    # with its sonic point at 0.
    a = max(ul, 0.0)
    b = min(ur, 0.0)
    return max(0.5 * a * a, 0.5 * b * b)


def godunov_flux(ul: np.ndarray, ur: np.ndarray) -> np.ndarray:
    """Godunov flux F(uL, uR) of Burgers' f(u) = u^2/2 (vectorised, for tests and docs)."""
    a = np.maximum(ul, 0.0)
    b = np.minimum(ur, 0.0)
    return np.maximum(0.5 * a * a, 0.5 * b * b)


@numba.njit(cache=True)
def _minmod(a: float, b: float) -> float:
    if a * b <= 0.0:
        return 0.0
    return a if abs(a) < abs(b) else b


@numba.njit(cache=True)
def _advect_rate(u: np.ndarray, h: float, order: int, rate: np.ndarray) -> None:
    # -(F_{i+1/2} - F_{i-1/2}) / h with ghost cells: -u_0 at the x=0 wall (u = 0 on the
    # face) and zero-gradient outflow at x=1.
    m = u.shape[0]
    ext = np.empty(m + 4)
    ext[2 : m + 2] = u
    ext[1] = -u[0]
    ext[0] = -u[1]
    ext[m + 2] = u[m - 1]
    ext[m + 3] = u[m - 1]
    slope = np.zeros(m + 4)
    if order == 2:
        for i in range(1, m + 3):
            slope[i] = _minmod(ext[i] - ext[i - 1], ext[i + 1] - ext[i])
    prev = 0.0
    for f in range(m + 1):  # face f sits between ext[f+1] and ext[f+2]
        ul = ext[f + 1] + 0.5 * slope[f + 1]
        ur = ext[f + 2] - 0.5 * slope[f + 2]
        flux = _flux(ul, ur)
        if f > 0:
            rate[f - 1] = -(flux - prev) / h
        prev = flux


@numba.njit(cache=True)
def _implicit_diffusion(u: np.ndarray, r: float, cp: np.ndarray, dp: np.ndarray) -> None:
    # Backward Euler for u_t = nu u_xx (r = nu dt / h^2) with the same ghost cells
    # (Dirichlet 0 on the x=0 face, zero gradient at x=1): a tridiagonal solve (Thomas).
    m = u.shape[0]
    for i in range(m):
        diag = 1.0 + 2.0 * r
        if i == 0:
            diag += r  # ghost -u_0
        if i == m - 1:
            diag -= r  # ghost u_{m-1}
        lower = -r if i > 0 else 0.0
        upper = -r if i < m - 1 else 0.0
        if i == 0:
            cp[i] = upper / diag
            dp[i] = u[i] / diag
        else:
            den = diag - lower * cp[i - 1]
            cp[i] = upper / den
            dp[i] = (u[i] - lower * dp[i - 1]) / den
    u[m - 1] = dp[m - 1]
    for i in range(m - 2, -1, -1):
        u[i] = dp[i] - cp[i] * u[i + 1]


@numba.njit(cache=True)
def _march(
    u: np.ndarray, h: float, nu: float, times: np.ndarray, cfl: float, order: int, out: np.ndarray
) -> int:
    m = u.shape[0]
    rate = np.empty(m)
    predictor = np.empty(m)
    cp = np.empty(m)
    dp = np.empty(m)
    t = 0.0
    steps = 0
    out[0] = u
    for k in range(1, times.shape[0]):
        while t < times[k] - 1e-14 * max(1.0, times[k]):
            umax = 1e-12
            for i in range(m):
                umax = max(umax, abs(u[i]))
            dt = min(cfl * h / umax, times[k] - t)
            _advect_rate(u, h, order, rate)
            if order == 1:
                for i in range(m):
                    u[i] += dt * rate[i]
            else:  # SSP-RK2 (Heun), TVD with the minmod reconstruction
                for i in range(m):
                    predictor[i] = u[i] + dt * rate[i]
                _advect_rate(predictor, h, order, rate)
                for i in range(m):
                    u[i] = 0.5 * (u[i] + predictor[i] + dt * rate[i])
            if nu > 0.0:
                _implicit_diffusion(u, nu * dt / (h * h), cp, dp)
            t += dt
            steps += 1
        out[k] = u
    return steps


def solve(
    c: float,
    cells: int,
    times: np.ndarray,
    viscosity: float = 0.0,
    order: int = 2,
    cfl: float = 0.45,
) -> tuple[np.ndarray, np.ndarray]:
    """Finite-volume solution of the Burgers family member c on a uniform cell grid.

    Godunov's method with the exact Riemann flux (first order), or with a minmod-limited
    MUSCL reconstruction and SSP-RK2 (second order); the viscous term by backward Euler,
    split from the advection step, so the time step is set by the CFL condition alone.

    Parameters
    ----------
    c : float
        Parameter of the initial condition 1/2 (1 - cos 2 pi c x), taken as cell averages.
    cells : int
        Number of cells on [0, 1].
    times : numpy.ndarray
        Increasing output times, the first 0.
    viscosity : float
        nu >= 0.
    order : {1, 2}
        Spatial order of the reconstruction.
    cfl : float
        Courant number.

    Returns
    -------
    centres : numpy.ndarray
        Cell centres, shape (cells,).
    u : numpy.ndarray
        Cell averages at each output time, shape (len(times), cells).
    """
    if order not in (1, 2):
        raise ValueError(f"order must be 1 or 2, got {order}")
    if cells < 4:
        raise ValueError(f"need at least 4 cells, got {cells}")
    h = 1.0 / cells
    edges = np.linspace(0.0, 1.0, cells + 1)
    # Exact cell averages of the initial condition.
    k = 2.0 * math.pi * c
    u = 0.5 - 0.5 * (np.sin(k * edges[1:]) - np.sin(k * edges[:-1])) / (k * h)
    times = np.ascontiguousarray(times, dtype=np.float64)
    out = np.empty((times.shape[0], cells))
    _march(u, h, float(viscosity), times, float(cfl), int(order), out)
    return 0.5 * (edges[1:] + edges[:-1]), out


def default_cells(nx: int) -> int:
    """Cells of the fine reference grid for an output of nx nodes (at least 8192, 32 per node gap)."""
    return max(8192, 32 * (nx - 1))


def nodal_field(cell_averages: np.ndarray, nx: int, c: float) -> np.ndarray:
    """Cell averages (N_t, cells) read at nx uniform nodes of [0, 1]: the linear interpolant of the
    averages, with u = 0 at x = 0 and a linear extrapolation at the outflow x = 1; the exact
    initial condition at t = 0."""
    nt, cells = cell_averages.shape
    edges = np.linspace(0.0, 1.0, cells + 1)
    centres = 0.5 * (edges[1:] + edges[:-1])  # as solve() returns them
    xs = np.concatenate([[0.0], centres, [1.0]])
    x_nodes = np.linspace(0.0, 1.0, nx)
    field = np.empty((nt, nx))
    for n in range(nt):
        u = cell_averages[n]
        right = u[-1] + 0.5 * (u[-1] - u[-2])
        field[n] = np.interp(x_nodes, xs, np.concatenate([[0.0], u, [right]]))
    field[0] = 0.5 * (1.0 - np.cos(2.0 * math.pi * c * x_nodes))  # the IC is known exactly
    return field


def solve_on_grid(
    c: float,
    resolution: tuple[int, int],
    viscosity: float,
    t_final: float,
    cells: int | None = None,
    order: int = 2,
) -> np.ndarray:
    """Fine-grid Godunov solution sampled onto the nodal (N_t, N_x) output grid (see :func:`nodal_field`)."""
    nt, nx = resolution
    cells = default_cells(nx) if cells is None else cells
    _, u = solve(c, cells, np.linspace(0.0, t_final, nt), viscosity, order)
    return nodal_field(u, nx, c)


def characteristics_solution(c: float, x: np.ndarray, t: float, iters: int = 60) -> np.ndarray:
    """Inviscid solution by the method of characteristics, valid before the first shock.

    Solves x = xi + t u0(xi) for the foot xi by bisection (the map is increasing while
    t < 1/(pi c)) and returns u0(xi).
    """
    if t >= 1.0 / (math.pi * c):
        raise ValueError(f"t={t} is past the first shock time 1/(pi c) = {1 / (math.pi * c)}")

    def u0(s: np.ndarray) -> np.ndarray:
        return 0.5 * (1.0 - np.cos(2.0 * math.pi * c * s))

    lo = np.maximum(x - t, 0.0)
    hi = np.array(x, dtype=np.float64)
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        below = mid + t * u0(mid) < x
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    return u0(0.5 * (lo + hi))


# -- the classical capability of the Burgers family (``deepfusion compare``) ------------------------
# Cells of the sweep, about a factor 1.5 apart.
SWEEP_CELLS = (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)


def godunov_configurations(family) -> dict[str, list[int]]:
    """Godunov cells to sweep, coarse to fine, first and second order; below the reference's cells."""
    nx = family.resolution[1]
    cells = sorted({m for m in SWEEP_CELLS if m < default_cells(nx)} | {nx - 1})
    return {"godunov1": cells, "godunov2": cells}


def godunov_solver(family, method: str, grid: int) -> Callable[[np.ndarray], np.ndarray]:
    """Godunov's scheme ("godunov1": first order; "godunov2": minmod MUSCL with SSP-RK2) on ``grid`` cells,
    read at the network's time rows."""
    if method not in ("godunov1", "godunov2"):
        raise ValueError(f"unknown method {method!r}; choose from godunov1, godunov2")
    times = np.linspace(0.0, family.t_final, family.resolution[0])

    def godunov(c: np.ndarray) -> np.ndarray:
        return solve(float(np.asarray(c).reshape(())), grid, times, family.viscosity, order=int(method[-1]))[1]

    return godunov


def godunov_to_grid(family, native: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Godunov cell averages read at the network's nodes as :func:`diffnet.solvers.burgers.solve_on_grid`
    reads its reference: linear between cell centres, u = 0 at x = 0, extrapolated at the outflow,
    and the exact initial condition at t = 0."""
    return nodal_field(native, family.resolution[1], float(np.asarray(c).reshape(())))
