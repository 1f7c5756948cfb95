"""The flow around a cylinder in a channel, the DFG benchmark 2D-1 (Schäfer & Turek 1996), on a node grid with the
cylinder cut out of it: Newton on the cut-cell Navier–Stokes residual (:mod:`diffnet.discretisation.immersed_flow`)
with a sparse LU, and the benchmark's quantities.

The channel [0, 2.2] x [0, 0.41], ν = 10⁻³ (ρ = 1); at x = 0 the parabolic inflow u = 4 U_m y (H − y) / H²,
U_m = 0.3 (mean 0.2), v = 0; the walls y = 0, H at rest; at x = 2.2 the do-nothing outflow (ν ∂_n u − p n = 0,
natural: it fixes the pressure's level); on the cylinder (centre (x, y), radius r) no slip, by Nitsche's terms. The
benchmark's cylinder has centre (0.2, 0.2) and radius 0.05: Re = U_mean D / ν = 20, c_D = 5.5795, c_L = 0.010618,
Δp = p(x − r, y) − p(x + r, y) = 0.1175. The coefficients are c = 2 F / (U_mean² D) of the force F on the body.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from diffnet.discretisation.immersed import Immersed, immersed
from diffnet.discretisation.immersed_flow import immersed_flow_residual, wall_force
from diffnet.grid.points import values_at
from diffnet.instances.cutcell import cut_cells
from diffnet.instances.geometry import Box, Difference, Disc
from diffnet.solvers.newton import newton_solve
from diffnet.solvers.sparse_lu import available

__all__ = ["LENGTH", "HEIGHT", "U_MAX", "NU", "BENCHMARK", "SCHAEFER_TUREK", "channel", "discretised",
           "channel_boundary", "channel_residual", "cylinder_solve", "extended", "coefficients"]

LENGTH = 2.2  # the channel, x
HEIGHT = 0.41  # y
U_MAX = 0.3
U_MEAN = 2.0 * U_MAX / 3.0
NU = 1e-3
BENCHMARK = (0.2, 0.2, 0.05)  # the cylinder's centre x, y and radius
SCHAEFER_TUREK = {"drag": 5.57953523384, "lift": 0.010618948146, "pressure_drop": 0.11752016697}  # 2D-1, their
# reference values (John & Matthies 2001, Nabh 1998: the digits the benchmark's later papers agree on)


def channel(geometry) -> Difference:
    """The fluid: the channel less the cylinder (x, y, r)."""
    x, y, r = (float(v) for v in geometry)
    return Difference(Box((-1.0, -1.0), (LENGTH + 1.0, HEIGHT + 1.0)), Disc((x, y), r))


@lru_cache(maxsize=256)
def _discretised(geometry: tuple[float, float, float], resolution: tuple[int, int]) -> Immersed:
    return immersed(cut_cells(channel(geometry), resolution, (LENGTH, HEIGHT)), np.ones(resolution), dirichlet=True)


def discretised(geometry, resolution) -> Immersed:
    """The cut-cell discretisation of the cylinder ``geometry`` (x, y, r) on ``resolution`` (N_y, N_x) nodes of the
    channel, with a unit coefficient (its Nitsche penalty γ_e / h; the residual scales it by ν); kept per process."""
    return _discretised(tuple(float(v) for v in np.ravel(geometry)), tuple(int(n) for n in resolution))


def inflow(y: np.ndarray) -> np.ndarray:
    """The parabolic inflow's u at heights ``y``."""
    return 4.0 * U_MAX * y * (HEIGHT - y) / HEIGHT**2


