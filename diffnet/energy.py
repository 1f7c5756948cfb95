"""Q1 finite elements on the pixel grid: 2x2 Gauss quadrature as convolutions, and energies.

Each cell between four neighbouring nodes is one bilinear (Q1) element. A 2x2
convolution over the nodal field gives, for every element at once, the value or a
derivative of the interpolant at one Gauss point, so an integral over the domain is a
weighted sum of convolution outputs. With the 2x2 Gauss rule the integrals below are
exact for a bilinear diffusivity, which is why minimising these energies over nodal
values gives exactly the Q1 finite-element solution assembled by
:mod:`diffnet.solvers.poisson` from the same :func:`gauss_basis`.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "gauss_basis",
    "at_gauss_points",
    "dirichlet_energy",
    "reaction_diffusion_energy",
]

# Gauss points of the 2-point rule on [0, 1]; each carries weight 1/2.
_G = (0.5 - 0.5 / math.sqrt(3.0), 0.5 + 0.5 / math.sqrt(3.0))


def gauss_basis(hx: float, hy: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """The bilinear basis on one element, evaluated at its four Gauss points.

    Element nodes are ordered (0,0), (0,1), (1,0), (1,1) as (dy, dx) offsets from the
    element's lower-left node; Gauss points likewise, (eta, xi) with xi along x.

    Returns
    -------
    values, grad_x, grad_y : numpy.ndarray
        Shape (4 Gauss points, 4 nodes): N_a, dN_a/dx, dN_a/dy at each point.
    weight : float
        The quadrature weight of every point including the Jacobian, hx * hy / 4.
    """
    values = np.empty((4, 4))
    gx = np.empty((4, 4))
    gy = np.empty((4, 4))
    for q, (eta, xi) in enumerate((e, x) for e in _G for x in _G):
        for a, (dy, dx) in enumerate(((0, 0), (0, 1), (1, 0), (1, 1))):
            fx = xi if dx else 1.0 - xi
            fy = eta if dy else 1.0 - eta
            values[q, a] = fx * fy
            gx[q, a] = (1.0 if dx else -1.0) * fy / hx
            gy[q, a] = (1.0 if dy else -1.0) * fx / hy
    return values, gx, gy, hx * hy / 4.0


def _kernels(rows: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """(Q, 4) basis rows as Q conv2d kernels of shape (Q, 1, 2, 2)."""
    return torch.as_tensor(rows.reshape(-1, 1, 2, 2), dtype=like.dtype, device=like.device)


def at_gauss_points(field: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
    """Apply basis rows to a nodal field at every element.

    Parameters
    ----------
    field : torch.Tensor
        Nodal values, shape (S, N_y, N_x).
    rows : numpy.ndarray
        (Q, 4) weights on the element's nodes (rows of :func:`gauss_basis` outputs).

    Returns
    -------
    torch.Tensor
        Shape (S, Q, N_y - 1, N_x - 1).
    """
    return F.conv2d(field[:, None], _kernels(rows, field))


def _diffusion_density(u: torch.Tensor, nu: torch.Tensor, hx: float, hy: float):
    """Per-element Gauss-point values of 1/2 nu |grad u|^2, the basis values and the weight."""
    values, gx, gy, w = gauss_basis(hx, hy)
    nu_q = at_gauss_points(nu, values)
    du = at_gauss_points(u, np.concatenate([gx, gy]))
    grad2 = du[:, :4].square() + du[:, 4:].square()
    return 0.5 * nu_q * grad2, values, w


def dirichlet_energy(u: torch.Tensor, nu: torch.Tensor, hx: float, hy: float) -> torch.Tensor:
    """J(u) = integral of 1/2 nu |grad u|^2 over the Q1 elements, per sample.

    Parameters
    ----------
    u, nu : torch.Tensor
        Nodal field and nodal diffusivity, shape (S, N_y, N_x); nu is interpolated
        bilinearly to the Gauss points.
    hx, hy : float
        Node spacings.

    Returns
    -------
    torch.Tensor
        Shape (S,). Equals 1/2 u^T K u with K the Q1 stiffness matrix of nu.
    """
    density, _, w = _diffusion_density(u, nu, hx, hy)
    return w * density.sum(dim=(1, 2, 3))


def reaction_diffusion_energy(
    u: torch.Tensor,
    nu: torch.Tensor,
    kappa: float,
    f: torch.Tensor | float,
    hx: float,
    hy: float,
) -> torch.Tensor:
    """J(u) = integral of [1/2 nu |grad u|^2 + 1/2 kappa^2 u^2 - f u], per sample.

    Parameters
    ----------
    u, nu : torch.Tensor
        Nodal field and diffusivity, shape (S, N_y, N_x).
    kappa : float
        Reaction coefficient; the reaction term is kappa^2 u.
    f : torch.Tensor or float
        Source: a constant, or nodal values of shape (S, N_y, N_x) interpolated bilinearly.
    hx, hy : float
        Node spacings.

    Returns
    -------
    torch.Tensor
        Shape (S,). Equals 1/2 u^T (K + kappa^2 M) u - b^T u with the Q1 stiffness K,
        mass M and load b integrated by the same rule.
    """
    density, values, w = _diffusion_density(u, nu, hx, hy)
    u_q = at_gauss_points(u, values)
    f_q = at_gauss_points(f, values) if isinstance(f, torch.Tensor) else f
    density = density + 0.5 * kappa**2 * u_q.square() - f_q * u_q
    return w * density.sum(dim=(1, 2, 3))
