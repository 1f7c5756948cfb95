"""The independent reference of the immersed families: a body-fitted finite-element solve on a conforming
triangulation of the true domain (2-D), read at the grid's inside nodes.

The domain is given by its boundary loops, sampled on the true boundary (the outer loop counter-
clockwise, each hole's loop with a point inside it); ``triangle`` (Shewchuk's mesher) triangulates it
with no angle below 30 degrees and no triangle larger than ``h^2 / 2``; scikit-fem assembles
-∇·(ν∇u) + κ²u = f on linear (P1) elements, with a Dirichlet value or a flux on each tagged part of
the boundary, and it is solved by CG preconditioned with pyamg's Ruge-Stuben AMG to a relative
residual of 1e-12. Nothing here shares code with the grid's Q1 stack: the elements, the mesh, the
quadrature and the boundary treatment are all another method's, so the immersed solution's distance
to it is a fair measure of its discretisation error. P1 on a mesh of size h/r errs by O((h/r)²), r²
times less than the grid's Q1 floor (r = 4 by default: about 6 % of it, so a reported floor is
within about 6 % of the true one). Why P1 on a finer mesh and
not P2: on 140k P2 unknowns AMG-CG did not reach 1e-8 in 300 iterations and a sparse LU took 6 s,
where 130k P1 unknowns solve to 1e-12 in 30 iterations (1.7 s on one core of the 2-core machine).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from diffnet.grid.material import lame

__all__ = ["Loop", "BodyFitted", "body_fitted_solve", "BodyFittedSolid", "body_fitted_elasticity"]


@dataclass(frozen=True)
class Loop:
    """A closed boundary loop: ``points`` (n, 2) on the true boundary in order, the tag of each segment
    (from point i to i + 1), and for a hole a point inside it."""

    points: np.ndarray
    tags: np.ndarray
    hole: tuple[float, float] | None = None


@dataclass
class BodyFitted:
    """A solved body-fitted problem: its mesh's basis and nodal (P1) solution; ``at(points)`` evaluates it."""

    basis: object
    u: np.ndarray
    seconds: float

    @property
    def unknowns(self) -> int:
        return int(self.u.size)

    def at(self, points: np.ndarray) -> np.ndarray:
        """The solution at ``points`` (n, 2), x first: linear on the triangle that holds each point. A point
        outside the mesh (between a boundary chord and the true boundary: a sliver of width O(h_b^2))
        takes the nearest triangle's linear function.

        Why not scikit-fem's ``probes``: its finder tries the 5 nearest triangles and otherwise tests
        every triangle against every point, which ran out of 24 GiB at 129^2 points; matplotlib's
        trapezoid-map finder took 3 s to build for 500k triangles. Here: the 8 triangles with the
        nearest centroids (a k-d tree), barycentric coordinates, the first that holds the point."""
        return _interpolate(self.basis.mesh, self.u, points)


