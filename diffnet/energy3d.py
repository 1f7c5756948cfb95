"""Trilinear (Q1 hexahedral) finite elements on the voxel grid: 2x2x2 Gauss quadrature as conv3d.

The 3-D counterpart of :mod:`diffnet.energy`: each cell between eight neighbouring nodes
is one trilinear element, a 2x2x2 convolution over the nodal field gives the value or a
derivative of the interpolant at one Gauss point for every element at once, and the
energy is computed in the factorised form (gradients at the Gauss points, then the
transpose in the backward pass) by the same memory-lean autograd function. With the
2x2x2 rule the integrals are exact for a trilinear diffusivity, so the energy's
minimiser over nodal values is the Q1 FEM solution that :mod:`diffnet.solvers.poisson3d`
assembles from the same :func:`hex_basis`.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from diffnet.energy import quadratic_energy, quadratic_stencil

__all__ = ["HEX_NODES", "hex_basis", "dirichlet_energy_3d", "dirichlet_stencil_3d"]

# An element's nodes as (dz, dy, dx) offsets from its lowest corner, dx fastest: the order of
# hex_basis's columns (and of a 2x2x2 convolution kernel read row-major).
HEX_NODES = tuple((dz, dy, dx) for dz in (0, 1) for dy in (0, 1) for dx in (0, 1))

_G = (0.5 - 0.5 / math.sqrt(3.0), 0.5 + 0.5 / math.sqrt(3.0))


def hex_basis(hx: float, hy: float, hz: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """The trilinear basis on one element, evaluated at its eight Gauss points.

    Gauss points are ordered as the nodes, (zeta, eta, xi) with xi along x fastest.

    Returns
    -------
    values, grad_x, grad_y, grad_z : numpy.ndarray
        Shape (8 Gauss points, 8 nodes): N_a and its derivatives at each point.
    weight : float
        The quadrature weight of every point including the Jacobian, hx * hy * hz / 8.
    """
    values, gx, gy, gz = (np.empty((8, 8)) for _ in range(4))
    points = [(z, y, x) for z in _G for y in _G for x in _G]
    for q, (zeta, eta, xi) in enumerate(points):
        for a, (dz, dy, dx) in enumerate(HEX_NODES):
            fx, fy, fz = (xi if dx else 1.0 - xi), (eta if dy else 1.0 - eta), (zeta if dz else 1.0 - zeta)
            sx, sy, sz = (1.0 if dx else -1.0), (1.0 if dy else -1.0), (1.0 if dz else -1.0)
            values[q, a] = fx * fy * fz
            gx[q, a] = sx * fy * fz / hx
            gy[q, a] = sy * fx * fz / hy
            gz[q, a] = sz * fx * fy / hz
    return values, gx, gy, gz, hx * hy * hz / 8.0


def dirichlet_energy_3d(u: torch.Tensor, nu: torch.Tensor, hx: float, hy: float, hz: float) -> torch.Tensor:
    """J(u) = integral of 1/2 nu |grad u|^2 over the trilinear elements, per sample.

    Parameters
    ----------
    u, nu : torch.Tensor
        Nodal field and nodal diffusivity, shape (S, N_z, N_y, N_x); nu is interpolated
        trilinearly to the Gauss points.
    hx, hy, hz : float
        Node spacings.

    Returns
    -------
    torch.Tensor
        Shape (S,). Equals 1/2 u^T K u with K the Q1 hexahedral stiffness matrix of nu.
    """
    if u.ndim != 4 or nu.shape != u.shape:
        raise ValueError(f"need u and nu of one shape (S, N_z, N_y, N_x), got {tuple(u.shape)} and {tuple(nu.shape)}")
    values, gx, gy, gz, w = hex_basis(hx, hy, hz)
    return w * quadratic_energy(u, nu, values, [gx, gy, gz])


def dirichlet_stencil_3d(nu: torch.Tensor, hx: float, hy: float, hz: float) -> torch.Tensor:
    """The Hessian of :func:`dirichlet_energy_3d` (the Q1 stiffness matrix of nu) as a 27-point stencil (S, 27, N_z, N_y, N_x)."""
    values, gx, gy, gz, w = hex_basis(hx, hy, hz)
    return w * quadratic_stencil(nu, values, [gx, gy, gz])
