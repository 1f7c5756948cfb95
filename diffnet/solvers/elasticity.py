"""The assembled Q1 linear-elasticity system on the unit square or cube and its solve: CG preconditioned by AMG with
the rigid-body modes as the near-null space (pyamg's smoothed aggregation) or by geometric multigrid
(:mod:`diffnet.solvers.vector_gmg`), or a direct solve (a sparse LU, CHOLMOD's Cholesky).

The element is :mod:`diffnet.discretisation.elasticity`'s (vector Q1, 2^d-point Gauss, Young's modulus interpolated
to the Gauss points), so the solution is the exact minimiser of the energy DiffNet is trained on. The
unknowns are interleaved per node (node-major: dof = node * d + component, components x first), the
layout smoothed aggregation takes in blocks of d; a field (S, d, *grid) converts with
:func:`to_dofs` / :func:`from_dofs`.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from diffnet.instances.boundary import BoxBoundary
from diffnet.grid.material import lame
from diffnet.grid.element import element_nodes, element_slices, gauss_basis
from diffnet.instances.geometry import grid_points
from diffnet.solvers.fem import grid_spacing
from diffnet.solvers.vector_gmg import geometric_hierarchy

__all__ = ["element_stiffness", "element_dofs", "gauss_values", "elasticity_matrix", "body_load", "rigid_body_modes", "to_dofs", "from_dofs",
           "free_rigid_motion", "solve_elasticity", "ElasticitySystem", "elasticity_system", "ElasticityMultigrid", "multigrid"]


def element_stiffness(spacing: tuple[float, ...], nu: float, plane: str = "strain") -> tuple[np.ndarray, np.ndarray]:
    """Per Gauss point q the element stiffness for E = 1, shape (Q, 2^d d, 2^d d) with local dofs (a, i) at
    a * d + i, and the basis at the Gauss points (Q, 2^d) that interpolates E there.

    K_q[(a, i), (b, k)] = w [lambda_1 dN_a/dx_i dN_b/dx_k + mu_1 (delta_ik grad N_a . grad N_b + dN_a/dx_k dN_b/dx_i)],
    the bilinear form lambda div u div v + 2 mu ε(u) : ε(v) on u = N_b e_k, v = N_a e_i.
    """
    values, *grads, w = gauss_basis(*spacing)
    dims, nodes = len(spacing), values.shape[1]
    lam, mu = lame(nu, plane)
    g = np.stack(grads, axis=-1)  # (Q, a, j)
    dot = np.einsum("qaj,qbj->qab", g, g)
    k = (lam * np.einsum("qai,qbk->qaibk", g, g) + mu * np.einsum("qak,qbi->qaibk", g, g)
         + mu * np.einsum("qab,ik->qaibk", dot, np.eye(dims)))
    return w * k.reshape(len(values), nodes * dims, nodes * dims), values


def element_dofs(shape: tuple[int, ...]) -> np.ndarray:
    """(cells, 2^d d) global dofs of every element's local dofs (a, i), node-major."""
    dims = len(shape)
    index = np.arange(int(np.prod(shape))).reshape(shape)
    node = np.stack([index[at].ravel() for at in element_slices(shape)], axis=1)  # (cells, a)
    return (node[:, :, None] * dims + np.arange(dims)).reshape(len(node), -1)


