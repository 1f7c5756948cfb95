"""Steady incompressible Navier–Stokes on a domain cut out of the node grid: the stabilised Q1 residual of
:mod:`diffnet.discretisation.navier_stokes` on the cut-cell quadrature, the no-slip condition on the cut boundary Γ
held by Nitsche's terms (2-D).

With n the fluid's outward normal on Γ and the wall at rest there, the residual tested with N_a adds on Γ

    momentum c: ∫_Γ (p n_c − ν ∂_n u_c + γ_e ν/h u_c) N_a − ν ∂_n N_a u_c      (consistency, symmetry, penalty)
    continuity: −∫_Γ (u·n) N_a

to the volume terms, which are the stabilised ones integrated over the fluid: wholly inside elements by the 2x2
Gauss rule (as convolutions), the fluid part of a cut element by its point list (:mod:`diffnet.instances.cutcell`),
and the whole cut element with the finite-cell weight α (:data:`diffnet.discretisation.immersed.ALPHA`), which keeps
a node whose support barely meets the fluid from a near-zero row. γ_e is the immersed Poisson's element-wise penalty
(:func:`diffnet.discretisation.immersed.immersed`: large enough for coercivity of the viscous part on every cut). The
form is consistent: the exact flow satisfies it, so the error is Q1's.

Why Nitsche and not the nodes held at zero: holding the nodes nearest Γ moves the wall by up to a cell (first order)
and the drag with it; Nitsche's wall is the reconstructed Γ, O(h²) from the true one. Why these boundary terms and
not only a penalty: a penalty alone is inconsistent (an O(h/γ) slip on the wall).

The force the fluid exerts on the body is the boundary terms summed over every test function (Σ_a N_a = 1):
F_c = ∫_Γ (p n_c − ν ∂_n u_c + γ_e ν/h u_c), the Nitsche flux, consistent with the discrete equations (the drag
and lift of the DFG benchmark; Schäfer & Turek 1996).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from diffnet.discretisation.immersed import Immersed, point_batch
from diffnet.discretisation.navier_stokes import navier_stokes_residual, test_terms

__all__ = ["immersed_flow_residual", "wall_force"]


def _at_points(flat: torch.Tensor, nodes: torch.Tensor, values: torch.Tensor, grads: torch.Tensor):
    """Values (3, P) and gradients (3, P, 2) at points of the fields ``flat`` (3, S N), each point's element corners
    ``nodes`` (P, 4) (flat batch indices), basis values (P, 4) and gradients (P, 4, 2) there."""
    corner = flat[:, nodes]  # (3, P, 4)
    return (corner * values).sum(-1), torch.einsum("cpk,pkd->cpd", corner, grads)


def _scatter(size: int, nodes: torch.Tensor, contribution: torch.Tensor) -> torch.Tensor:
    """(3, size): each point's (3, P, 4) contribution added to its element's corners."""
    out = contribution.new_zeros(contribution.shape[0], size)
    return out.index_add_(1, nodes.reshape(-1), contribution.reshape(contribution.shape[0], -1))


def _wall(flat: torch.Tensor, batch: dict, nu: torch.Tensor):
    """At Γ's points: u, v, p (3, B), the viscosity (B,) and the Nitsche flux p n_c − ν ∂_n u_c + γ_e ν/h u_c of each
    velocity component (2, B), whose integral is the force on the body and which tests every N_a in the residual."""
    values, grads = _at_points(flat, batch["b_nodes"], batch["b_values"], batch["b_grads"])
    n = batch["b_normals"]
    nu_b = nu[batch["b_sample"]]
    dn = (grads[:2] * n).sum(-1)
    flux = values[2] * n.T - nu_b * dn + batch["penalty"] * nu_b * values[:2]
    return values, nu_b, flux


def immersed_flow_residual(fields: torch.Tensor, nu: torch.Tensor, data: Sequence[Immersed]) -> torch.Tensor:
    """The cut-cell residual at every node, (S, 3, N_y, N_x): momentum x, momentum y, continuity (weak-form
    integrals; the caller replaces the rows of the fixed unknowns, the inactive nodes' among them).

    Parameters
    ----------
    fields : torch.Tensor
        (S, 3, N_y, N_x): u, v, p at the nodes.
    nu : torch.Tensor
        (S,) the kinematic viscosity of each sample.
    data : sequence of Immersed
        Each sample's cut-cell discretisation, built with a unit coefficient (:func:`diffnet.discretisation.immersed.
        immersed` with ``dirichlet=True``: its penalty is γ_e / h, scaled by ν here).
    """
    s, _, ny, nx = fields.shape
    cells = data[0].cells
    h = float(np.sqrt(np.prod(cells.spacing)))
    nu = torch.as_tensor(nu, dtype=fields.dtype, device=fields.device).reshape(s)
    batch = point_batch(data, fields)
    # Whole elements: 1 inside, α on a cut one (the finite-cell term), 0 outside.
    out = navier_stokes_residual(fields, nu, cells.spacing, weight=batch["stiffness_weight"])
    flat = fields.transpose(0, 1).reshape(3, -1)
    size = flat.shape[1]
    # The fluid part of the cut elements, point by point.
    values, grads = _at_points(flat, batch["nodes"], batch["values"], batch["grads"])
    gx, gy = grads.unbind(-1)
    u, v, p = ((values[c][None], gx[c][None], gy[c][None]) for c in range(3))  # a batch of one point list
    terms = test_terms(u, v, p, nu[batch["sample"]][None], h)[0] * batch["weights"]  # (3 equations, 3 kinds, P)
    basis = torch.cat([batch["values"][None], batch["grads"].permute(2, 0, 1)])  # (3 kinds, P, 4)
    volume = torch.einsum("ekp,kpa->epa", terms, basis)
    # Nitsche on Γ (the wall at rest: g = 0).
    (ub, vb, _), nu_b, flux = _wall(flat, batch, nu)
    n, w = batch["b_normals"], batch["b_weights"]
    dn_test = torch.einsum("bad,bd->ba", batch["b_grads"], n)
    rows = [w[:, None] * (flux[c][:, None] * batch["b_values"] - (nu_b * uc)[:, None] * dn_test)
            for c, uc in enumerate((ub, vb))]
    rows.append(-(w * (ub * n[:, 0] + vb * n[:, 1]))[:, None] * batch["b_values"])
    wall = torch.stack(rows)
    extra = _scatter(size, batch["nodes"], volume) + _scatter(size, batch["b_nodes"], wall)
    return out + extra.reshape(3, s, ny, nx).transpose(0, 1)


def wall_force(fields: torch.Tensor, nu: torch.Tensor, data: Sequence[Immersed]) -> torch.Tensor:
    """The force (S, 2) the fluid exerts on the body inside Γ: the Nitsche flux ∫_Γ (p n − ν ∂_n u + γ_e ν/h u), with
    n the fluid's outward normal (into the body), of fields (S, 3, N_y, N_x) whose values at the active nodes outside
    the fluid are the discrete solution's (a field reported zero there: extend it first)."""
    s = fields.shape[0]
    nu = torch.as_tensor(nu, dtype=fields.dtype, device=fields.device).reshape(s)
    batch = point_batch(data, fields)
    flat = fields.transpose(0, 1).reshape(3, -1)
    _, _, flux = _wall(flat, batch, nu)
    return fields.new_zeros(2, s).index_add(1, batch["b_sample"], batch["b_weights"] * flux).T
