"""The isotropic linear-elastic material: Lamé parameters per unit Young's modulus, for the energy DiffNet
is trained on (:mod:`diffnet.discretisation.elasticity`) and the assembled system of its reference solve
(:mod:`diffnet.solvers.elasticity`) alike; works on floats, numpy arrays and torch tensors."""

from __future__ import annotations

from typing import TypeVar

__all__ = ["PLANES", "lame"]

Number = TypeVar("Number")  # a float, a numpy array or a torch tensor

# "strain": plane strain (and every 3-D body); "stress": a thin plate loaded in its plane.
PLANES = ("strain", "stress")


def lame(nu: Number, plane: str = "strain") -> tuple[Number, Number]:
    """The Lamé parameters per unit Young's modulus, (lambda_1, mu_1), for Poisson ratio ``nu``.

    Plane strain and 3-D: lambda_1 = nu / ((1 + nu)(1 - 2 nu)); plane stress: nu / (1 - nu^2);
    mu_1 = 1 / (2 (1 + nu)) in both (scikit-fem's ``lame_parameters`` and ``plane_stress``).
    """
    if plane not in PLANES:
        raise ValueError(f"plane must be one of {', '.join(PLANES)}, got {plane!r}")
    mu = 1.0 / (2.0 * (1.0 + nu))
    lam = nu / ((1.0 + nu) * (1.0 - 2.0 * nu)) if plane == "strain" else nu / (1.0 - nu * nu)
    return lam, mu