def gauss_values(field: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(cells, Q): a nodal field interpolated to every element's Gauss points."""
    return np.stack([field[at].ravel() for at in element_slices(field.shape)], axis=1) @ values.T


def elasticity_matrix(young: np.ndarray, nu: float, plane: str = "strain") -> sp.csr_matrix:
    """The stiffness matrix K (d N, d N) of a nodal Young's modulus ``young`` (*grid) on the unit square or cube.

    Unknowns node-major (dof = node * d + component, x first); no boundary conditions: K is singular
    by the rigid-body modes (:func:`rigid_body_modes`). 1/2 uᵀ K u is
    :func:`diffnet.discretisation.elasticity.elasticity_energy` of the same field.

    The element blocks are added by slices into a node's row of couplings to its 3^d neighbours, whose CSR
    pattern is one per grid (:func:`_pattern`): at 33³ 0.2 s against 1.25 s for the sum of per-corner sparse
    matrices this replaced, and no (cells, 24, 24) index arrays (the whole COO at 63³ took 6 GB).
    """
    young = np.asarray(young, dtype=np.float64)
    if young.ndim not in (2, 3) or min(young.shape) < 2:
        raise ValueError(f"need a 2-D or 3-D grid with at least 2 nodes per side, got {young.shape}")
    shape, dims = young.shape, young.ndim
    k_q, values = element_stiffness(grid_spacing(shape), nu, plane)
    e_q = gauss_values(young, values)  # (cells, Q)
    corners = np.array(element_nodes(dims))  # (2^d, d) offsets of each element corner
    # Couplings held neighbour-, then component-major with the grid last, so that every slice added is contiguous
    # along the grid's rows (the node-major order, with the grid first, took 2.5x as long at 33³).
    couplings = np.zeros((3**dims, dims, dims, *shape))  # neighbour (offsets -1..1 row-major), component, component
    cells = tuple(n - 1 for n in shape)
    for a, at in enumerate(element_slices(shape)):
        # One corner's rows at a time: (d, 2^d, d, cells), a fraction of the element matrices' memory.
        local = (k_q[:, a * dims:(a + 1) * dims].reshape(len(k_q), -1).T @ e_q.T).reshape(dims, len(corners), dims, *cells)
        for b, offset in enumerate(corners):
            neighbour = int(np.ravel_multi_index(tuple(offset - corners[a] + 1), (3,) * dims))
            couplings[(neighbour, slice(None), slice(None)) + at] += local[:, b]
    rows = np.moveaxis(couplings.reshape(3**dims, dims, dims, -1), -1, 0).transpose(0, 2, 1, 3)  # node, i, neighbour, k
    indptr, indices, present = _pattern(shape)
    n = young.size * dims
    return sp.csr_matrix((rows.reshape(n, -1)[present], indices, indptr), shape=(n, n))


@functools.lru_cache(maxsize=4)
def _pattern(shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The CSR pattern of the Q1 vector stiffness on a node grid: indptr, column indices, and which of each row's
    3^d d slots (neighbour offsets -1..1 row-major, then component) lie inside the grid, (d N, 3^d d).

    Node-major numbering makes a neighbour's index grow with its offset in row-major order, so the slots in that
    order are each row's columns sorted, as CSR keeps them."""
    dims, nodes = len(shape), int(np.prod(shape))
    offsets = np.stack(np.meshgrid(*([np.arange(-1, 2)] * dims), indexing="ij"), axis=-1).reshape(-1, dims)
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), axis=-1).reshape(nodes, 1, dims)
    target = grid + offsets  # (N, 3^d, d)
    inside = np.all((target >= 0) & (target < np.array(shape)), axis=-1)
    neighbour = np.ravel_multi_index(tuple(np.moveaxis(np.clip(target, 0, np.array(shape) - 1), -1, 0)), shape)
    slots = (nodes, dims, len(offsets), dims)
    present = np.broadcast_to(inside[:, None, :, None], slots).reshape(nodes * dims, -1)
    kind = np.int32 if present.sum() < 2**31 and nodes * dims < 2**31 else np.int64
    columns = (neighbour[:, :, None] * dims + np.arange(dims)).astype(kind)  # (N, 3^d, d)
    indices = np.broadcast_to(columns[:, None], slots).reshape(nodes * dims, -1)[present]
    indptr = np.concatenate([[0], np.cumsum(present.sum(axis=1))]).astype(kind)
    return indptr, indices, present


def body_load(force, shape: tuple[int, ...]) -> np.ndarray:
    """The load ∫ f · N_a e_i per dof (node-major) of a body force ``force``: a callable of the Gauss points'
    coordinates (x first, each of shape (cells, Q)) returning d components, or nodal values (d, *grid)
    interpolated multilinearly."""
    dims = len(shape)
    spacing = grid_spacing(shape)
    values, *_, w = gauss_basis(*spacing)
    if callable(force):
        points = grid_points(shape)  # (*shape, d), x first
        f_q = force(*[gauss_values(points[..., i], values) for i in range(dims)])
    else:
        f_q = [gauss_values(np.asarray(force[i], dtype=np.float64), values) for i in range(dims)]
    load = np.zeros(int(np.prod(shape)) * dims)
    dofs = element_dofs(shape).reshape(-1, values.shape[1], dims)
    for i in range(dims):
        np.add.at(load, dofs[:, :, i], w * np.asarray(f_q[i]) @ values)
    return load


