"""What the families on an immersed domain share (2-D): the field on the domain's active nodes, the
network's inputs (the signed distance and the coordinates), the same-grid immersed solve as reference
and floor, the body-fitted solve as truth, V-cycles as polish, and the classical sweep (the immersed
system by multigrid on other grids, and the body-fitted FEM on other meshes).

A family on a cut domain mixes :class:`ImmersedFamily` into :class:`~diffnet.protocol.family.Family` (as
``class MyFamily(ImmersedFamily, Family)``) and declares, as public members:

* ``shape(instances) -> Shape`` (required): one instance's domain (:mod:`diffnet.instances.geometry`);
* ``body_fitted(instances, h) -> ndarray`` (required for the evaluation's truth): the independent reference,
  a body-fitted solve at mesh size h (:func:`diffnet.solvers.bodyfitted.body_fitted_solve`) read at this
  grid's nodes inside the domain, zero outside;
* ``cut_condition`` (default u = 0): the condition on the cut boundary Γ, a :class:`~diffnet.instances.boundary.Side`,
  ``Side("u", g)`` (held weakly by Nitsche's terms) or ``Side("flux", 0.0)`` (insulated);
* ``box_conditions`` (default None): a :class:`~diffnet.instances.boundary.BoxBoundary` for the parts of the
  domain's boundary on the unit square's sides (a Dirichlet value held exactly, or a flux);
* ``coefficient(instances) -> ndarray`` (default 1): one instance's nodal ν, shape ``resolution``;
* ``source`` (default 0): the constant f of -∇·(ν∇u) = f;
* ``input_channels(instances, sdf) -> list[Tensor]`` (default ``[sdf]``): the network's channels before the
  coordinates (``in_channels`` counts them and the two coordinates).

From them it gets the discretisation (built once per instance and process, :meth:`ImmersedFamily.discretised`),
the field (the box's Dirichlet values, the network's output elsewhere, zero off the active nodes), the
energy as the loss, the inputs, the same-grid immersed solve as reference and floor, the body-fitted truth,
the polish, the preconditioned loss's B g and the classical sweep. A family may override any of them
(``loss_terms``, to weigh its instances alike; ``discretise``, to build the discretisation its own way).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Callable

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch

from diffnet.backend.budget import cache_bytes
from diffnet.grid.nodal import inside_only
from diffnet.grid.recovery import gauss_gradients, to_nodes
from diffnet.instances.boundary import BoxBoundary, Side
from diffnet.solvers.classical import Q1_METHODS, Q1Classical, q1_configurations, q1_to_grid
from diffnet.instances.cutcell import cut_cells
from diffnet.instances.geometry import Shape
from diffnet.discretisation.immersed import Immersed, immersed, immersed_energy, immersed_matrices
from diffnet.multigrid.hessian import probe_stencil
from diffnet.protocol.loss import Energy
from diffnet.solvers.fem import FEMSystem, grid_spacing
from diffnet.solvers.matrix_stencil import apply_dirichlet

__all__ = ["ImmersedFamily"]

BODY_FITTED = "body-fitted"
class _Cache(OrderedDict):
    """(family, row bytes) -> (what was built, its bytes), least recently used first, with their total, within its
    share of the process's budget (:func:`diffnet.backend.budget.cache_bytes` of ``share``, read when it keeps)."""

    def __init__(self, share: str) -> None:
        super().__init__()
        self.share = share
        self.nbytes = 0


# Keyed by (family, instance): equal families share, and a family made again for another grid (a multigrid
# level, the coarse correction's coarse grid: a new object each step) finds what the last one built. A 128^2
# instance's discretisation is about 1.7 MB; its assembled multigrid (the preconditioned loss's B g, the polish)
# 4 MB, and one built again costs 0.4 s.
_DISCRETISATIONS = _Cache("discretisations")
_HESSIANS = _Cache("hessians")
_MULTIGRIDS = _Cache("multigrids")


def _recall(cache: _Cache, key):
    """What ``cache`` keeps under ``key``, now its most recently used, or None."""
    if key not in cache:
        return None
    cache.move_to_end(key)
    return cache[key][0]