def _interpolate(mesh, vertex_values: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Vertex values (V,) or (C, V) on a triangle mesh, linear on each triangle, at ``points`` (n, 2): (n,) or (C, n)
    (the search of :meth:`BodyFitted.at`)."""
    from scipy.spatial import cKDTree

    x = np.asarray(points, dtype=np.float64)
    p, t = mesh.p.T, mesh.t.T
    near = cKDTree(p[t].mean(axis=1)).query(x, k=min(8, len(t)))[1].reshape(len(x), -1)
    a, b, c = p[t[near, 0]], p[t[near, 1]], p[t[near, 2]]  # (n, k, 2)
    e1, e2, d = b - a, c - a, x[:, None, :] - a
    det = e1[..., 0] * e2[..., 1] - e1[..., 1] * e2[..., 0]
    l1 = (d[..., 0] * e2[..., 1] - d[..., 1] * e2[..., 0]) / det
    l2 = (e1[..., 0] * d[..., 1] - e1[..., 1] * d[..., 0]) / det
    lam = np.stack([1.0 - l1 - l2, l1, l2], axis=-1)  # (n, k, 3)
    first = np.argmax((lam >= -1e-12).all(axis=-1), axis=1)  # the nearest if none holds the point
    rows = np.arange(len(x))
    lam, tri = lam[rows, first], t[near[rows, first]]
    return (lam * np.asarray(vertex_values)[..., tri]).sum(axis=-1)


def _amg_cg(A, b: np.ndarray) -> np.ndarray:
    """CG preconditioned by pyamg's Ruge-Stuben AMG to a relative residual of 1e-12 (the matrix is
    symmetric positive definite; smoothed aggregation took 1.6x as long here)."""
    import pyamg

    ml = pyamg.ruge_stuben_solver(A.tocsr())
    residuals: list[float] = []
    u = ml.solve(b, tol=1e-12, accel="cg", maxiter=500, residuals=residuals)
    if residuals[-1] > 1e-10 * max(residuals[0], np.finfo(float).tiny):
        raise RuntimeError(f"the body-fitted solve did not converge (relative residual {residuals[-1] / residuals[0]:.1e})")
    return u


def _triangulate(loops: Sequence[Loop], h: float):
    """The conforming triangulation of the domain bounded by ``loops`` (no angle below 30 degrees, no triangle
    above h²/2) as a scikit-fem MeshTri, with each boundary facet's index and tag per input segment piece:
    (mesh, facet_of, segment_tags), ``facet_of[k]`` the facet of the mesh's k-th boundary segment."""
    import triangle
    from skfem import MeshTri

    vertices, segments, markers, holes, offset = [], [], [], [], 0
    for loop in loops:
        n = len(loop.points)
        vertices.append(np.asarray(loop.points, dtype=np.float64))
        segments.append(offset + np.stack([np.arange(n), (np.arange(n) + 1) % n], axis=1))
        markers.append(np.asarray(loop.tags, dtype=np.int32))
        if loop.hole is not None:
            holes.append(loop.hole)
        offset += n
    geometry = {"vertices": np.concatenate(vertices), "segments": np.concatenate(segments),
                "segment_markers": np.concatenate(markers)[:, None] + 1}  # triangle reserves marker 0
    if holes:
        geometry["holes"] = np.asarray(holes, dtype=np.float64)
    # Triangle's switches: p (a planar straight-line graph), q30 (no angle below 30 degrees), a (an area
    # bound, written in fixed notation: it reads no exponents), Q (quiet).
    mesh = triangle.triangulate(geometry, f"pq30a{0.5 * h * h:.15f}Q")
    m = MeshTri(np.ascontiguousarray(mesh["vertices"].T), np.ascontiguousarray(mesh["triangles"].T))
    # The mesh's boundary facets by the tag of the input segment they lie on.
    n_vertices = m.p.shape[1]
    keys = np.sort(m.facets, axis=0)
    keys = keys[0].astype(np.int64) * n_vertices + keys[1]
    order = np.argsort(keys)
    segment = np.sort(mesh["segments"], axis=1).astype(np.int64)
    facet_of = order[np.searchsorted(keys, segment[:, 0] * n_vertices + segment[:, 1], sorter=order)]
    return m, facet_of, mesh["segment_markers"].ravel() - 1


