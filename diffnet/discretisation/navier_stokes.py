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

from diffnet.backend.constants import constant
from diffnet.backend.precision import conv
from diffnet.grid.element import gauss_basis
from diffnet.grid.recovery import gauss_gradients, to_nodes

__all__ = ["navier_stokes_residual", "stabilisation", "test_terms", "vorticity"]


def stabilisation(u: torch.Tensor, v: torch.Tensor, nu: torch.Tensor, h: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(τ_M, τ_C) at Gauss-point velocities u, v for viscosity ν (broadcastable) and element size h."""
    tau_m = torch.rsqrt(4.0 * (u.square() + v.square()) / h**2 + (4.0 * nu / h**2) ** 2)
    return tau_m, h**2 / (4.0 * tau_m)


def test_terms(u: tuple, v: tuple, p: tuple, nu: torch.Tensor, h: float) -> torch.Tensor:
    """What multiplies each test function at the quadrature points, (B, 3 equations, 3 kinds, *points): the kinds
    N_a, dN_a/dx and dN_a/dy, the equations momentum x, momentum y and continuity. ``u``, ``v``, ``p`` are each
    (value, d/dx, d/dy) at the points, (B, *points) (B a batch axis, 1 for a point list), ``nu`` broadcasts against
    them, ``h`` is the stabilisation's element size."""
    (U, Ux, Uy), (V, Vx, Vy), (P, Px, Py) = u, v, p
    tau_m, tau_c = stabilisation(U, V, nu, h)
    convect_u, convect_v = U * Ux + V * Uy, U * Vx + V * Vy
    rm_x, rm_y = tau_m * (convect_u + Px), tau_m * (convect_v + Py)
    div = Ux + Vy
    return torch.stack([
        torch.stack([convect_u, nu * Ux - P + U * rm_x + tau_c * div, nu * Uy + V * rm_x], dim=1),
        torch.stack([convect_v, nu * Vx + U * rm_y, nu * Vy - P + V * rm_y + tau_c * div], dim=1),
        torch.stack([div, rm_x, rm_y], dim=1)], dim=1)


def navier_stokes_residual(fields: torch.Tensor, nu: torch.Tensor | float, spacing: tuple[float, float],
                           weight: torch.Tensor | np.ndarray | None = None) -> torch.Tensor:
    """The stabilised Q1 residual at every node, (S, 3, N_y, N_x): momentum x, momentum y, continuity.

    Parameters
    ----------
    fields : torch.Tensor
        (S, 3, N_y, N_x): u, v, p at the nodes.
    nu : float or torch.Tensor
        The kinematic viscosity (1/Re for unit speed and length), a number or one per sample (S,).
    spacing : tuple of float
        (h_x, h_y); the stabilisation's element size is their geometric mean.
    weight : array, optional
        Each element's weight, (N_y - 1, N_x - 1) or per sample (S, N_y - 1, N_x - 1): the whole element's integrals
        scaled (a cut domain's finite-cell weights: 1 inside, small on cut elements, 0 outside); default 1.

    Returns
    -------
    torch.Tensor
        The weak-form integrals, Dirichlet rows included (the caller zeroes the rows of fixed values).
    """
    if fields.ndim != 4 or fields.shape[1] != 3:
        raise ValueError(f"need (S, 3, N_y, N_x) fields (u, v, p), got shape {tuple(fields.shape)}")
    s, _, ny, nx = fields.shape
    values, gx, gy, w = gauss_basis(*spacing)
    # One convolution gathers every unknown's value and gradient at the Gauss points, one transposed convolution
    # scatters every test-function term (measured 2.6x cheaper than nine gathers and nine scatters at 17^2).
    rows = np.concatenate([values, gx, gy])  # (3 kinds x Q, 4 corners)
    kernels = constant(("navier-stokes rows", rows.shape, rows.tobytes()), lambda: rows.reshape(-1, 1, 2, 2), fields)
    gathered = conv(fields.reshape(s * 3, 1, ny, nx), kernels).reshape(s, 3, 3, -1, ny - 1, nx - 1)
    (U, Ux, Uy), (V, Vx, Vy), (P, Px, Py) = (gathered[:, k].unbind(1) for k in range(3))
    nu = torch.as_tensor(nu, dtype=fields.dtype, device=fields.device).reshape(-1, 1, 1, 1)
    terms = test_terms((U, Ux, Uy), (V, Vx, Vy), (P, Px, Py), nu, float(np.sqrt(spacing[0] * spacing[1])))
    if weight is not None:  # each element's share (a cut domain's finite-cell weights)
        terms = terms * torch.as_tensor(weight, dtype=fields.dtype, device=fields.device).reshape(-1, 1, 1, 1, ny - 1, nx - 1)
    out = F.conv_transpose2d(terms.reshape(s * 3, -1, ny - 1, nx - 1), kernels)
    return w * out.reshape(s, 3, ny, nx)


def vorticity(fields, spacing: tuple[float, float]):
    """ω = ∂v/∂x - ∂u/∂y (S, N_y, N_x) of fields (S, >= 2, N_y, N_x) (u, v first) as a Q1 code reports it: at the
    Gauss points, recovered to the nodes (:mod:`diffnet.grid.recovery`); numpy or torch in, the same out."""
    g = gauss_gradients(fields[:, :2], spacing)  # (S, component, derivative (x first), Q, *cells)
    return to_nodes(g[:, 1, 0] - g[:, 0, 1], 2)