def rigid_body_modes(shape: tuple[int, ...]) -> np.ndarray:
    """The rigid-body motions on the grid, node-major, (d N, 3) in 2-D (two translations, one rotation) and
    (d N, 6) in 3-D: the near-null space of K, for smoothed aggregation."""
    dims = len(shape)
    points = grid_points(shape).reshape(-1, dims)
    coords, nodes = points.T, len(points)
    modes = []
    for i in range(dims):  # translations
        m = np.zeros((nodes, dims))
        m[:, i] = 1.0
        modes.append(m)
    for i, j in ([(0, 1)] if dims == 2 else [(0, 1), (1, 2), (0, 2)]):  # rotations in the (i, j) planes
        m = np.zeros((nodes, dims))
        m[:, i], m[:, j] = -(coords[j] - 0.5), coords[i] - 0.5
        modes.append(m)
    return np.stack([m.ravel() for m in modes], axis=1)


_MOTIONS = ("move along x", "move along y", "move along z")


def free_rigid_motion(fixed: np.ndarray) -> str:
    """What rigid-body motion the held nodes ``fixed`` (d, *grid) per component leave free ('' when none): the
    rigid-body modes restricted to the held dofs must have full rank (3 in 2-D, 6 in 3-D)."""
    shape = fixed.shape[1:]
    if not fixed.any():
        return "move and rotate"
    modes = rigid_body_modes(shape)
    held = modes[to_dofs(fixed)]
    if len(held) and np.linalg.matrix_rank(held, tol=1e-9 * max(1.0, np.abs(held).max())) == modes.shape[1]:
        return ""
    # The free motion: the modes' null space on the held dofs, named when it is one translation.
    null = np.linalg.svd(held)[2][-1]
    k = int(np.argmax(np.abs(null)))
    return _MOTIONS[k] if k < len(shape) and np.abs(null[k]) > 0.99 else "rotate"

def to_dofs(u: np.ndarray) -> np.ndarray:
    """A field (d, *grid), components x first, as node-major dofs (d N,)."""
    return np.moveaxis(np.asarray(u), 0, -1).ravel()