def _keep(cache: _Cache, key, value) -> None:
    """Remember ``value`` under ``key``, forgetting the least recently used past the cache's share of the budget."""
    limit = cache_bytes(cache.share)
    cache[key] = (value, value.nbytes if isinstance(value, torch.Tensor) else _nbytes(value))
    cache.nbytes += cache[key][1]
    while cache.nbytes > limit and len(cache) > 1:
        cache.nbytes -= cache.popitem(last=False)[1][1]


def _nbytes(obj) -> int:
    """The bytes of the arrays in a dataclass of arrays, lists and sparse matrices (an Immersed and its
    CutCells, a multigrid hierarchy)."""
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if sp.issparse(obj):
        return sum(getattr(obj, k).nbytes for k in ("data", "indices", "indptr", "row", "col") if hasattr(obj, k))
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    if dataclasses.is_dataclass(obj):
        return sum(_nbytes(getattr(obj, f.name)) for f in dataclasses.fields(obj))
    if hasattr(obj, "levels"):  # a pyamg hierarchy: its levels' operators, transfers and near-null spaces
        return sum(_nbytes(getattr(level, k, None)) for level in obj.levels for k in ("A", "P", "R", "B"))
    return 0


class ImmersedFamily(Q1Classical):
    """The shared members of the immersed families (see the module docstring)."""

    polish_step = "V-cycle"
    capabilities = frozenset({"reference", "floor", "classical", "polish", "domain", "derived"})
    reference_method = "direct"  # how reference and floor solve the same-grid system (FEMSystem.solve's methods)

    # The private hooks a cut-domain family overrode under an earlier version, and the public member that replaced each:
    # a family that still defines one is refused at configuration (its hook would be ignored without a word).
    retired = {
        "_nu": "coefficient(instances) (one instance's nodal ν)",
        "_system_arguments": "source (the constant f) and cut_condition (Side(\"u\", g) for the value g on the cut "
                             "boundary); a κ²u term: override loss_terms and fem_system",
        "_box": "box_conditions (a BoxBoundary of the square's sides)",
        "_input_channels": "input_channels(instances, sdf)",
        "_body_fitted": "body_fitted(instances, h)",
    }

    # -- what a family declares (module docstring) -----------------------------------------
    cut_condition: Side = Side("u", 0.0)
    box_conditions: BoxBoundary | None = None
    source: float = 0.0

    def shape(self, instances: np.ndarray) -> Shape:
        """One instance's domain."""
        raise NotImplementedError(f"the {type(self).__name__} family declares no shape(instances)")

    def body_fitted(self, instances: np.ndarray, h: float) -> np.ndarray:
        """The body-fitted solve of one instance at mesh size ``h``, at this grid's inside nodes (zero outside)."""
        raise NotImplementedError(f"the {type(self).__name__} family declares no body_fitted(instances, h)")

    def coefficient(self, instances: np.ndarray) -> np.ndarray:
        """One instance's nodal ν, shape ``resolution`` (default 1)."""
        return np.ones(self.resolution)

    def input_channels(self, instances: torch.Tensor, sdf: torch.Tensor) -> list[torch.Tensor]:
        """The network's input channels before the coordinates (default: the signed distance)."""
        return [sdf]

    def discretise(self, instances: np.ndarray) -> Immersed:
        """Build one instance's immersed discretisation: the cut cells of :meth:`shape` on this grid with
        :meth:`coefficient`, Nitsche's terms where ``cut_condition`` holds a value."""
        return immersed(cut_cells(self.shape(instances), self.resolution), self.coefficient(instances),
                        dirichlet=self.cut_condition.kind == "u")

    def _energy_arguments(self) -> dict:
        """f and g of :func:`diffnet.discretisation.immersed.immersed_energy` and :func:`~diffnet.discretisation.immersed.immersed_matrices`."""
        g = {"g": self.cut_condition.value} if self.cut_condition.kind == "u" else {}
        return {"f": self.source, **g}

    def _box_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Dirichlet nodes, their values and the flux load of the box's sides (none without box conditions)."""
        if self.box_conditions is None:
            return np.zeros(self.resolution, dtype=bool), np.zeros(self.resolution), np.zeros(self.resolution)
        fixed, values = self.box_conditions.fixed(self.resolution)
        return fixed, values, self.box_conditions.flux_load(self.resolution)

    # -- the instances' discretisations, each built once -----------------------------------
    def discretised(self, instances: np.ndarray) -> Immersed:
        """One instance's discretisation: :meth:`discretise`'s, built the first time this process meets the
        instance and kept (:mod:`diffnet.backend.budget`): training revisits every instance of a rank's shard each
        epoch, and building it per sample and step made a user's 17² family run at 13 samples/s."""
        row = np.ascontiguousarray(np.ravel(instances), dtype=np.float64)
        key = (self, row.tobytes())
        if key in _DISCRETISATIONS:
            _DISCRETISATIONS.move_to_end(key)
            return _DISCRETISATIONS[key][0]
        data = self.discretise(row.reshape(np.shape(instances)))
        _keep(_DISCRETISATIONS, key, data)
        return data

    def loss(self) -> Energy:
        """The immersed energy, its Hessian the cut cells' assembled stencil (:meth:`hessian`), its preconditioned
        gradient from the assembled system's multigrid (:meth:`assembled_correction`)."""
        return Energy(self.loss_terms, hessian=self.hessian, assembled_correction=self.assembled_correction)

    def hessian(self, u: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
        """The loss's Hessian stencil (S, 9, N_y, N_x): read off the loss by probes (:func:`~diffnet.multigrid.hessian.probe_stencil`)
        the first time an instance is met, then kept: these energies are quadratic, so it does not change
        with the field (the coarse correction, its one user here, refuses a loss whose Hessian does), and
        probing it every step (9 Hessian-vector products) ran the torsion family's training at a fifth of
        its speed."""
        rows = instances.detach().double().cpu().numpy().reshape(len(instances), -1)
        keys = [(self, np.ascontiguousarray(r).tobytes()) for r in rows]
        # The batch's stencils are read before any is kept: keeping one may evict another of the same batch.
        stencils = [_recall(_HESSIANS, key) for key in keys]
        missing = [k for k, stencil in enumerate(stencils) if stencil is None]
        if missing:
            index = torch.as_tensor(missing, device=u.device)
            probed = probe_stencil(self, u.index_select(0, index), instances.index_select(0, index.to(instances.device)))
            for k, stencil in zip(missing, probed.detach().double().cpu()):
                stencils[k] = stencil
                _keep(_HESSIANS, keys[k], stencil)
        return torch.stack(stencils).to(device=u.device, dtype=u.dtype)

    def clear_caches(self) -> None:
        """Forget every instance's discretisation, Hessian and assembled multigrid (a timed solve then builds
        its own)."""
        for cache in (_DISCRETISATIONS, _HESSIANS, _MULTIGRIDS):
            cache.clear()
            cache.nbytes = 0

    # -- geometry, inputs, field ---------------------------------------------------------
    def _data(self, instances: torch.Tensor | np.ndarray) -> list[Immersed]:
        rows = instances.detach().double().cpu().numpy() if isinstance(instances, torch.Tensor) else np.asarray(instances)
        return [self.discretised(p) for p in rows]

    def domain(self, instances: np.ndarray) -> np.ndarray:
        """The signed distance at the nodes (S, N_y, N_x)."""
        return np.stack([d.cells.sdf for d in self._data(instances)])

    def coordinates(self) -> dict[str, np.ndarray]:
        ny, nx = self.resolution
        return {"y": np.linspace(0.0, 1.0, ny), "x": np.linspace(0.0, 1.0, nx)}

    def inputs(self, instances: torch.Tensor) -> torch.Tensor:
        """Network input (S, C, N_y, N_x): the family's channels (the signed distance first), then y and x."""
        sdf = torch.as_tensor(self.domain(instances), dtype=instances.dtype, device=instances.device)
        c = self.coordinates()
        y = torch.as_tensor(c["y"], dtype=instances.dtype, device=instances.device)[:, None].expand(*self.resolution)
        x = torch.as_tensor(c["x"], dtype=instances.dtype, device=instances.device)[None, :].expand(*self.resolution)
        s = sdf.shape[0]
        return torch.stack([*self.input_channels(instances, sdf), y.expand(s, -1, -1), x.expand(s, -1, -1)], dim=1)

    def _active(self, instances: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(np.stack([d.active for d in self._data(instances)]), dtype=like.dtype, device=like.device)

    def _box_fields(self, name: str, like: torch.Tensor) -> torch.Tensor:
        """The box's ``free`` mask, ``held`` Dirichlet values or ``flux`` load in ``like``'s dtype and device,
        built once per grid and conditions (:func:`diffnet.backend.constants.constant`): the field and the loss read
        them every step."""
        from diffnet.backend.constants import constant

        box = None if self.box_conditions is None else self.box_conditions.describe()
        make = {"free": lambda: ~self._box_arrays()[0], "held": lambda: self._box_arrays()[1],
                "flux": lambda: self._box_arrays()[2]}
        return constant(("immersed box", box, tuple(self.resolution), name), make[name], like)

    def field(self, raw: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
        """The box's Dirichlet values and the network's output elsewhere, on the active nodes (those of the
        elements the domain meets), zero off them."""
        held, free = self._box_fields("held", raw), self._box_fields("free", raw)
        return (held + raw[:, 0] * free) * self._active(instances, raw)

    def loss_terms(self, u: torch.Tensor, instances: torch.Tensor) -> dict[str, torch.Tensor]:
        """The immersed energy of -∇·(ν∇u) = f with the conditions on Γ, less the work of the box's fluxes
        (over the active nodes of the flux sides), per instance."""
        rows = instances.detach().double().cpu().numpy()
        nu = torch.as_tensor(np.stack([self.coefficient(p) for p in rows]), dtype=u.dtype, device=u.device)
        energy = immersed_energy(u, nu, self._data(instances), **self._energy_arguments())
        box = self.box_conditions
        if box is not None and any(side.kind == "flux" and side.value != 0.0 for side in box.sides.values()):
            load = self._box_fields("flux", u) * self._active(instances, u)
            energy = energy - (load * u).sum(dim=(1, 2))
        return {"energy": energy}

    # -- classical solves ----------------------------------------------------------------
    def fem_system(self, instances: np.ndarray) -> FEMSystem:
        """The immersed Q1 system of one instance: the energy's matrix, the box's Dirichlet nodes and the
        inactive nodes held (at 0), the fluxes' load added."""
        data = self.discretised(instances)
        S, b = immersed_matrices(data, self.coefficient(instances), **self._energy_arguments())
        fixed, values, flux = self._box_arrays()
        fixed = np.ascontiguousarray(fixed | ~data.active)
        values = np.where(data.active, values, 0.0)
        b += np.where(data.active, flux, 0.0)
        apply_dirichlet(S, b, fixed, values)
        return FEMSystem(S, b.ravel(), fixed.ravel(), values.ravel(), tuple(self.resolution),
                         inactive=~data.active.ravel())

    def _inside(self, instances: np.ndarray, fields: np.ndarray) -> np.ndarray:
        """``fields`` (S, *grid) with the nodes outside the domain set to zero."""
        return inside_only(fields, self.domain(instances))

    def extended(self, instances: np.ndarray, fields: np.ndarray) -> np.ndarray:
        """Fields (S, *grid) given at the inside nodes (a reported field is zero outside the domain) extended to the
        active nodes outside: the values there that minimise the immersed energy with the inside ones held (a small
        solve per instance). The floor's own values come back exactly; a cut element's gradient is then the one its
        energy saw."""
        out = np.array(fields, dtype=np.float64)
        for k, p in enumerate(np.asarray(instances, dtype=np.float64)):
            data = self.discretised(p)
            outside = (data.active & (data.cells.sdf > 0)).ravel()
            if not outside.any():
                continue
            system = self.fem_system(p)
            x = out[k].ravel()
            rows = system.A[outside]
            x[outside] = spla.spsolve(rows[:, outside].tocsc(), system.rhs[outside] - rows[:, ~outside] @ x[~outside])
            out[k] = x.reshape(self.resolution)
        return out

    def gradients(self, instances: np.ndarray, fields: np.ndarray) -> np.ndarray:
        """∇u (S, 2, *grid), x first, of fields (S, *grid) at the inside nodes: the field :meth:`extended` past the edge,
        its Q1 gradients at every element's Gauss points recovered to the nodes (:mod:`diffnet.grid.recovery`), each
        element weighted by its inside fraction; zero outside the domain. The derived fields of the scalar cut-domain
        families are made of it."""
        instances = np.asarray(instances, dtype=np.float64)
        grad = gauss_gradients(self.extended(instances, fields), self.spacing)  # (S, 2, Q, *cells)
        out = np.stack([to_nodes(grad[k], 2, inside_fraction(self.discretised(p))) for k, p in enumerate(instances)])
        return np.stack([self._inside(instances, out[:, j]) for j in range(2)], axis=1)

    def derived(self, instances: np.ndarray, fields: np.ndarray) -> dict[str, np.ndarray]:
        """The flux -ν∇u per component (``flux_x``, ``flux_y``, each (S, *grid)) at the inside nodes, from
        :meth:`gradients` and the nodal coefficient; the truth's from its own nodal values the same way."""
        instances = np.asarray(instances, dtype=np.float64)
        grad = self.gradients(instances, fields)
        nu = np.stack([self.coefficient(p) for p in instances])
        return {"flux_x": -nu * grad[:, 0], "flux_y": -nu * grad[:, 1]}

    @property
    def spacing(self) -> tuple[float, ...]:
        """The node spacings, x first."""
        return grid_spacing(self.resolution)

    def reference(self, instances: np.ndarray, progress=None, method: str | None = None) -> np.ndarray:
        """The immersed Q1 solutions on this grid (S, [C,] *grid) by ``method`` (default :attr:`reference_method`), zero
        outside the domain."""
        instances = np.asarray(instances, dtype=np.float64)
        channels = len(self.unknowns)
        out = np.empty((len(instances), *((channels,) if channels > 1 else ()), *self.resolution))
        for k, p in enumerate(instances):
            out[k] = self.fem_system(p).solve(method or self.reference_method)
            if progress is not None:
                progress(k + 1, len(instances))
        return self._inside(instances, out)

    def reference_name(self) -> str:
        return "the immersed Q1 FEM on this grid"

    def discrete_optimum(self, instances: np.ndarray, initial: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The immersed Q1 solution: the exact minimiser of the trained energy on this grid."""
        return self.reference(instances), np.ones(len(instances), dtype=bool)

    def floor_name(self) -> str:
        return self.reference_name()

    def truth(self, instances: np.ndarray, progress=None) -> np.ndarray:
        """The body-fitted P1 solution on a mesh ``truth_refine`` times finer than the grid, at the inside nodes."""
        h = 1.0 / (max(self.resolution) - 1) / self.truth_refine
        instances = np.asarray(instances, dtype=np.float64)
        out = np.empty((len(instances), *self.resolution))
        for k, p in enumerate(instances):
            out[k] = self.body_fitted(p, h)
            if progress is not None:
                progress(k + 1, len(instances))
        return out

    def truth_name(self) -> str:
        return f"body-fitted P1 FEM, mesh h/{self.truth_refine} (triangle + scikit-fem)"

    def polish(self, instances: np.ndarray, fields: np.ndarray, cycles: int) -> np.ndarray:
        """``cycles`` V-cycles of each instance's immersed system from ``fields``, zero outside the domain.

        First the values at the active nodes outside the domain (the solution's extension past the
        boundary, where the energy is nearly flat and a network's output is arbitrary) are replaced by
        the energy's minimiser there with the inside held. Without it, the V-cycle carries the
        extension's error inside: on torsion and plate shapes at 33², a field 0.4-0.7 % from the
        same-grid solution inside went to 0.4-3 % after one cycle; with it, to 0.02-0.1 %
        (tests/methods/test_immersed_families.py checks every family's first cycle)."""
        out = np.empty_like(np.asarray(fields, dtype=np.float64))
        instances = np.asarray(instances, dtype=np.float64)
        outside = self.domain(instances) > 0
        for k, p in enumerate(instances):
            multigrid = _multigrid(self, tuple(map(float, np.ravel(p))))
            start = multigrid.system.solve_block(fields[k], outside[k])  # the inactive nodes are fixed: held
            out[k] = multigrid.vcycles(start, cycles)
        return self._inside(instances, out)

    def assembled_correction(self, u: torch.Tensor, instances: torch.Tensor, cycles: int) -> torch.Tensor:
        """B g for the preconditioned loss and a second stage, at the inside nodes: u minus ``cycles``
        iterations of multigrid-preconditioned CG on each instance's assembled immersed system from u
        (S, *grid), float64. The torch V-cycle of the Nitsche Hessian (damped Jacobi on its stencil)
        diverges; the assembled multigrid (Gauss-Seidel, Galerkin coarse operators) converges, and CG's
        step length keeps its first cycles from overshooting (one iteration: 8 % off a smooth error on
        torsion shapes, 3-33 % on plates, inside). Each instance's hierarchy is built once."""
        fields = u.detach().cpu().numpy()
        rows = instances.detach().double().cpu().numpy()
        out = np.stack([f - _multigrid(self, tuple(map(float, np.ravel(p)))).solve(0.0, cycles, initial=f)
                        for f, p in zip(fields, rows)])
        # Only the inside nodes: on the active nodes outside, the extension of the solution past the
        # boundary, the energy is nearly flat (the finite-cell alpha) and the estimate is off by 1-3x.
        return torch.as_tensor(inside_only(out, self.domain(rows)), dtype=u.dtype, device=u.device)

    @property
    def classical_methods(self) -> dict[str, str]:
        return {**Q1_METHODS, BODY_FITTED: "body-fitted P1 FEM (triangle + scikit-fem, AMG-CG), mesh h = 1/(grid-1)"}

    def classical_configurations(self) -> dict[str, list[int]]:
        grids = q1_configurations(self)
        return {**grids, BODY_FITTED: grids["fmg"]}

    def classical_solver(self, method: str, grid: int) -> Callable[[np.ndarray], np.ndarray]:
        if method == BODY_FITTED:
            return lambda p: self.body_fitted(np.asarray(p, dtype=np.float64), 1.0 / (grid - 1))
        return super().classical_solver(method, grid)

    def classical_to_grid(self, method: str, native: np.ndarray, instances: np.ndarray) -> np.ndarray:
        """Body-fitted solves are read at this grid's nodes already; immersed ones (with their extension
        past the boundary) are interpolated here, then cut to the domain."""
        carried = native if method == BODY_FITTED else q1_to_grid(self, native)
        return self._inside(np.asarray(instances)[None], carried[None])[0]

    def at_resolution(self, resolution: tuple[int, ...]):
        return dataclasses.replace(self, resolution=tuple(resolution))


def _multigrid(family: ImmersedFamily, instances: tuple[float, ...]):
    """One instance's multigrid on its immersed system, kept (training revisits every instance) within
    :mod:`diffnet.backend.budget`."""
    key = (family, instances)
    if key in _MULTIGRIDS:
        _MULTIGRIDS.move_to_end(key)
        return _MULTIGRIDS[key][0]
    multigrid = family.fem_system(np.asarray(instances)).multigrid()
    _keep(_MULTIGRIDS, key, multigrid)
    return multigrid


def inside_fraction(data) -> np.ndarray:
    """Each element's inside area over its area (N_y - 1, N_x - 1): 1 inside, the cut part on cut elements."""
    cells = data.cells
    hx, hy = cells.spacing
    out = cells.full.astype(np.float64).ravel()
    np.add.at(out, cells.element, cells.weights / (hx * hy))
    return out.reshape(cells.full.shape)
