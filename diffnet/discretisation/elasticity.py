"""Linear elasticity on the Q1 grid: the material maps and the vector energy DiffNet is trained on.

A displacement u = (u_x, u_y[, u_z]) is nodal on the unit square's or cube's node grid, one
multilinear (Q1) field per component, stored (S, d, *grid) with the components x first (the order
of the spacings) and the grid's axes outermost first ((y, x) in 2-D), as every field here. The
energy of a body with Young's modulus E (nodal, interpolated multilinearly to the 2^d Gauss points
of each element, as the scalar families' coefficients) and Poisson ratio nu is

    J(u) = 1/2 ∫ [lambda (div u)^2 + 2 mu ε(u) : ε(u)] - ∫ f · u - ∫_Γ t · u,

lambda = E lambda_1(nu), mu = E mu_1(nu) (:func:`lame`), ε(u) the symmetric gradient. With the
same 2^d-point Gauss rule its Hessian is the assembled matrix of
:func:`diffnet.solvers.elasticity.elasticity_matrix`, so that system's solution is the exact
minimiser of this energy (the floor and, on a finer grid, the reference).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from diffnet.discretisation.energy import at_gauss_points, element_stencils
from diffnet.grid.element import gauss_basis
from diffnet.grid.material import lame

__all__ = ["elasticity_energy", "elasticity_stencil", "displacement_gradients", "strain_energy_density"]

def displacement_gradients(u: torch.Tensor, spacing: tuple[float, ...]) -> list[list[torch.Tensor]]:
    """du_i/dx_j at every element's Gauss points: ``grad[i][j]`` of shape (S, Q, *cells), i and j x first.

    Parameters
    ----------
    u : torch.Tensor
        Nodal displacements (S, d, *grid), d = 2 or 3 components, x first.
    spacing : tuple of float
        Node spacings, x first.
    """
    dims = u.ndim - 2
    if u.shape[1] != dims or len(spacing) != dims:
        raise ValueError(f"need (S, d, *grid) displacements with d = {dims} components and {dims} spacings, "
                         f"got shape {tuple(u.shape)} and {len(spacing)} spacings")
    _, *grads, _ = gauss_basis(*spacing)
    return [[at_gauss_points(u[:, i], grads[j]) for j in range(dims)] for i in range(dims)]


def strain_energy_density(grad: Sequence[Sequence[torch.Tensor]], lam, mu) -> torch.Tensor:
    """λ (div u)² + 2 μ ε:ε from the displacement gradient ``grad[i][j]`` = du_i/dx_j (twice the energy density).

    Parameters
    ----------
    grad : d x d nested sequence of torch.Tensor
        The gradient's entries, all of one shape, i and j x first.
    lam, mu : float or torch.Tensor
        The Lamé parameters, broadcastable to the entries.
    """
    dims = len(grad)
    divergence = sum(grad[i][i] for i in range(dims))
    # 2 ε:ε = sum_ij (du_i/dx_j)^2 + du_i/dx_j du_j/dx_i
    shear = sum(grad[i][j] * (grad[i][j] + grad[j][i]) for i in range(dims) for j in range(dims))
    return lam * divergence**2 + mu * shear


def elasticity_energy(u: torch.Tensor, young: torch.Tensor, nu: float | torch.Tensor, spacing: tuple[float, ...],
                      plane: str = "strain") -> torch.Tensor:
    """The strain energy 1/2 ∫ lambda (div u)^2 + 2 mu ε(u):ε(u) per sample, shape (S,).

    Parameters
    ----------
    u : torch.Tensor
        Nodal displacements (S, d, *grid), components x first.
    young : torch.Tensor
        Nodal Young's modulus (S, *grid), positive; interpolated to the Gauss points.
    nu : float or torch.Tensor
        Poisson ratio, a number or one per sample (S,), in (-1, 1/2) (plane stress: (-1, 1)).
    spacing : tuple of float
        Node spacings, x first.
    plane : str
        "strain" (plane strain; every 3-D body) or "stress" (plane stress, 2-D only).

    Returns
    -------
    torch.Tensor
        (S,): equals 1/2 uᵀ K u with K :func:`diffnet.solvers.elasticity.elasticity_matrix`.
    """
    if young.shape != (u.shape[0], *u.shape[2:]):
        raise ValueError(f"need Young's modulus (S, *grid) = {(u.shape[0], *u.shape[2:])}, got {tuple(young.shape)}")
    if plane == "stress" and u.ndim != 4:
        raise ValueError("plane stress is a 2-D model; a 3-D body takes plane = 'strain'")
    dims = u.ndim - 2
    values, *_, w = gauss_basis(*spacing)
    grad = displacement_gradients(u, spacing)
    lam, mu = lame(torch.as_tensor(nu, dtype=u.dtype, device=u.device), plane)
    lam, mu = (x.reshape(-1, *([1] * (dims + 1))) if x.ndim else x for x in (lam, mu))
    density = strain_energy_density(grad, lam, mu)
    e_q = at_gauss_points(young.to(u.dtype), values)
    return 0.5 * w * (e_q * density).flatten(1).sum(1)


def elasticity_stencil(young: torch.Tensor, nu: float | torch.Tensor, spacing: tuple[float, ...],
                       plane: str = "strain") -> torch.Tensor:
    """The Hessian of :func:`elasticity_energy` in u as a block stencil (S, d, d, 3^d, *grid).

    Entry [a, b, k] at node i couples component a at i to component b at i + o_k (:mod:`diffnet.multigrid.vcycle`'s
    layout). Per element and Gauss point the block (a, b) of the element matrix is
    E_q [lambda_1 G_a G_bᵀ + mu_1 (delta_ab sum_j G_j G_jᵀ + G_b G_aᵀ)] w, G_j the basis' x_j-derivatives
    there: the second derivatives of lambda (div u)^2 / 2 and of mu ε:ε.

    Parameters
    ----------
    young : torch.Tensor
        Nodal Young's modulus (S, *grid).
    nu : float or torch.Tensor
        Poisson ratio, a number or one per sample (S,).
    spacing : tuple of float
        Node spacings, x first.
    plane : str
        "strain" or "stress", as for :func:`elasticity_energy`.
    """
    dims = young.ndim - 1
    values, *grads, w = gauss_basis(*spacing)
    g = np.stack(grads)  # (d, Q, nodes)
    outer = np.einsum("aqm,bqn->abqmn", g, g)  # [a, b] = G_a G_bᵀ per Gauss point
    laplace = np.einsum("jqm,jqn->qmn", g, g)
    volumetric = outer.reshape(dims * dims, *outer.shape[2:])
    shear = (np.eye(dims)[:, :, None, None, None] * laplace + outer.transpose(1, 0, 2, 3, 4)).reshape(volumetric.shape)
    lam, mu = lame(torch.as_tensor(nu, dtype=young.dtype, device=young.device), plane)
    lam, mu = (x.reshape(-1, *([1] * dims)) if x.ndim else x for x in (lam, mu))
    # Two coefficient fields, w lambda E and w mu E, into one product: the blocks (a, b) once, not per field.
    stencils = element_stencils(torch.stack([w * lam * young, w * mu * young], dim=1), values,
                                np.stack([volumetric, shear], axis=1))
    return stencils.reshape(young.shape[0], dims, dims, *stencils.shape[2:])
