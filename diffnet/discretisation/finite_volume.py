"""Conservative space-time Burgers residual: an implicit monotone finite-volume scheme on the nodal grid.

Node j of time row n is the centre of a cell of width dx. The residual at every unknown
node (n >= 1, j >= 1) is

    D_t u_{n,j} + (F_{j+1/2} - F_{j-1/2}) / dx - nu (u_{n,j+1} - 2 u_{n,j} + u_{n,j-1}) / dx^2

with every spatial term at the new time level (fully implicit). Order 1: backward Euler
in t and first-order states (u_j, u_{j+1}) at each face. Order 2: BDF2 in t (backward
Euler on the first row) and minmod-limited MUSCL states. F is the Godunov or the
Engquist-Osher flux of f(u) = u^2/2. The inflow node u_{n,0} is the boundary value; at
the outflow x = 1 a zero-gradient ghost closes the last cell. A field with zero residual
is the solution of that implicit scheme, which converges to the entropy solution.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

__all__ = ["FLUXES", "godunov_flux", "engquist_osher_flux", "minmod", "face_states", "conservative_residual",
           "implicit_diffusion_inverse"]


def godunov_flux(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Godunov flux of f(u) = u^2/2 between left state ``a`` and right state ``b``.

    For a convex flux whose minimum is at u = 0 the exact Riemann solution gives
    F = max(f(max(a, 0)), f(min(b, 0))).
    """
    return 0.5 * torch.maximum(a.clamp(min=0.0).square(), b.clamp(max=0.0).square())


def engquist_osher_flux(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Engquist-Osher flux of f(u) = u^2/2: f(max(a, 0)) + f(min(b, 0)), differentiable everywhere."""
    return 0.5 * (a.clamp(min=0.0).square() + b.clamp(max=0.0).square())


FLUXES = {"godunov": godunov_flux, "engquist_osher": engquist_osher_flux}


def minmod(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The smaller of ``p`` and ``q`` in magnitude where they share a sign, else 0."""
    return torch.where(p * q > 0, torch.where(p.abs() < q.abs(), p, q), torch.zeros_like(p))


def face_states(u: torch.Tensor, order: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left and right states at the faces j + 1/2, j = 0 .. N_x - 1, of rows ``u`` (..., N_x).

    Two ghosts beyond x = 1 copy the last node (zero-gradient outflow); one ghost before
    x = 0 copies the inflow value, so the inflow cell's slope is limited to zero.
    """
    # ext[k] = u[k - 1]; u is 2-D or 3-D. Concatenated, not F.pad's "replicate": forward-mode derivatives (the
    # residual's coarse Gauss-Newton) decompose that pad into primitives, 3x the residual's time at 17^2.
    ext = torch.cat([u[..., :1], u, u[..., -1:], u[..., -1:]], dim=-1)
    if order == 1:
        return ext[..., 1:-2], ext[..., 2:-1]
    slope = minmod(ext[..., 1:-1] - ext[..., :-2], ext[..., 2:] - ext[..., 1:-1])  # at nodes 0 .. N_x
    left = ext[..., 1:-2] + 0.5 * slope[..., :-1]
    right = ext[..., 2:-1] - 0.5 * slope[..., 1:]
    return left, right


def conservative_residual(
    u: torch.Tensor, dt: float, dx: float, viscosity: float, order: int = 2, flux: str = "godunov"
) -> torch.Tensor:
    """Residual of the implicit conservative scheme at every unknown node.

    Parameters
    ----------
    u : torch.Tensor
        Space-time fields (S, N_t, N_x); row 0 the initial condition, column 0 the inflow.
    dt, dx : float
        Node spacings in t and x.
    viscosity : float
        nu >= 0.
    order : {1, 2}
        Backward Euler with first-order face states, or BDF2 with minmod MUSCL states.
    flux : {"godunov", "engquist_osher"}
        The numerical flux.

    Returns
    -------
    torch.Tensor
        Shape (S, N_t - 1, N_x - 1), in units of u per time (like u_t).
    """
    if order not in (1, 2):
        raise ValueError(f"order must be 1 or 2, got {order}")
    new = u[:, 1:]  # every spatial term at the new time level
    left, right = face_states(new, order)
    fluxes = FLUXES[flux](left, right)  # faces 1/2 .. N_x - 1/2
    r = (fluxes[..., 1:] - fluxes[..., :-1]) / dx
    if viscosity > 0.0:
        ghost = torch.cat([new, new[..., -1:]], dim=-1)
        r = r - viscosity * (ghost[..., 2:] - 2.0 * ghost[..., 1:-1] + ghost[..., :-2]) / dx**2
    du = (u[:, 1:] - u[:, :-1]) / dt  # backward Euler
    if order == 2 and u.shape[1] > 2:
        bdf2 = (3.0 * u[:, 2:] - 4.0 * u[:, 1:-1] + u[:, :-2]) / (2.0 * dt)
        du = torch.cat([du[:, :1], bdf2], dim=1)
    return du[..., 1:] + r


@lru_cache(maxsize=16)
def _inverse(n_x: int, ratio: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    # Cached as the tensor the loss uses: built, converted and copied to the device once per
    # grid, not at every loss evaluation.
    n = n_x - 1
    D = np.diag(np.full(n, -2.0)) + np.diag(np.ones(n - 1), 1) + np.diag(np.ones(n - 1), -1)
    D[-1, -1] = -1.0  # the zero-gradient ghost beyond x = 1
    return torch.as_tensor(np.linalg.inv(np.eye(n) - ratio * D), dtype=dtype, device=device)


def implicit_diffusion_inverse(n_x: int, dt: float, dx: float, viscosity: float, like: torch.Tensor) -> torch.Tensor:
    """(I - nu dt D_xx)^-1 on the unknown columns j = 1 .. N_x - 1, shape (N_x - 1, N_x - 1), as ``like``'s dtype/device.

    D_xx is the residual's own second difference (inflow node known, zero-gradient ghost
    at the outflow). Weighting the residual rows by it (``r @ inverse.T``) is the
    preconditioned loss of ``problem.preconditioner = "implicit_diffusion"``: the same
    zero (the inverse is nonsingular), with the high spatial frequencies that the viscous
    term makes stiff damped by up to 1 / (1 + 4 nu dt / dx^2). A fixed linear map of the
    residual, so its gradient is a true gradient of the new loss. The tensor is cached per
    grid, dtype and device and shared: read it, do not modify it.
    """
    return _inverse(n_x, viscosity * dt / dx**2, like.dtype, like.device)
