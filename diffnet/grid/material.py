"""The isotropic linear-elastic material: Lamé parameters per unit Young's modulus, for the energy DiffNet
is trained on (:mod:`diffnet.discretisation.elasticity`) and the assembled system of its reference solve
(:mod:`diffnet.solvers.elasticity`) alike; works on floats, numpy arrays and torch tensors."""

from __future__ import annotations

from typing import TypeVar

__all__ = ["PLANES", "POISSON_RATIO", "lame", "SYMMETRIC", "COMPONENT_NAMES", "strain_components", "stress_components", "plane_stress_tensor",
           "von_mises", "principal_stresses"]

Number = TypeVar("Number")  # a float, a numpy array or a torch tensor

# "strain": plane strain (and every 3-D body); "stress": a thin plate loaded in its plane.
PLANES = ("strain", "stress")

# The open interval an isotropic material's Poisson ratio lies in (a positive-definite strain energy: bulk and
# shear moduli > 0), whichever plane model a 2-D body takes: at 0.5 it is incompressible (plane strain's
# lambda is infinite, and the Q1 element locks long before), at -1 it has no bulk stiffness. The one
# declaration the families' parameter limits, their configuration checks and :func:`lame` read.
POISSON_RATIO = (-1.0, 0.5)


def lame(nu: Number, plane: str = "strain") -> tuple[Number, Number]:
    """The Lamé parameters per unit Young's modulus, (lambda_1, mu_1), for Poisson ratio ``nu``.

    Plane strain and 3-D: lambda_1 = nu / ((1 + nu)(1 - 2 nu)); plane stress: nu / (1 - nu^2);
    mu_1 = 1 / (2 (1 + nu)) in both (scikit-fem's ``lame_parameters`` and ``plane_stress``).
    """
    if plane not in PLANES:
        raise ValueError(f"plane must be one of {', '.join(PLANES)}, got {plane!r}")
    if isinstance(nu, (int, float)) and not POISSON_RATIO[0] < nu < POISSON_RATIO[1]:
        # Arrays and tensors come from instances checked against the same limits (ParameterSpec.limits); a
        # number may be a user's own, and without this it ends in a ZeroDivisionError at 0.5 or 1.
        raise ValueError(f"Poisson ratio nu = {nu:g}: an isotropic material needs {POISSON_RATIO[0]:g} < nu < "
                         f"{POISSON_RATIO[1]:g}")
    mu = 1.0 / (2.0 * (1.0 + nu))
    lam = nu / ((1.0 + nu) * (1.0 - 2.0 * nu)) if plane == "strain" else nu / (1.0 - nu * nu)
    return lam, mu


# A symmetric tensor's stored components (i, j) by dimension, x first: 2-D xx, yy, xy; 3-D XDMF's Tensor6 order.
SYMMETRIC = {2: ((0, 0), (1, 1), (0, 1)), 3: ((0, 0), (1, 1), (2, 2), (0, 1), (1, 2), (0, 2))}
# Their names, as files, `uq` and observations write a tensor's components (``stress_xx``, ...).
COMPONENT_NAMES = {d: tuple("xyz"[i] + "xyz"[j] for i, j in pairs) for d, pairs in SYMMETRIC.items()}


def strain_components(grad) -> list:
    """The symmetric gradient's components (:data:`SYMMETRIC` order) of a displacement gradient ``grad[i][j]`` =
    du_i/dx_j (entries of any one shape)."""
    return [0.5 * (grad[i][j] + grad[j][i]) for i, j in SYMMETRIC[len(grad)]]


def stress_components(grad, young, nu, plane: str = "strain") -> list:
    """The stress σ = E [λ₁ tr ε I + 2 μ₁ ε] of a displacement gradient ``grad[i][j]`` = du_i/dx_j, its components in
    :data:`SYMMETRIC` order (2-D: σ_xx, σ_yy, σ_xy, in the plane model ``plane``; 3-D: six)."""
    lam, mu = lame(nu, plane)
    trace = lam * sum(grad[i][i] for i in range(len(grad)))
    return [young * ((trace if i == j else 0.0) + 2 * mu * e) for (i, j), e in zip(SYMMETRIC[len(grad)],
                                                                                   strain_components(grad))]


def plane_stress_tensor(grad, young, nu, plane: str = "stress"):
    """The in-plane stress (σ_xx, σ_yy, σ_xy) of a 2-D displacement gradient (:func:`stress_components`)."""
    return tuple(stress_components(grad, young, nu, plane))


def von_mises(*components, nu=0.0, plane: str = "strain"):
    """The von Mises stress of stress components in :data:`SYMMETRIC` order (3 in 2-D, where plane strain adds
    σ_zz = ν (σ_xx + σ_yy) to the deviator; 6 in 3-D)."""
    if len(components) == 3:
        sxx, syy, sxy = components
        szz = nu * (sxx + syy) if plane == "strain" else 0.0 * sxx
        shear = sxy**2
    else:
        sxx, syy, szz, sxy, syz, sxz = components
        shear = sxy**2 + syz**2 + sxz**2
    return (0.5 * ((sxx - syy) ** 2 + (syy - szz) ** 2 + (szz - sxx) ** 2) + 3.0 * shear) ** 0.5


def principal_stresses(sxx, syy, sxy):
    """The in-plane principal stresses (σ₁ ≥ σ₂) of an in-plane stress."""
    centre, radius = 0.5 * (sxx + syy), (0.25 * (sxx - syy) ** 2 + sxy**2) ** 0.5
    return centre + radius, centre - radius
