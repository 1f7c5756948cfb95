"""A compressible Neo-Hookean solid on the unit square (plane strain) or cube under a load large enough that
linear elasticity is wrong: a nonlinear vector family, where a classical solve pays a Newton iteration.

An instance is a log shear modulus from the Karhunen-Loève family of the diffusivity families (m coefficients,
mu = shear exp(sum_i a_i lambda_i^{d/2} prod_k phi_i(x_k))) and the load's magnitude s: each loaded side's
traction (its direction from the side's text) is multiplied by s. The Poisson ratio is one per family. The loss
is the Q1 total potential energy (:mod:`diffnet.discretisation.hyperelasticity`: Neo-Hookean, guarded where an
element inverts), the floor its minimiser on the same grid and the truth that on a grid ``truth_refine`` times
finer, both by Newton (:mod:`diffnet.solvers.hyperelasticity`), each step by :attr:`linear_solve`.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np
import torch

from diffnet.discretisation.hyperelasticity import (cauchy_stress, neo_hookean_energy, neo_hookean_stencil,
                                                   smallest_jacobian)
from diffnet.grid.material import von_mises
from diffnet.grid.recovery import as_tensors, at_gauss, gauss_gradients, to_nodes
from diffnet.families.elasticity import (DISPLACEMENT, SOLID_CAPABILITIES, ElasticBox, SolvedBox, poisson_ratio,
                                         vector_side)
from diffnet.families.kl_family import kl_log_field
from diffnet.protocol.family import Family, ParameterSpec
from diffnet.protocol.loss import Energy
from diffnet.protocol.options import integer_in, interval, option, positive
from diffnet.solvers.classical import q1_to_grid
from diffnet.solvers.hyperelasticity import NeoHookeanBody, NewtonFailure, NewtonStats

__all__ = ["HyperelasticityFamily", "Hyperelasticity3DFamily"]

# The grid on which the configuration checks that the largest load does not invert the mean body (17^2: 0.3 s;
# 9^3: 1 s).
_CHECK_NODES = {2: 17, 3: 9}


def _loads(v: tuple[float, ...]) -> str | None:
    bad = interval(v)
    if bad is None and v[0] <= 0:
        return f"need 0 < low < high (a scale of each side's traction; its direction is the side's), got {list(v)}"
    return bad


_SCALED = "a traction is scaled by the instance's load"


@dataclass(frozen=True)
class HyperelasticityFamily(ElasticBox, SolvedBox, Family):
    """A Neo-Hookean body in plane strain on the unit square's node grid (N_y, N_x); the displacement (S, 2, N_y, N_x)."""

    resolution: tuple[int, ...]
    kl_terms: int = option(4, "m, KL terms of log mu", integer_in(1, 64))
    eta: float = option(0.5, "correlation length η of log mu", positive, key="kl_eta")
    coeff_range: tuple[float, ...] = option((-1.0, 1.0), "range of each coefficient a_i of log mu", interval)
    load_range: tuple[float, ...] = option((0.1, 0.2), "range of the load's magnitude s (each loaded side's traction "
                                           "times s)", _loads)
    shear: float = option(1.0, "the shear modulus mu where log mu's KL field is 0", positive)
    nu: float = option(0.3, "the Poisson ratio (lambda = 2 mu nu / (1 - 2 nu))", poisson_ratio)
    x0: str = vector_side("u=0", 2, "x0")
    x1: str = vector_side("traction=1,-1", 2, "x1", _SCALED)
    y0: str = vector_side("free", 2, "y0")
    y1: str = vector_side("free", 2, "y1")
    truth_refine: int = option(2, "evaluation: the independent reference is the Newton solution on a grid with this "
                               "many times the intervals (2..16)", integer_in(2, 16))

    name = "hyperelasticity"
    in_channels = 4  # log mu, the load, and the coordinates
    unknowns = DISPLACEMENT[2]
    vectors = {"u": DISPLACEMENT[2]}
    capabilities = SOLID_CAPABILITIES
    classical_methods = {"newton-amg": "Newton (line search, load steps) + AMG-CG with the rigid-body modes, to 1e-8",
                         "newton-amg-4": "the same, to 1e-4",
                         "newton-gmg-4": "Newton (line search, load steps) + geometric-multigrid CG, to 1e-4",
                         "newton-cholesky": "Newton (line search, load steps), each step a sparse Cholesky (CHOLMOD), "
                                            "to 1e-8"}  # each from the nearest of the solved library's instances
    classical_baseline = "newton-amg"

    @property
    def linear_solve(self) -> str:
        """Each Newton step's linear solve, the same-grid solve's and the polish's: a sparse Cholesky in 2-D (64², one
        thread: 0.44 s an instance against 0.58-0.73 s by AMG-CG to 1e-10, the same field to 2e-16; 127²: 2.2 s
        against 2.6 s), geometric-multigrid CG in 3-D, where the factor fills in (17³: 1.9-2.3 s an instance against
        AMG-CG's 5.0-5.3 s, the same Newton steps, the same field to 1e-16)."""
        return "cholesky" if self.dims == 2 else "gmg"

    @property
    def polish_step(self) -> str:
        return f"{'Cholesky' if self.linear_solve == 'cholesky' else 'geometric-multigrid CG'} Newton step"

    @classmethod
    def check_options(cls, options: object, *, n_train: int, sampling: str, resolution: tuple[int, ...]) -> None:
        """A load the Neo-Hookean energy cannot carry is refused before any run starts: the largest load on the mean
        body, on the check grid, once per configuration (a family built again on another grid is not re-checked)."""
        super().check_options(options, n_train=n_train, sampling=sampling, resolution=resolution)
        failure = _inverted(cls.from_options(options, (_CHECK_NODES[len(resolution)],) * len(resolution)))
        if failure:
            raise ValueError(f"load_range: {failure}")

    def describe(self) -> str:
        sides = self.sides_text()
        return (f"Neo-Hookean, mu={self.shear:g} exp KL(m={self.kl_terms}, a in {list(self.coeff_range)}), "
                f"nu={self.nu:g}, load s in {list(self.load_range)}, {sides}")

    # -- instances ------------------------------------------------------------------------
    @property
    def parameters(self) -> ParameterSpec:
        lo, hi = self.coeff_range
        m = self.kl_terms
        return ParameterSpec("a", (m + 1,), (lo,) * m + (self.load_range[0],), (hi,) * m + (self.load_range[1],),
                             names=tuple(f"a{i + 1}" for i in range(m)) + ("load",),
                             description="log mu's KL coefficients and the load's magnitude",
                             limits=((-np.inf,) * m + (0.0,), (np.inf,) * (m + 1)))

    def shear_modulus(self, instances: torch.Tensor) -> torch.Tensor:
        """Nodal shear modulus (S, *resolution) of instances (S, m + 1)."""
        return self.shear * torch.exp(kl_log_field(instances[:, : self.kl_terms], self.eta, self.kl_terms, self.resolution))

    modulus = shear_modulus

    # -- the loss ----------------------------------------------------------------------
    def loss_terms(self, u: torch.Tensor, instances: torch.Tensor) -> dict[str, torch.Tensor]:
        """The total potential energy per sample: the stored energy less the scaled tractions' work."""
        load = self._side_fields(u)[2]
        p = instances.to(u.dtype)
        stored = neo_hookean_energy(u, self.shear_modulus(p), self.nu, self.spacing)
        return {"energy": stored - p[:, -1] * (load * u).flatten(1).sum(1)}

    def loss(self) -> Energy:
        """The Neo-Hookean energy, its Hessian the tangent stiffness (:meth:`hessian`), its admissible fields those with
        det F > 0 (:meth:`admissible`)."""
        return Energy(self.loss_terms, hessian=self.hessian, admissible=self.admissible)

    def hessian(self, u: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
        """The energy's Hessian at u, the tangent stiffness, as a block stencil (S, d, d, 3^d, *grid) (``precondition``)."""
        return neo_hookean_stencil(u, self.shear_modulus(instances.to(u.dtype)), self.nu, self.spacing)

    def admissible(self, u: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
        """(S,) bool: no element inverted (det F > 0 at every Gauss point); the coarse correction's line search keeps it."""
        return smallest_jacobian(u, self.spacing) > 0

    def derived(self, instances, fields) -> dict:
        """The Cauchy stress (a symmetric tensor (S, K, *grid): 2-D xx, yy, xy; 3-D xx, yy, zz, xy, yz, xz) and its von
        Mises stress (S, *grid) of displacements (S, d, *grid), plane strain's σ_zz in the latter: at the Gauss points
        from F = I + ∇u and mu there (:func:`~diffnet.discretisation.hyperelasticity.cauchy_stress`), recovered to the
        nodes (:mod:`diffnet.grid.recovery`), as linear elasticity's; numpy or torch in, the same out (differentiable)."""
        u, back = as_tensors(fields)
        p = torch.as_tensor(instances, dtype=u.dtype, device=u.device)
        grad = gauss_gradients(u, self.spacing)  # (S, d (i), d (j), Q, *cells)
        mu = at_gauss(self.shear_modulus(p), self.dims)
        sigma = cauchy_stress([[grad[:, i, j] for j in range(self.dims)] for i in range(self.dims)], mu,
                              2.0 * mu * self.nu / (1.0 - 2.0 * self.nu))
        if self.dims == 2:
            sxx, syy, szz, sxy = sigma
            components, mises = [sxx, syy, sxy], von_mises(sxx, syy, szz, sxy, 0.0 * sxy, 0.0 * sxy)
        else:
            components, mises = sigma, von_mises(*sigma)
        return back({"stress": to_nodes(torch.stack(components, dim=1), self.dims),
                     "von_mises": to_nodes(mises, self.dims)})

    # -- references ---------------------------------------------------------------------
    def body(self, instances: np.ndarray) -> NeoHookeanBody:
        """One instance (m + 1,) as the classical solver's body."""
        p = np.asarray(instances, dtype=np.float64)
        mu = self.shear_modulus(torch.as_tensor(p[None]))[0].numpy()
        return NeoHookeanBody(mu, self.nu, self.boundaries, float(p[-1]))

    def solve(self, instances: np.ndarray, tol: float = 1e-10, linear_tol: float = 1e-10,
              stats: NewtonStats | None = None, linear: str = "amg", start: np.ndarray | None = None) -> np.ndarray:
        """One instance's minimiser on this grid (d, *grid) by Newton from ``start`` (or the held values), each step
        by ``linear`` ("amg": AMG-CG; "cholesky"); a failure is one line naming it."""
        try:
            return self.body(instances).solve(tol, linear_tol, start=start, stats=stats, linear=linear)
        except NewtonFailure as e:
            values = ", ".join(f"{v:.3g}" for v in np.asarray(instances, dtype=np.float64))
            raise ValueError(f"the {self.name} instance ({values}) on {'x'.join(map(str, self.resolution))}: {e}") from None

    solution = "Newton solution"
    labels = ("mu", "load")

    def solve_instance(self, instances: np.ndarray, start: np.ndarray | None = None) -> np.ndarray:
        """One instance's minimiser of the energy on this grid (d, *resolution), Newton to 1e-10 of the load from
        ``start`` (d, *resolution) or the held values, each step by :attr:`linear_solve`."""
        return self.solve(instances, start=start, linear=self.linear_solve)

    def discrete_optimum(self, instances: np.ndarray, initial: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The same-grid minimiser (the floor), Newton from ``initial`` (S, d, *resolution) where given: from a nearby
        instance's solution 3 steps instead of 8 at 64² (an inverse problem's chains and line searches)."""
        instances = np.asarray(instances, dtype=np.float64)
        starts = initial if initial is not None else [None] * len(instances)
        return np.stack([self.solve_instance(p, u) for p, u in zip(instances, starts)]), np.ones(len(instances), dtype=bool)

    # -- the classical side and the polish ------------------------------------------------
    def classical_solver(self, method: str, grid: int) -> "NewtonSolve":
        """One instance's solution (d, *grid) on ``grid`` nodes per side, Newton from the nearest instance already
        solved (:func:`solved_library`, built here, before any call is timed): every Newton step (assembly, AMG set-up,
        CG) inside the call; the call's cost (Newton steps, load steps) is the solver's ``last``."""
        if method not in self.classical_methods:
            raise ValueError(f"unknown method {method!r}; choose from {', '.join(self.classical_methods)}")
        coarse = dataclasses.replace(self, resolution=(grid,) * self.dims)
        return NewtonSolve(coarse, 1e-4 if method.endswith("-4") else 1e-8, method.split("-")[1],
                           solved_library(coarse))

    def classical_to_grid(self, method: str, native: np.ndarray, instances: np.ndarray) -> np.ndarray:
        """A solution carried onto this grid's nodes, component by component (multilinear on its elements)."""
        return np.stack([q1_to_grid(self, component) for component in native])

    def polish(self, instances: np.ndarray, fields: np.ndarray, steps: int) -> np.ndarray:
        """``steps`` damped Newton steps from the network's fields (S, d, *grid), each by :attr:`linear_solve`: "DiffNet
        + k Newton steps"."""
        out = np.empty_like(np.asarray(fields, dtype=np.float64))
        for k, p in enumerate(np.asarray(instances, dtype=np.float64)):
            out[k] = self.body(p).polish(fields[k], steps, self.linear_solve)
        return out


@dataclass(frozen=True)
class Hyperelasticity3DFamily(HyperelasticityFamily):
    """A Neo-Hookean body on the unit cube's node grid (N_z, N_y, N_x); the displacement (S, 3, N_z, N_y, N_x)."""

    x0: str = vector_side("u=0", 3, "x0")
    x1: str = vector_side("traction=1,0,-1", 3, "x1", _SCALED)
    y0: str = vector_side("free", 3, "y0")
    y1: str = vector_side("free", 3, "y1")
    truth_refine: int = option(2, "evaluation: the independent reference is the Newton solution on a grid with this "
                               "many times the intervals (2..8)", integer_in(2, 8))
    z0: str = vector_side("free", 3, "z0")
    z1: str = vector_side("free", 3, "z1")

    name = "hyperelasticity3d"
    dims = 3
    classical_methods = {k: v for k, v in HyperelasticityFamily.classical_methods.items() if k != "newton-cholesky"}  # 3-D fill-in
    in_channels = 5  # log mu, the load, and the three coordinates
    unknowns = DISPLACEMENT[3]
    vectors = {"u": DISPLACEMENT[3]}


# The classical side's library: this many instances of the training range solved once per grid, each classical solve
# starting from the nearest (a user with a stock of solved cases, as an inverse problem's chains have: Newton from a
# neighbour's field, docs/results.md), drawn from a stream of its own (not the held-out instances').
_LIBRARY, _LIBRARY_SEED = 16, 7919


@functools.lru_cache(maxsize=8)
def solved_library(family: HyperelasticityFamily) -> tuple[np.ndarray, np.ndarray]:
    """:data:`_LIBRARY` Sobol instances of the family's range (S, m + 1) and their minimisers on its grid (S, d,
    *grid), solved once per process and grid."""
    instances = family.sample(_LIBRARY, "sobol", _LIBRARY_SEED)
    return instances, family.discrete_optimum(instances)[0]


@dataclass
class NewtonSolve:
    """A classical solve of one instance on the family's grid, Newton and linear tolerance ``tol``, from the nearest
    of ``library``'s solved instances (distance in units of the range's width; None: from the held values); ``last``
    is the latest call's :class:`NewtonStats` (``compare`` reports its Newton steps)."""

    family: HyperelasticityFamily
    tol: float
    linear: str = "amg"  # each Newton step's solve: "amg", "gmg" or "cholesky"
    library: tuple[np.ndarray, np.ndarray] | None = None
    last: NewtonStats | None = None

    def __call__(self, instances: np.ndarray) -> np.ndarray:
        self.last = NewtonStats()
        start = None
        if self.library is not None:
            low, high = self.family.parameters.bounds()
            rows, fields = self.library
            start = fields[int((((rows - instances) / (np.asarray(high) - low)) ** 2).sum(1).argmin())]
        return self.family.solve(instances, self.tol, self.tol, self.last, self.linear, start=start)


def _inverted(family: HyperelasticityFamily) -> str | None:
    """Why the largest load inverts the mean body (log mu's KL field 0) on the check grid, or None: a load the
    Neo-Hookean energy cannot carry is refused before any run starts."""
    p = np.zeros(family.kl_terms + 1)
    p[-1] = family.load_range[1]
    try:
        family.body(p).solve(1e-8, 1e-8, max_steps=12)  # a load it carries converges in under 10 steps a load step
    except NewtonFailure as e:
        return f"the largest load {family.load_range[1]:g} on the mean body: {e}"
    return None
