"""The immersed Q1 strain energy of a solid cut out of the node grid (2-D, traction-free cut boundary), in torch:
the loss of a DiffNet on an elastic plate with holes.

    J(u) = ½ ∫_Ω E [λ₁ (div u)² + 2 μ₁ ε(u):ε(u)]          (cut-cell quadrature)
         + α ½ ∫_{cut elements} E [λ₁ (div u)² + 2 μ₁ ε:ε]    (finite-cell regularisation)

over the nodal displacements (S, 2, N_y, N_x) on the active nodes, with the cut-cell points and weights of
:mod:`diffnet.instances.cutcell` and the α of :mod:`diffnet.discretisation.immersed` (the scalar immersed energy's
twin, term for term: its ν is E here). The cut boundary carries no term: a hole's edge is traction-free, the
natural condition of the energy, so no Nitsche terms are needed. Its assembled matrix is
:func:`diffnet.solvers.immersed_elasticity.immersed_elasticity_matrix`; the tractions on the box's sides and
their held components are the family's (:class:`diffnet.families.elastic_plate.ElasticPlateFamily`).
"""

from __future__ import annotations

from typing import Sequence

import torch

from diffnet.discretisation.elasticity import displacement_gradients, strain_energy_density
from diffnet.discretisation.energy import at_gauss_points
from diffnet.discretisation.immersed import Immersed, point_batch
from diffnet.grid.element import gauss_basis
from diffnet.grid.material import lame

__all__ = ["immersed_elasticity_energy"]


def immersed_elasticity_energy(u: torch.Tensor, young: torch.Tensor, nu: torch.Tensor, data: Sequence[Immersed],
                               plane: str = "stress") -> torch.Tensor:
    """The strain energy J(u) per sample (S,) of a solid cut out of the grid, traction-free on its cut boundary.

    Parameters
    ----------
    u : torch.Tensor
        Nodal displacements (S, 2, N_y, N_x), components x first; zero off each instance's active nodes.
    young : torch.Tensor
        Nodal Young's modulus (S, N_y, N_x) (interpolated to the Gauss points of the whole elements); on the
        cut elements' points it is ``data[s].nu_points`` (the discretisation's coefficient).
    nu : torch.Tensor
        The Poisson ratio per sample (S,).
    data : sequence of Immersed
        Instance s's cut cells and weights (:func:`diffnet.discretisation.immersed.immersed` of E, no Dirichlet data).
    plane : str
        "stress" or "strain".
    """
    if u.ndim != 4 or u.shape[1] != 2:
        raise ValueError(f"need displacements (S, 2, N_y, N_x), got shape {tuple(u.shape)}")
    s = u.shape[0]
    hx, hy = data[0].cells.spacing
    values, *_, w = gauss_basis(hx, hy)
    lam, mu = lame(nu.to(u.dtype), plane)
    b = point_batch(data, u)
    # Elements wholly inside (and the α-term on the cut ones): 2x2 Gauss, as convolutions.
    density = strain_energy_density(displacement_gradients(u, (hx, hy)), lam.reshape(s, 1, 1, 1),
                                    mu.reshape(s, 1, 1, 1))
    e_q = at_gauss_points(young.to(u.dtype), values)
    total = 0.5 * w * (e_q * density * b["stiffness_weight"][:, None]).flatten(1).sum(1)
    # The inside parts of the cut elements: the gradient at each point from its element's four nodes.
    grads = [torch.einsum("pa,pad->pd", u[:, i].reshape(-1)[b["nodes"]], b["grads"]) for i in range(2)]
    point = [[grads[i][:, j] for j in range(2)] for i in range(2)]
    e = 0.5 * b["nu_points"] * strain_energy_density(point, lam[b["sample"]], mu[b["sample"]])
    return total.index_add(0, b["sample"], b["weights"] * e)