def body_fitted_solve(loops: Sequence[Loop], conditions: Mapping[int, tuple[str, float]], h: float,
                      nu: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None, kappa: float = 0.0,
                      f: float = 0.0) -> BodyFitted:
    """Solve -∇·(ν∇u) + κ²u = f on the domain bounded by ``loops`` with P1 elements on a mesh of size ``h``.

    Parameters
    ----------
    loops : sequence of Loop
        The outer boundary first, then the holes.
    conditions : mapping
        Per segment tag: ``("u", value)`` (Dirichlet) or ``("flux", value)`` (outward flux ν ∂u/∂n).
    h : float
        The mesh size: no triangle's area above h²/2.
    nu : callable, optional
        ν(x, y) at any points (arrays of one shape); default 1.
    kappa, f : float
        The reaction coefficient and the constant source.
    """
    from skfem import Basis, BilinearForm, ElementTriP1, FacetBasis, LinearForm, asm, condense, solve
    from skfem.helpers import dot, grad

    start = time.perf_counter()
    m, facet_of, segment_tags = _triangulate(loops, h)
    basis = Basis(m, ElementTriP1())
    # nu at the mesh's vertices, linear on each triangle (an O(h^2) change, the order of P1 itself): one
    # evaluation per vertex instead of one per quadrature point (3x as many), which cost 3 s at 500k triangles.
    coefficient = basis.interpolate(np.ones(basis.N) if nu is None else nu(m.p[0], m.p[1]))

    @BilinearForm
    def form(u, v, w):
        return w["nu"] * dot(grad(u), grad(v)) + kappa**2 * u * v

    @LinearForm
    def load(v, w):
        return f * v

    A, b = asm(form, basis, nu=coefficient), asm(load, basis)
    x = np.zeros(basis.N)
    fixed: list[np.ndarray] = []
    for tag in np.unique(segment_tags):
        kind, value = conditions[int(tag)]
        facets = facet_of[segment_tags == tag]
        if kind == "u":
            dofs = basis.get_dofs(facets=facets).flatten()
            x[dofs] = value
            fixed.append(dofs)
        elif value != 0.0:
            b += asm(LinearForm(lambda v, w, q=value: q * v), FacetBasis(m, ElementTriP1(), facets=facets))
    D = np.unique(np.concatenate(fixed)) if fixed else np.zeros(0, dtype=np.int64)
    u = solve(*condense(A, b, x=x, D=D), solver=_amg_cg) if len(D) else _amg_cg(A, b)
    return BodyFitted(basis, u, time.perf_counter() - start)


@dataclass
class BodyFittedSolid:
    """A solved body-fitted plane solid: the displacement (2, V) and the stress (σ_xx, σ_yy, σ_xy) (3, V) at the
    vertices of ``mesh``, the P2 mesh refined once (its vertices are the P2 nodes: vertices and edge midpoints),
    linear on its triangles; ``at(points)`` and ``stress_at(points)`` evaluate them."""

    mesh: object
    u: np.ndarray
    stress: np.ndarray
    unknowns: int
    seconds: float

    def at(self, points: np.ndarray) -> np.ndarray:
        """The displacement at ``points`` (n, 2), shape (2, n)."""
        return _interpolate(self.mesh, self.u, points)

    def stress_at(self, points: np.ndarray) -> np.ndarray:
        """The stress at ``points`` (n, 2), shape (3, n)."""
        return _interpolate(self.mesh, self.stress, points)


