"""Linear elasticity of a body on the unit square (plane strain or plane stress) or cube: a family with a
vector unknown, the displacement u = (u_x, u_y[, u_z]).

An instance is a log Young's modulus from the Karhunen-Loève family of the diffusivity families (m
coefficients) and the Poisson ratio nu: E = exp(sum_i a_i lambda_i^{d/2} prod_k phi_i(x_k)). Each side
of the box is held ("u=0", "u=V_X,V_Y"), loaded ("traction=T_X,T_Y") or free
(:func:`diffnet.instances.boundary.parse_vector_side`). The loss is the Q1 total potential energy
(:mod:`diffnet.discretisation.elasticity`), the floor the same-grid Q1 solution and the truth the Q1 solution on a
grid ``truth_refine`` times finer, both by CG preconditioned by geometric multigrid
(:mod:`diffnet.solvers.elasticity`, :mod:`diffnet.solvers.vector_gmg`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from diffnet.instances.boundary import PIN_DOC, SIDES, SideFields, component_boundaries, parse_pin, pin_check, vector_side_check
from diffnet.solvers.classical import q1_configurations, q1_to_grid
from diffnet.backend.constants import constant
from diffnet.discretisation.elasticity import elasticity_energy, elasticity_stencil
from diffnet.grid.material import PLANES, POISSON_RATIO, strain_components, stress_components, von_mises
from diffnet.grid.recovery import as_tensors, at_gauss, gauss_gradients, to_nodes
from diffnet.protocol.family import Family, ParameterSpec
from diffnet.protocol.loss import Energy
from diffnet.protocol.options import integer_in, interval, one_of, option, positive
from diffnet.families.kl_family import kl_log_field
from diffnet.solvers.elasticity import ElasticitySystem, elasticity_system, free_rigid_motion, multigrid, to_dofs

__all__ = ["ElasticBox", "SolvedBox", "ElasticityFamily", "Elasticity3DFamily", "poisson_ratio", "poisson_ratio_range"]


def _incompressible(what: str, got: object) -> str:
    lower, upper = POISSON_RATIO
    return (f"need {lower:g} < {what} < {upper:g} (at nu = {upper:g} the solid is incompressible: lambda is infinite "
            f"and the Q1 element locks), got {got}")


def poisson_ratio(v: float) -> str | None:
    """What is wrong with a Poisson ratio (an option's check), or None."""
    lower, upper = POISSON_RATIO
    return None if lower < v < upper else _incompressible("nu", v)


def poisson_ratio_range(v: tuple[float, ...]) -> str | None:
    """What is wrong with a range of Poisson ratios (an option's check), or None."""
    bad = interval(v)
    lower, upper = POISSON_RATIO
    if bad is None and not (lower < v[0] and v[1] < upper):
        return _incompressible("low < high", list(v))
    return bad


# A solid's unknowns and the vector they form, by dimension, and what a solid on the whole box provides (one
# declaration for every solid family).
DISPLACEMENT = {2: ("u_x", "u_y"), 3: ("u_x", "u_y", "u_z")}
SOLID_CAPABILITIES = frozenset({"reference", "floor", "input_fields", "classical", "polish", "derived", "differentiable"})


def vector_side(default: str, dims: int, side: str, note: str = ""):
    """A solid's side key (``x0`` .. ``z1``): an :func:`~diffnet.protocol.options.option` of ``default``, its meaning (the
    first side's in full, the others' "as x0", with ``note``) and its check for a ``dims``-D body."""
    names = "XYZ"[:dims]
    what = (f"the side {side[0]} = {side[1]}: \"u=V\" or \"u={','.join(f'V_{c}' for c in names)}\" (held; a component "
            f"\"free\": a roller), \"traction={','.join(f'T_{c}' for c in names)}\", \"free\"" if side == "x0" else
            f"the side {side[0]} = {side[1]} (as x0{'; ' + note if note else ''})")
    return option(default, what, vector_side_check(dims))


class ElasticBox(SideFields):
    """The unit box of a solid whose displacement (S, d, *grid) is its unknown: one boundary per component from the
    sides' texts, the node coordinates and spacings, the field with the held sides' values exactly, and the checks of
    the grid, the supports and a load (shared by the linear and Neo-Hookean families and the plate with a hole)."""

    def __post_init__(self) -> None:
        """The grid, the supports and a load checked once, for every solid on the box (one line each)."""
        if len(self.resolution) != self.dims or min(self.resolution) < 3:
            raise ValueError(f"problem.resolution: the {self.name} family needs {self.dims} sizes with at least 3 nodes "
                             f"each, got {list(self.resolution)}")
        self.check_supports()
        if all(side.value == 0.0 for b in self.boundaries for side in b.sides.values()):
            raise ValueError("x1: no load: every side is held at 0 or free and none carries a traction, so every "
                             "instance's displacement is zero and a relative error against it has no meaning; give a "
                             "side a traction (\"traction=T_X,T_Y\") or a held displacement other than 0")

    @property
    def boundaries(self):
        """One :class:`~diffnet.instances.boundary.BoxBoundary` per displacement component, x first."""
        return component_boundaries(dict(zip(SIDES, self.sides)), self.dims)

    def coordinates(self) -> dict[str, np.ndarray]:
        names = ("z", "y", "x")[-self.dims:]
        return {k: np.linspace(0.0, 1.0, n) for k, n in zip(names, self.resolution)}

    @property
    def spacing(self) -> tuple[float, ...]:
        return tuple(1.0 / (n - 1) for n in reversed(self.resolution))

    @property
    def pinned(self) -> np.ndarray:
        """The grid's node nearest the ``pin`` point (bool, ``resolution``), all False without one (``"none"``)."""
        mask = np.zeros(self.resolution, dtype=bool)
        point = parse_pin(getattr(self, "pin", "none"), self.dims)
        if point is not None:
            mask[tuple(round(c * (n - 1)) for c, n in zip(reversed(point), self.resolution))] = True
        return mask

    def held(self) -> tuple[np.ndarray, np.ndarray]:
        """Per component, x first, (d, *grid) each: the held nodes (the sides' and the pin's) and their values."""
        fixed, values = (np.stack(a) for a in zip(*(b.fixed(self.resolution) for b in self.boundaries)))
        pinned = self.pinned
        return fixed | pinned, np.where(pinned, 0.0, values)

    def check_supports(self) -> None:
        """ValueError (one line) unless the held components stop every rigid-body motion of the box (its sides'
        held components and the pin, on this grid)."""
        free = free_rigid_motion(self.held()[0])
        if free:
            raise ValueError(f"x0: the supports leave the body free to {free}: hold a component on another side "
                             f"(\"u=0,free\" is a roller) or pin a point (pin = \"X,Y\")")

    # -- the field and the loss ---------------------------------------------------------
    def _side_fields(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per component, x first, (d, *grid) each: the free-node mask, the lift and the traction load."""
        grid = tuple(self.resolution)
        key = ("elastic box", self.sides, getattr(self, "pin", "none"), grid)
        host = torch.zeros((), dtype=like.dtype)
        pinned = torch.as_tensor(self.pinned)
        return (constant(key + ("free",), lambda: torch.as_tensor(~self.held()[0], dtype=host.dtype), like),
                constant(key + ("lift",), lambda: torch.stack([b.lift(grid, host) for b in self.boundaries])
                         .masked_fill(pinned, 0.0), like),
                constant(key + ("load",), lambda: np.stack([b.flux_load(grid) for b in self.boundaries]), like))

    def field(self, raw: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
        """u = lift + M * N per component: the held sides' values exactly, the network's output elsewhere."""
        free, lift, _ = self._side_fields(raw)
        return lift + raw * free

    def box_inputs(self, log_field: torch.Tensor, scalar: torch.Tensor) -> torch.Tensor:
        """A solid's network input (S, 2 + d, *resolution): a material's nodal log field (S, *resolution), a scalar
        parameter (S,) as a constant field, then the coordinates, outermost first."""
        s = log_field.shape[0]
        constant_field = scalar.reshape(s, *([1] * self.dims)).expand(s, *self.resolution)
        axes = [constant(("grid", k, self.resolution), lambda k=k: self.coordinates()[k], log_field)
                for k in self.coordinates()]
        grids = torch.meshgrid(*axes, indexing="ij")
        return torch.stack([log_field, constant_field, *(g.expand(s, *self.resolution) for g in grids)], dim=1)


class SolvedBox:
    """A solid on the whole box whose KL coefficients give a modulus field and whose instance ends in one scalar (the
    Poisson ratio, the load): the network's inputs and the plots' fields from them, and its references, one solve per
    instance: on this grid (the floor) and on a grid ``truth_refine`` times finer (the truth), and the classical
    sweep's grids. A family declares ``solution`` (what its solve is called: "Q1 solution", "Newton solution"),
    ``labels`` (the modulus's and the last entry's names) and :meth:`modulus` and :meth:`solve_instance` (shared by
    the linear and the Neo-Hookean families; the plate with a hole has its own, on its cut domain)."""

    solution: ClassVar[str]
    labels: ClassVar[tuple[str, str]]

    def modulus(self, instances: torch.Tensor) -> torch.Tensor:
        """The nodal modulus (S, *resolution) of instances (S, m + 1)."""
        raise NotImplementedError

    def solve_instance(self, instances: np.ndarray) -> np.ndarray:
        """One instance's discrete solution on this grid (d, *resolution)."""
        raise NotImplementedError

    def input_fields(self, instances: np.ndarray) -> tuple[np.ndarray, list[str]]:
        """log10 of each instance's modulus, its last entry in the label."""
        p = np.asarray(instances, dtype=np.float64)
        modulus, last = self.labels
        return (np.log10(self.modulus(torch.as_tensor(p)).numpy()),
                [f"{modulus}, {last} = {row[-1]:.3f}" for row in p])

    def inputs(self, instances: torch.Tensor) -> torch.Tensor:
        """(S, 2 + d, *resolution): log modulus, the last entry as a constant field, then the coordinates, outermost
        first."""
        return self.box_inputs(torch.log(self.modulus(instances)), instances[:, -1])

    def _solutions(self, instances: np.ndarray, progress, stride: int = 1) -> np.ndarray:
        every = (slice(None),) + (slice(None, None, stride),) * self.dims
        out = np.empty((len(instances), self.dims, *((n - 1) // stride + 1 for n in self.resolution)))
        for k in range(len(instances)):
            out[k] = self.solve_instance(instances[k])[every]
            if progress is not None:
                progress(k + 1, len(instances))
        return out

    def reference(self, instances: np.ndarray, progress=None) -> np.ndarray:
        """The discrete solutions on this grid (S, d, *resolution) (:meth:`solve_instance`)."""
        return self._solutions(np.asarray(instances, dtype=np.float64), progress)

    def reference_name(self) -> str:
        return f"the {self.solution} on this grid"

    def discrete_optimum(self, instances: np.ndarray, initial: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The same-grid minimiser of the trained energy: the grid's floor."""
        return self.reference(instances), np.ones(len(instances), dtype=bool)

    def floor_name(self) -> str:
        return f"the {self.solution} on this grid"

    def truth(self, instances: np.ndarray, progress=None) -> np.ndarray:
        """The solution on the grid ``truth_refine`` times finer, read off this grid's nodes."""
        r = self.truth_refine
        fine = dataclasses.replace(self, resolution=tuple(r * (n - 1) + 1 for n in self.resolution))
        return fine._solutions(np.asarray(instances, dtype=np.float64), progress, stride=r)

    def truth_name(self) -> str:
        r = self.truth_refine
        return f"{self.solution[0].upper()}{self.solution[1:]} on " + "x".join(str(r * (n - 1) + 1) for n in
                                                                              self.resolution) + f" ({r}x finer)"

    def classical_configurations(self) -> dict[str, list[int]]:
        """Nodes per side, coarse to fine, below the truth's grid (the Q1 families' sweep)."""
        grids = q1_configurations(self)["fmg"]
        return {method: grids for method in self.classical_methods}


@dataclass(frozen=True)
class ElasticityFamily(ElasticBox, SolvedBox, Family):
    """Plane linear elasticity on the unit square's node grid (N_y, N_x); the displacement (S, 2, N_y, N_x)."""

    resolution: tuple[int, ...]
    kl_terms: int = option(4, "m, KL terms of log E", integer_in(1, 64))
    eta: float = option(0.5, "correlation length η of log E", positive, key="kl_eta")
    coeff_range: tuple[float, ...] = option((-1.5, 1.5), "range of each coefficient a_i of log E", interval)
    nu_range: tuple[float, ...] = option((0.2, 0.4), "range of the Poisson ratio nu", poisson_ratio_range)
    plane: str = option("stress", "2-D model: \"stress\" (a thin plate) or \"strain\"", one_of(*PLANES))
    x0: str = vector_side("u=0", 2, "x0")
    x1: str = vector_side("traction=0,-1", 2, "x1")
    y0: str = vector_side("free", 2, "y0")
    y1: str = vector_side("free", 2, "y1")
    truth_refine: int = option(4, "evaluation: the independent reference is the Q1 solution on a grid with this "
                               "many times the intervals (2..16)", integer_in(2, 16))
    pin: str = option("none", PIN_DOC, pin_check(2))

    name = "elasticity"
    in_channels = 4  # log E, nu, and the coordinates
    unknowns = DISPLACEMENT[2]
    vectors = {"u": DISPLACEMENT[2]}
    capabilities = SOLID_CAPABILITIES
    # The classical side of ``compare``: the same Q1 system on a sweep of grids, AMG-CG with the rigid-body modes,
    # geometric-multigrid CG and (2-D) a sparse Cholesky.
    classical_methods = {"sa-rbm": "pyamg smoothed aggregation with the rigid-body modes + CG to 1e-8",
                         "sa-rbm-4": "the same, to 1e-4",
                         "gmg": "geometric multigrid (each component interpolated, Galerkin, Gauss-Seidel) + CG to 1e-8",
                         "gmg-4": "the same, to 1e-4",
                         "cholesky": "sparse Cholesky (CHOLMOD), assembly and factorisation per solve"}
    classical_baseline = "sa-rbm"
    polish_step = "AMG V-cycle"

    def describe(self) -> str:
        sides = self.sides_text()
        return (f"plane {self.plane} " if self.dims == 2 else "") + \
            f"E=exp KL(m={self.kl_terms}, a in {list(self.coeff_range)}), nu in {list(self.nu_range)}, {sides}"

    # -- instances ------------------------------------------------------------------------
    @property
    def parameters(self) -> ParameterSpec:
        lo, hi = self.coeff_range
        m = self.kl_terms
        infinite = (np.inf,) * m
        return ParameterSpec("a", (m + 1,), (lo,) * m + (self.nu_range[0],), (hi,) * m + (self.nu_range[1],),
                             names=tuple(f"a{i + 1}" for i in range(m)) + ("nu",),
                             description="log E's KL coefficients and the Poisson ratio",
                             limits=(tuple(-v for v in infinite) + (POISSON_RATIO[0],), infinite + (POISSON_RATIO[1],)))

    def young(self, instances: torch.Tensor) -> torch.Tensor:
        """Nodal Young's modulus (S, *resolution) of instances (S, m + 1)."""
        return torch.exp(kl_log_field(instances[:, : self.kl_terms], self.eta, self.kl_terms, self.resolution))

    modulus = young

    def loss_terms(self, u: torch.Tensor, instances: torch.Tensor) -> dict[str, torch.Tensor]:
        """The total potential energy per sample: the strain energy less the tractions' work."""
        load = self._side_fields(u)[2]
        young = self.young(instances.to(u.dtype))
        strain = elasticity_energy(u, young, instances[:, -1].to(u.dtype), self.spacing, self.plane)
        return {"energy": strain - (load * u).flatten(1).sum(1)}

    def loss(self) -> Energy:
        """The strain energy, its Hessian the Q1 stiffness (:meth:`hessian`)."""
        return Energy(self.loss_terms, hessian=self.hessian)

    def hessian(self, u: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
        """The energy's Hessian, the Q1 stiffness, as a block stencil (S, d, d, 3^d, *grid) (``precondition``)."""
        return elasticity_stencil(self.young(instances.to(u.dtype)), instances[:, -1].to(u.dtype), self.spacing, self.plane)

    def derived(self, instances, fields) -> dict:
        """Strain and stress (symmetric tensors (S, K, *grid), :data:`~diffnet.grid.material.SYMMETRIC` order: 2-D xx,
        yy, xy; 3-D xx, yy, zz, xy, yz, xz) and von Mises (S, *grid) of displacements (S, d, *grid): the Q1
        gradients and E at the Gauss points, recovered to the nodes (:mod:`diffnet.grid.recovery`). numpy in, numpy
        out; torch tensors in, tensors out, differentiable in both (``differentiable``)."""
        u, back = as_tensors(fields)
        p = torch.as_tensor(instances, dtype=u.dtype, device=u.device)
        grad = gauss_gradients(u, self.spacing)  # (S, d (i), d (j), Q, *cells)
        g = [[grad[:, i, j] for j in range(self.dims)] for i in range(self.dims)]
        nu = p[:, -1].reshape(-1, *([1] * (self.dims + 1)))
        young = at_gauss(self.young(p), self.dims)
        strain = to_nodes(torch.stack(strain_components(g), dim=1), self.dims)
        stress = to_nodes(torch.stack(stress_components(g, young, nu, self.plane), dim=1), self.dims)
        return back({"strain": strain, "stress": stress,
                     "von_mises": von_mises(*stress.unbind(1), nu=nu[:, 0, 0], plane=self.plane)})

    # -- references ---------------------------------------------------------------------
    def system(self, instances: np.ndarray) -> ElasticitySystem:
        """The assembled Q1 system of one instance (m + 1,)."""
        p = np.asarray(instances, dtype=np.float64)
        young = self.young(torch.as_tensor(p[None]))[0].numpy()
        return elasticity_system(young, float(p[-1]), self.boundaries, self.plane, held=self.held())

    solution = "Q1 solution"
    labels = ("E", "nu")

    def solve_instance(self, instances: np.ndarray) -> np.ndarray:
        """One instance's Q1 solution (d, *resolution) by geometric-multigrid CG, to 1e-10 (at 65³, one thread: 17 s
        an instance to 1e-8, against 50 s for smoothed aggregation to 1e-4)."""
        return self.system(instances).solve("gmg")

    # -- the classical side and the polish ------------------------------------------------
    def classical_solver(self, method: str, grid: int):
        """One instance's Q1 solution (d, *grid) on ``grid`` nodes per side; assembly and multigrid set-up inside the
        call."""
        if method not in self.classical_methods:
            raise ValueError(f"unknown method {method!r}; choose from {', '.join(self.classical_methods)}")
        coarse = dataclasses.replace(self, resolution=(grid,) * self.dims)
        if method == "cholesky":
            return lambda instances: coarse.system(instances).solve("cholesky")
        tol = 1e-4 if method.endswith("-4") else 1e-8
        solver = "gmg" if method.startswith("gmg") else "amg"
        return lambda instances: coarse.system(instances).solve(solver, tol=tol)

    def classical_to_grid(self, method: str, native: np.ndarray, instances: np.ndarray) -> np.ndarray:
        """A Q1 solution carried onto this grid's nodes, component by component (multilinear on its elements)."""
        return np.stack([q1_to_grid(self, component) for component in native])

    def polish(self, instances: np.ndarray, fields: np.ndarray, cycles: int) -> np.ndarray:
        """``cycles`` V-cycles of the instance's smoothed-aggregation hierarchy (rigid-body modes) from the network's
        fields (S, d, *grid): "DiffNet + k AMG V-cycles". The held dofs keep their values."""
        out = np.empty_like(np.asarray(fields, dtype=np.float64))
        for k, p in enumerate(np.asarray(instances, dtype=np.float64)):
            system = self.system(p)
            out[k] = multigrid(system).vcycles(to_dofs(fields[k]), cycles)
        return out


@dataclass(frozen=True)
class Elasticity3DFamily(ElasticityFamily):
    """Linear elasticity on the unit cube's node grid (N_z, N_y, N_x); the displacement (S, 3, N_z, N_y, N_x)."""

    # (plane unused: a 3-D body is its own model; the truth 2x finer: 4x at 33^3 would be 129^3 x 3 = 6.4 M
    # unknowns per instance)
    plane: str = option("strain", "unused in 3-D (\"strain\")", one_of("strain"))
    x0: str = vector_side("u=0", 3, "x0")
    x1: str = vector_side("traction=0,0,-1", 3, "x1")
    y0: str = vector_side("free", 3, "y0")
    y1: str = vector_side("free", 3, "y1")
    truth_refine: int = option(2, "evaluation: the independent reference is the Q1 solution on a grid with this "
                               "many times the intervals (2..8)", integer_in(2, 8))
    z0: str = vector_side("free", 3, "z0")
    z1: str = vector_side("free", 3, "z1")

    name = "elasticity3d"
    dims = 3
    # No sparse Cholesky in 3-D: its fill-in makes it the slower solve at every size swept (17³: 665 ms against
    # AMG-CG's 221 ms; 33³: 45 s against 2.2 s).
    classical_methods = {k: v for k, v in ElasticityFamily.classical_methods.items() if k != "cholesky"}
    in_channels = 5  # log E, nu, and the three coordinates
    unknowns = DISPLACEMENT[3]
    vectors = {"u": DISPLACEMENT[3]}
