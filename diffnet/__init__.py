"""DiffNet: data-free convolutional generators whose loss is the discretised PDE.

The public API a user's family is written against (docs/families.md): the family protocol
(:class:`Family`, :class:`ParameterSpec`, :func:`sample_box`, :data:`CAPABILITIES`), the
declaration of its configuration keys (:func:`option` and the checks), and the Q1
quadrature as convolutions (:func:`gauss_basis`, :func:`at_gauss_points`,
:func:`dirichlet_energy`, :func:`reaction_diffusion_energy`), and the Q1 system those energies
are the quadratic forms of, for a family's reference solver (:func:`dirichlet_system`, whose
:class:`FEMSystem` solves directly, by AMG-CG or by geometric multigrid); for a family on a cut domain,
:class:`ImmersedFamily` with its shapes (:class:`Shape`, :class:`Disc`, :class:`Box`, :class:`HalfSpace`,
:class:`Star`, :class:`Occupancy`), conditions (:class:`Side`, :class:`BoxBoundary`) and body-fitted
reference (:class:`Loop`, :func:`body_fitted_solve`, :func:`grid_points`). Names are imported on
first use, so ``import diffnet`` loads nothing heavy.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "CAPABILITIES": "diffnet.family",
    "Family": "diffnet.family",
    "ParameterSpec": "diffnet.family",
    "sample_box": "diffnet.family",
    "option": "diffnet.options",
    "one_of": "diffnet.options",
    "positive": "diffnet.options",
    "nonnegative": "diffnet.options",
    "interval": "diffnet.options",
    "all_positive": "diffnet.options",
    "integer_in": "diffnet.options",
    "gauss_basis": "diffnet.energy",
    "at_gauss_points": "diffnet.energy",
    "dirichlet_energy": "diffnet.energy",
    "reaction_diffusion_energy": "diffnet.energy",
    "dirichlet_system": "diffnet.solvers.fem",
    "FEMSystem": "diffnet.solvers.fem",
    "ImmersedFamily": "diffnet.problems.immersed_family",
    "Side": "diffnet.boundary",
    "BoxBoundary": "diffnet.boundary",
    "Shape": "diffnet.geometry",
    "Disc": "diffnet.geometry",
    "Box": "diffnet.geometry",
    "HalfSpace": "diffnet.geometry",
    "Star": "diffnet.geometry",
    "Occupancy": "diffnet.geometry",
    "grid_points": "diffnet.geometry",
    "Loop": "diffnet.solvers.bodyfitted",
    "body_fitted_solve": "diffnet.solvers.bodyfitted",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'diffnet' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
