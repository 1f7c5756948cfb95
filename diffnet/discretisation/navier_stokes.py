"""Steady incompressible Navier–Stokes on the Q1 grid: the stabilised equal-order residual.

Velocity (u, v) and pressure p are nodal, one multilinear (Q1) field each, stored (S, 3, *grid) in that order with
the grid's axes outermost first ((y, x) in 2-D). Equal-order velocity and pressure violate the inf-sup condition, so
the Galerkin form is stabilised (Tezduyar 1992; Brooks & Hughes 1982): with the momentum residual
R_M = (u·∇)u + ∇p (ν Δu vanishes inside a bilinear element) and per Gauss point

    τ_M = [(2|u|/h)² + (4ν/h²)²]^(-1/2),      τ_C = h² / (4 τ_M),

the residual tested with the basis function N_a is

    momentum:   ∫ N_a (u·∇)u + ν ∇N_a·∇u − p ∇N_a + τ_M (u·∇N_a) R_M + τ_C ∇N_a (∇·u)     (SUPG, grad-div)
    continuity: ∫ N_a ∇·u + τ_M ∇N_a · R_M                                              (PSPG)

integrated by the 2^d-point Gauss rule. Mass is conserved to the scheme's accuracy (the PSPG term is O(h²) where the
solution is smooth); the same-grid root of this residual is the floor of any field on the grid. Every term is local
to an element, so a node's residual reaches its 3^d neighbours only (Newton's coloured Jacobian, the sweeps).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from diffnet.discretisation.energy import at_gauss_points
from diffnet.grid.element import gauss_basis

__all__ = ["navier_stokes_residual", "stabilisation"]


def stabilisation(u: torch.Tensor, v: torch.Tensor, nu: torch.Tensor, h: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(τ_M, τ_C) at Gauss-point velocities u, v for viscosity ν (broadcastable) and element size h."""
    tau_m = torch.rsqrt(4.0 * (u.square() + v.square()) / h**2 + (4.0 * nu / h**2) ** 2)
    return tau_m, h**2 / (4.0 * tau_m)


def _scatter(values: torch.Tensor, rows: np.ndarray, grid: tuple[int, ...]) -> torch.Tensor:
    """Σ_q Σ_e rows[q, a] values[:, q, e] added to element e's node a: the transpose of :func:`at_gauss_points`,
    (S, Q, *cells) -> (S, *grid)."""
    kernels = torch.as_tensor(rows.reshape(rows.shape[0], 1, 2, 2), dtype=values.dtype, device=values.device)
    out = F.conv_transpose2d(values, kernels)
    assert tuple(out.shape[-2:]) == tuple(grid)
    return out[:, 0]


def navier_stokes_residual(fields: torch.Tensor, nu: torch.Tensor | float, spacing: tuple[float, float]) -> torch.Tensor:
    """The stabilised Q1 residual at every node, (S, 3, N_y, N_x): momentum x, momentum y, continuity.

    Parameters
    ----------
    fields : torch.Tensor
        (S, 3, N_y, N_x): u, v, p at the nodes.
    nu : float or torch.Tensor
        The kinematic viscosity (1/Re for unit speed and length), a number or one per sample (S,).
    spacing : tuple of float
        (h_x, h_y); the stabilisation's element size is their geometric mean.

    Returns
    -------
    torch.Tensor
        The weak-form integrals, Dirichlet rows included (the caller zeroes the rows of fixed values).
    """
    if fields.ndim != 4 or fields.shape[1] != 3:
        raise ValueError(f"need (S, 3, N_y, N_x) fields (u, v, p), got shape {tuple(fields.shape)}")
    values, gx, gy, w = gauss_basis(*spacing)
    grid = tuple(fields.shape[-2:])
    nu = torch.as_tensor(nu, dtype=fields.dtype, device=fields.device).reshape(-1, 1, 1, 1)
    u, v, p = fields[:, 0], fields[:, 1], fields[:, 2]
    U, V = at_gauss_points(u, values), at_gauss_points(v, values)
    Ux, Uy, Vx, Vy = (at_gauss_points(f, g) for f in (u, v) for g in (gx, gy))
    P, Px, Py = (at_gauss_points(p, r) for r in (values, gx, gy))
    tau_m, tau_c = stabilisation(U, V, nu, float(np.sqrt(spacing[0] * spacing[1])))
    convect_u, convect_v = U * Ux + V * Uy, U * Vx + V * Vy
    rm_x, rm_y = convect_u + Px, convect_v + Py
    div = Ux + Vy
    # Each test-function term: (what multiplies N_a, what multiplies dN_a/dx, what multiplies dN_a/dy).
    momentum_x = (convect_u, nu * Ux - P + tau_m * U * rm_x + tau_c * div, nu * Uy + tau_m * V * rm_x)
    momentum_y = (convect_v, nu * Vx + tau_m * U * rm_y, nu * Vy - P + tau_m * V * rm_y + tau_c * div)
    continuity = (div, tau_m * rm_x, tau_m * rm_y)
    return torch.stack([w * sum(_scatter(t, r, grid) for t, r in zip(terms, (values, gx, gy)))
                        for terms in (momentum_x, momentum_y, continuity)], dim=1)