def from_dofs(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Node-major dofs (d N,) as a field (d, *grid)."""
    return np.moveaxis(np.asarray(x).reshape(*shape, len(shape)), -1, 0)


def solve_elasticity(K: sp.csr_matrix, load: np.ndarray, fixed: np.ndarray, values: np.ndarray, shape: tuple[int, ...],
                     method: str = "amg", tol: float = 1e-10, stats: dict | None = None) -> np.ndarray:
    """The displacement (d, *grid) minimising 1/2 uᵀ K u - loadᵀ u with u = ``values`` on the ``fixed`` dofs.

    The fixed dofs are eliminated (K_ff u_f = load_f - K_fc g: symmetric positive definite once the
    rigid-body modes are held); ``method`` "amg" is CG preconditioned by pyamg's smoothed aggregation
    with the rigid-body modes restricted to the free dofs as its near-null space, "gmg" CG preconditioned by the
    geometric multigrid (:mod:`diffnet.solvers.vector_gmg`), "direct" a sparse LU,
    "cholesky" a sparse Cholesky (CHOLMOD, :mod:`diffnet.solvers.cholesky`).

    Parameters
    ----------
    fixed, values : numpy.ndarray
        Node-major (d N,) mask of the held dofs and their values (only the held entries are read).
    stats : dict, optional
        Filled with the solve's iterations, relative residual and set-up seconds.
    """
    stats = {} if stats is None else stats
    k_ff, rhs, g, free = _reduced(K, load, fixed, values)
    u = g.copy()
    if method == "direct":
        u[free] = spla.spsolve(k_ff.tocsc(), rhs)
    elif method == "cholesky":
        from diffnet.solvers.cholesky import cholesky_solve

        u[free] = cholesky_solve(k_ff, rhs)
    elif method in ("amg", "gmg"):
        t0 = time.perf_counter()
        ml = _hierarchy(k_ff, shape, free) if method == "amg" else geometric_hierarchy(k_ff, shape, free)
        stats["amg_setup_s"] = time.perf_counter() - t0
        residuals: list[float] = []
        u[free] = ml.solve(rhs, tol=tol, accel="cg", maxiter=1000, residuals=residuals)
        stats["iterations"] = len(residuals) - 1
        stats["relative_residual"] = float(np.linalg.norm(rhs - k_ff @ u[free]) / max(np.linalg.norm(rhs), 1e-300))
        if stats["relative_residual"] > 10 * tol:
            raise RuntimeError(f"{method.upper()}-CG did not converge: relative residual {stats['relative_residual']:.3e} "
                               f"after {stats['iterations']} iterations")
    else:
        raise ValueError(f"method must be 'amg', 'gmg', 'cholesky' or 'direct', got {method!r}")
    return from_dofs(u, shape)


def _reduced(K: sp.csr_matrix, load: np.ndarray, fixed: np.ndarray, values: np.ndarray):
    """K on the free dofs, the load less the held dofs' work, the held values (zero elsewhere), the free mask."""
    fixed = np.asarray(fixed, dtype=bool)
    if not fixed.any():
        raise ValueError("a body held nowhere moves freely: hold at least one side (the rigid-body modes)")
    free = ~fixed
    g = np.where(fixed, values, 0.0)
    return K[free][:, free].tocsr(), load[free] - K[free][:, fixed] @ g[fixed], g, free


def _hierarchy(k_ff: sp.csr_matrix, shape: tuple[int, ...], free: np.ndarray):
    """pyamg's smoothed aggregation of K on the free dofs, the rigid-body modes there as its near-null space."""
    import pyamg

    return pyamg.smoothed_aggregation_solver(k_ff, B=rigid_body_modes(shape)[free], symmetry="hermitian")


@dataclass(frozen=True)
class ElasticityMultigrid:
    """One body's smoothed-aggregation hierarchy, for V-cycles from a given displacement (the polish)."""

    system: "ElasticitySystem"
    hierarchy: object
    rhs: np.ndarray
    free: np.ndarray

    def vcycles(self, x: np.ndarray, cycles: int) -> np.ndarray:
        """``cycles`` V-cycles from node-major dofs ``x`` (the held dofs set to their values), as (d, *grid)."""
        u = np.where(self.system.fixed, self.system.values, x)
        if cycles:
            u[self.free] = self.hierarchy.solve(self.rhs, x0=u[self.free], tol=1e-300, maxiter=cycles, accel=None)
        return from_dofs(u, self.system.shape)


def multigrid(system: "ElasticitySystem") -> ElasticityMultigrid:
    """The smoothed-aggregation hierarchy of ``system`` on its free dofs."""
    k_ff, rhs, _, free = _reduced(system.K, system.load, system.fixed, system.values)
    return ElasticityMultigrid(system, _hierarchy(k_ff, system.shape, free), rhs, free)


@dataclass(frozen=True)
class ElasticitySystem:
    """K, the load (body force and tractions), the held dofs and their values of one body, node-major."""

    K: sp.csr_matrix
    load: np.ndarray
    fixed: np.ndarray
    values: np.ndarray
    shape: tuple[int, ...]

    def solve(self, method: str = "amg", tol: float = 1e-10, stats: dict | None = None) -> np.ndarray:
        """The displacement (d, *grid) (:func:`solve_elasticity`)."""
        return solve_elasticity(self.K, self.load, self.fixed, self.values, self.shape, method, tol, stats)

    def multigrid(self) -> ElasticityMultigrid:
        """The smoothed-aggregation hierarchy on the free dofs (:func:`multigrid`)."""
        return multigrid(self)

    def energy(self, u: np.ndarray) -> float:
        """The total potential energy 1/2 uᵀ K u - loadᵀ u of a displacement (d, *grid)."""
        x = to_dofs(u)
        return float(0.5 * x @ (self.K @ x) - self.load @ x)


def elasticity_system(young: np.ndarray, nu: float, boundaries: Sequence[BoxBoundary], plane: str = "strain",
                      force=None, held: tuple[np.ndarray, np.ndarray] | None = None) -> ElasticitySystem:
    """The Q1 system of a body on the unit square or cube with nodal Young's modulus ``young`` (*grid).

    Parameters
    ----------
    boundaries : sequence of BoxBoundary
        One per component, x first (:func:`diffnet.instances.boundary.component_boundaries`): a component's
        Dirichlet sides hold it, its flux sides load it with that traction component.
    force : callable or numpy.ndarray, optional
        The body force, as :func:`body_load` takes it.
    held : tuple of numpy.ndarray, optional
        The held nodes and their values per component (d, *grid) each, when more than the boundaries' (a pin).
    """
    young = np.asarray(young, dtype=np.float64)
    shape = young.shape
    if len(boundaries) != young.ndim:
        raise ValueError(f"need one boundary per component ({young.ndim}), got {len(boundaries)}")
    fixed, values = zip(*(b.fixed(shape) for b in boundaries)) if held is None else held
    load = to_dofs(np.stack([b.flux_load(shape) for b in boundaries]))
    if force is not None:
        load = load + body_load(force, shape)
    return ElasticitySystem(elasticity_matrix(young, nu, plane), load, to_dofs(np.stack(fixed)),
                            to_dofs(np.stack(values)), shape)
