"""DiffNet: data-free convolutional generators whose loss is the discretised PDE.

The public API a user's family is written against (docs/families.md): the family protocol
(:class:`Family`, :class:`ParameterSpec`, :func:`sample_box`, :data:`CAPABILITIES`), its loss as an object
(:class:`Energy`, :class:`Residual`, :class:`Loss`: what may finish the network's field follows from its kind), the
declaration of its configuration keys (:func:`option` and the checks), and the Q1
quadrature as convolutions (:func:`gauss_basis`, :func:`at_gauss_points`,
:func:`dirichlet_energy`, :func:`reaction_diffusion_energy`) with their Hessians as stencils
(:func:`dirichlet_stencil`; :func:`gauss_point_stencils` for coefficients at the Gauss points, a nonlinear
energy's), and the Q1 system those energies
are the quadratic forms of, for a family's reference solver (:func:`dirichlet_system`, whose
:class:`FEMSystem` solves directly, by AMG-CG or by geometric multigrid); for a family on a cut domain,
:class:`ImmersedFamily` with its shapes (:class:`Shape`, :class:`Disc`, :class:`Box`, :class:`HalfSpace`,
:class:`Star`, :class:`Occupancy`), conditions (:class:`Side`, :class:`BoxBoundary`) and body-fitted
reference (:class:`Loop`, :func:`body_fitted_solve`, :func:`grid_points`). For a solid: the strain energy and its
block Hessian (:func:`elasticity_energy`, :func:`elasticity_stencil`), on a cut domain
(:func:`immersed_elasticity_energy`, :func:`immersed_elasticity_matrix`, :func:`body_fitted_elasticity`), and the
outputs an engineer reads, derived from a field (:func:`gauss_gradients`, :func:`to_nodes`, :func:`stress_components`,
:func:`von_mises`). Names are imported on first use, so ``import diffnet`` loads nothing heavy.
"""

from __future__ import annotations

import importlib


_EXPORTS = {
    "CAPABILITIES": "diffnet.protocol.family",
    "Family": "diffnet.protocol.family",
    "ParameterSpec": "diffnet.protocol.family",
    "sample_box": "diffnet.protocol.family",
    "Loss": "diffnet.protocol.loss",
    "Energy": "diffnet.protocol.loss",
    "Residual": "diffnet.protocol.loss",
    "option": "diffnet.protocol.options",
    "one_of": "diffnet.protocol.options",
    "positive": "diffnet.protocol.options",
    "nonnegative": "diffnet.protocol.options",
    "interval": "diffnet.protocol.options",
    "all_positive": "diffnet.protocol.options",
    "integer_in": "diffnet.protocol.options",
    "gauss_basis": "diffnet.grid.element",
    "at_gauss_points": "diffnet.discretisation.energy",
    "dirichlet_energy": "diffnet.discretisation.energy",
    "reaction_diffusion_energy": "diffnet.discretisation.energy",
    "dirichlet_stencil": "diffnet.discretisation.energy",
    "gauss_point_stencils": "diffnet.discretisation.energy",
    "dirichlet_system": "diffnet.solvers.fem",
    "FEMSystem": "diffnet.solvers.fem",
    "ImmersedFamily": "diffnet.families.immersed_family",
    "Side": "diffnet.instances.boundary",
    "BoxBoundary": "diffnet.instances.boundary",
    "Shape": "diffnet.instances.geometry",
    "Disc": "diffnet.instances.geometry",
    "Box": "diffnet.instances.geometry",
    "HalfSpace": "diffnet.instances.geometry",
    "Star": "diffnet.instances.geometry",
    "Occupancy": "diffnet.instances.geometry",
    "grid_points": "diffnet.instances.geometry",
    "Loop": "diffnet.solvers.bodyfitted",
    "body_fitted_solve": "diffnet.solvers.bodyfitted",
    "elasticity_energy": "diffnet.discretisation.elasticity",
    "elasticity_stencil": "diffnet.discretisation.elasticity",
    "immersed_elasticity_energy": "diffnet.discretisation.immersed_elasticity",
    "immersed_elasticity_matrix": "diffnet.solvers.immersed_elasticity",
    "body_fitted_elasticity": "diffnet.solvers.bodyfitted",
    "stress_components": "diffnet.grid.material",
    "von_mises": "diffnet.grid.material",
    "gauss_gradients": "diffnet.grid.recovery",
    "to_nodes": "diffnet.grid.recovery",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'diffnet' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
