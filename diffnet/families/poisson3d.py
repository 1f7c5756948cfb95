"""3-D Poisson family -div(nu grad u) = 0 on [0,1]^3 with a Karhunen-Loeve log-diffusivity.

The 2-D family (:class:`~diffnet.families.poisson.PoissonFamily`) on an (N_z, N_y, N_x) grid:
u = 1 at x = 0, u = 0 at x = 1, zero flux on the other four faces; nu = exp(sum_i a_i
lambda_i^{3/2} phi_i(x) phi_i(y) phi_i(z)) (the weight lambda_i^{d/2} of :mod:`diffnet.instances.kl`; with
lambda_i alone nu would span 15 decades at 33^3); the trilinear Q1 energy and system. What is its
own: the name, the dimension, a coarser independent reference (2x finer, not 4x) and the
multigrid's FMG as the reference solver (AMG's setup dominates in 3-D).
"""

from __future__ import annotations

from dataclasses import dataclass

from diffnet.instances.boundary import SIDE_DOC, side_check
from diffnet.protocol.options import integer_in, option
from diffnet.families.poisson import PoissonFamily

__all__ = ["Poisson3DFamily"]


@dataclass(frozen=True)
class Poisson3DFamily(PoissonFamily):
    """The 3-D KL Poisson family on an (N_z, N_y, N_x) nodal grid of [0,1]^3.

    Instance parameters are coefficient rows a (S, m), or nodal diffusivity fields
    (S, N_z, N_y, N_x) in their place.
    """

    # 2x finer in 3-D: 4x at 65^3 would be 257^3 = 17 M unknowns per instance.
    truth_refine: int = option(2, "evaluation: the independent reference is the Q1 FEM on a grid with this many "
                               "times the intervals (2..8)", integer_in(2, 8))
    z0: str = option("flux=0", SIDE_DOC.format("z = 0"), side_check)
    z1: str = option("flux=0", SIDE_DOC.format("z = 1"), side_check)

    name = "poisson3d"
    dims = 3
    in_channels = 4
    reference_method = "gmg"  # FMG to a tenth of the discretisation error