def body_fitted_elasticity(loops: Sequence[Loop], conditions: Mapping[int, Sequence[tuple[str, float]]], h: float,
                           young: float, nu: float, plane: str = "stress",
                           pin: tuple[float, float] | None = None) -> BodyFittedSolid:
    """Plane linear elasticity on the domain bounded by ``loops`` with vector P2 elements on a mesh of size ``h``.

    Parameters
    ----------
    loops : sequence of Loop
        The outer boundary first, then the holes.
    conditions : mapping
        Per segment tag, one condition per component (x first): ``("u", value)`` holds that component,
        ``("flux", value)`` loads it with that traction component (0: free). A tag not given is free.
    h : float
        The mesh size: no triangle's area above h²/2.
    young, nu : float
        The (constant) Young's modulus and Poisson ratio.
    plane : str
        "stress" or "strain".
    pin : tuple of float, optional
        A point whose nearest vertex is held at zero displacement (what the sides leave of the rigid-body
        motions).

    Why P2 and a direct solve: the stress is what this reference is for (a stress concentration at a hole), and
    P1's constant stresses converge at O(h): the peak at a centred hole of radius 0.05 was 13 %, 7 % and 3 % low
    at h = 1/64, 1/128, 1/256, where P2 with its stress projected onto P2 was 1.4 % low at 1/64 and 0.04 % at
    1/128. The stress is that L2 projection (one mass-matrix solve per component). scikit-fem assembles, SuperLU
    solves (a 200k-unknown system in about 15 s): nothing is shared with the grid's Q1 stack.
    """
    from skfem import Basis, BilinearForm, ElementTriP2, ElementVector, FacetBasis, LinearForm, asm, condense, solve
    from skfem.helpers import sym_grad, trace
    from skfem.models.elasticity import linear_elasticity

    start = time.perf_counter()
    m, facet_of, segment_tags = _triangulate(loops, h)
    element = ElementVector(ElementTriP2())
    basis = Basis(m, element)
    lam, mu = lame(nu, plane)
    A = asm(linear_elasticity(young * lam, young * mu), basis)
    b, x = np.zeros(basis.N), np.zeros(basis.N)
    fixed: list[np.ndarray] = []
    for tag in np.unique(segment_tags):
        if int(tag) not in conditions:
            continue
        facets = facet_of[segment_tags == tag]
        dofs = basis.get_dofs(facets=facets)
        traction = np.zeros(2)
        for i, (kind, value) in enumerate(conditions[int(tag)]):
            if kind == "u":
                held = dofs.all(f"u^{i + 1}")
                x[held] = value
                fixed.append(held)
            else:
                traction[i] = value
        if traction.any():
            b += asm(LinearForm(lambda v, w, t=traction: t[0] * v[0] + t[1] * v[1]),
                     FacetBasis(m, element, facets=facets))
    if pin is not None:
        vertex = int(np.argmin(((m.p.T - np.asarray(pin)) ** 2).sum(1)))
        fixed.append(basis.nodal_dofs[:, vertex])
    D = np.unique(np.concatenate(fixed)) if fixed else np.zeros(0, dtype=np.int64)
    u = solve(*condense(A, b, x=x, D=D))
    # The stress projected onto scalar P2, one component at a time.
    scalar = Basis(m, ElementTriP2())
    at_points = basis.interpolate(u)
    mass = asm(BilinearForm(lambda s, v, w: s * v), scalar).tocsr()

    def component(i: int, j: int):
        def form(v, w):
            e = sym_grad(w["u"])
            return young * (lam * trace(e) * (i == j) + 2 * mu * e[i, j]) * v
        return asm(LinearForm(form), scalar, u=at_points)

    stress = np.stack([_mass_solve(mass, component(i, j)) for i, j in ((0, 0), (1, 1), (0, 1))])
    # P2 nodes in the order of the refined mesh's vertices: the vertices, then the edges' midpoints.
    fine = m.refined()
    order = np.concatenate([scalar.nodal_dofs[0], scalar.facet_dofs[0]])
    displacement = np.concatenate([u[basis.nodal_dofs], u[basis.facet_dofs]], axis=1)
    return BodyFittedSolid(fine, displacement, stress[:, order], int(basis.N), time.perf_counter() - start)


def _mass_solve(mass, rhs: np.ndarray) -> np.ndarray:
    """M x = rhs for a P2 mass matrix by Jacobi-preconditioned CG to 1e-12 (its condition number is bounded
    independently of h: about 20 iterations; SuperLU's factorisation of the same matrix took minutes)."""
    import scipy.sparse.linalg as spla

    inverse = 1.0 / mass.diagonal()
    x, info = spla.cg(mass, rhs, rtol=1e-12, maxiter=500, M=spla.LinearOperator(mass.shape, lambda v: inverse * v))
    if info:
        raise RuntimeError(f"the stress projection did not converge ({info} iterations)")
    return x