def channel_boundary(resolution, active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(fixed, values), each (3, N_y, N_x): the walls' and the inflow's velocities, and every unknown of the nodes no
    fluid element touches (``active`` false: held at 0)."""
    ny, nx = resolution
    fixed, values = np.zeros((3, ny, nx), dtype=bool), np.zeros((3, ny, nx))
    fixed[:2, [0, -1], :] = True
    fixed[:2, :, 0] = True
    values[0, :, 0] = inflow(np.linspace(0.0, HEIGHT, ny))
    fixed |= ~active[None]
    return fixed, np.where(fixed, values, 0.0)


def channel_residual(fields: torch.Tensor, data, fixed: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The residual (S, 3, N_y, N_x) with the fixed rows replaced by (field - value), the others the weak-form
    integrals over the element's area (the strong residual's scale, O(1) on every grid)."""
    hx, hy = data[0].cells.spacing
    nu = torch.full((fields.shape[0],), NU, dtype=fields.dtype, device=fields.device)
    r = immersed_flow_residual(fields, nu, data)
    return torch.where(fixed, fields - values, r / (hx * hy))


def _newton(geometry, resolution, start: np.ndarray, fixed: np.ndarray, values: np.ndarray, tol: float,
            steps: int | None, lu: str, stats: list | None, what: str) -> np.ndarray:
    data = [discretised(geometry, resolution)]
    fixed_t, values_t = torch.as_tensor(fixed), torch.as_tensor(values)
    fn = lambda f: channel_residual(f, data * len(f), fixed_t, values_t)  # noqa: E731
    x = torch.as_tensor(np.where(fixed, values, start))
    x = newton_solve(fn, x, reach=1, tol=tol, max_iter=40 if steps is None else steps, what=what,
                     strict=steps is None, components=True, lu=lu, stats=stats)
    return x.numpy().copy()


def cylinder_solve(geometry, resolution, initial: np.ndarray | None = None, tol: float = 1e-9,
                   steps: int | None = None, lu: str | None = None, stats: list | None = None) -> np.ndarray:
    """The same-grid solution (3, N_y, N_x) around the cylinder ``geometry`` (x, y, r), from ``initial`` (default:
    the inflow profile everywhere, from which Newton converges at Re 20); with ``steps``, that many Newton steps and no
    more (a polish). ``lu``: each step's sparse LU (default the fastest installed for the size); ``stats`` gets one
    entry per Newton step."""
    resolution = tuple(int(n) for n in resolution)
    data = discretised(geometry, resolution)
    fixed, values = channel_boundary(resolution, data.active)
    if initial is None:
        initial = np.zeros((3, *resolution))
        initial[0] = inflow(np.linspace(0.0, HEIGHT, resolution[0]))[:, None] * data.active
    lu = lu or available(3 * int(np.prod(resolution)))
    return _newton(geometry, resolution, np.asarray(initial, dtype=np.float64), fixed, values, tol, steps, lu, stats,
                   f"cylinder (x {geometry[0]:.3g}, y {geometry[1]:.3g}, r {geometry[2]:.3g})")


def extended(geometry, fields: np.ndarray, tol: float = 1e-10) -> np.ndarray:
    """Fields (3, N_y, N_x) given at the fluid's nodes (a reported field is zero at the others) extended to the active
    nodes outside the fluid: the values there that satisfy those nodes' own equations with the fluid's values held
    (Newton on a few dozen unknowns, 4-6 steps: a chord iteration with the first Jacobian diverges, the stabilisation
    and convection there being far from linear). A discrete solution's own values come back; a cut element's
    integrals, and the wall's force, are then the ones its equations saw."""
    fields = np.asarray(fields, dtype=np.float64)
    resolution = fields.shape[1:]
    data = discretised(geometry, resolution)
    fixed, values = channel_boundary(resolution, data.active)
    held = fixed | (data.cells.sdf <= 0.0)[None]
    return _newton(geometry, resolution, fields, held, np.where(held, fields, 0.0), tol, None,
                   "superlu", None, "extension past the cylinder's wall")


def coefficients(geometry, fields: np.ndarray) -> dict[str, float]:
    """The benchmark's drag and lift coefficients and pressure drop of a discrete solution (3, N_y, N_x) (its values
    at the active nodes outside the fluid included: :func:`extended`)."""
    x, y, r = (float(v) for v in geometry)
    data = discretised(geometry, fields.shape[1:])
    force = wall_force(torch.as_tensor(fields)[None], torch.tensor([NU], dtype=torch.float64), [data])[0].numpy()
    scale = 2.0 / (U_MEAN**2 * 2.0 * r)
    front, back = values_at(fields[2], fields.shape[1:], [(x - r, y), (x + r, y)], (LENGTH, HEIGHT))
    return {"drag": scale * float(force[0]), "lift": scale * float(force[1]), "pressure_drop": float(front - back)}
