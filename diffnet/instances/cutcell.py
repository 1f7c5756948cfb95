"""Cut-cell quadrature on the node grid: the part of every bilinear element inside a domain, and the
domain's boundary inside the box, as lists of weighted points (2-D).

Which quadrature and why. The boundary is reconstructed as a polygon: each element is split into two
triangles along its (0,0)-(1,1) diagonal, the boundary's crossings of the triangles' edges are found
on the shape itself (:meth:`diffnet.instances.geometry.Shape.crossing`, so every vertex of the polygon lies on
the true boundary), and joined by straight segments. The inside part of a cut triangle is then a
triangle or a quadrilateral (two triangles), integrated with the 6-point degree-4 rule of Dunavant,
and each boundary segment with 4-point Gauss-Legendre (degree 7). That is exact for every integrand of
the Q1 energies on the reconstructed domain (a bilinear coefficient times products of two bilinear
fields or gradients: total degree 4 in the cell; on a segment, degree 6), so the discrete minimiser
is exactly the Q1 solution on the reconstructed domain; the reconstruction's geometric error is
O(h^2), the order of Q1 itself. A finite-cell quadrature (sub-cells to a fixed depth, inside or out by
their centres) would be simpler but is exact for no shape and converges at O(h / 2^depth) only.
Elements wholly inside use the 2x2 Gauss rule of :mod:`diffnet.discretisation.energy` (as convolutions); only the cut
ones are listed here, so the lists stay O(N) long for an N x N grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from diffnet.instances.geometry import Shape

__all__ = ["CutCells", "cut_cells", "bilinear_basis"]

# Dunavant's degree-4 rule on a triangle: barycentric points and weights (summing to 1).
_TRI_A, _TRI_B = (0.445948490915965, 0.108103018168070), (0.091576213509771, 0.816847572980459)
_TRI_POINTS = np.array([[_TRI_A[1], _TRI_A[0], _TRI_A[0]], [_TRI_A[0], _TRI_A[1], _TRI_A[0]],
                        [_TRI_A[0], _TRI_A[0], _TRI_A[1]], [_TRI_B[1], _TRI_B[0], _TRI_B[0]],
                        [_TRI_B[0], _TRI_B[1], _TRI_B[0]], [_TRI_B[0], _TRI_B[0], _TRI_B[1]]])
_TRI_WEIGHTS = np.array([0.223381589678011] * 3 + [0.109951743655322] * 3)
_LINE_POINTS, _LINE_WEIGHTS = np.polynomial.legendre.leggauss(4)
_LINE_POINTS, _LINE_WEIGHTS = 0.5 * (_LINE_POINTS + 1.0), 0.5 * _LINE_WEIGHTS

# An element's corners as (dy, dx) (diffnet.grid.element.element_nodes(2)) and its two triangles, as corner indices.
_CORNERS = ((0, 0), (0, 1), (1, 0), (1, 1))
_TRIANGLES = ((0, 1, 3), (0, 3, 2))


def bilinear_basis(xi: np.ndarray, eta: np.ndarray, hx: float, hy: float) -> tuple[np.ndarray, np.ndarray]:
    """The element's four bilinear functions at local coordinates (xi, eta) in [0, 1]^2 (x and y): values
    (P, 4) and gradients (P, 4, 2), x first, corners in :func:`diffnet.grid.element.element_nodes` order."""
    fx = np.stack([1.0 - xi, xi], axis=-1)  # the 1-D factors by corner offset
    fy = np.stack([1.0 - eta, eta], axis=-1)
    sx = np.array([-1.0, 1.0]) / hx
    sy = np.array([-1.0, 1.0]) / hy
    values = np.stack([fx[:, dx] * fy[:, dy] for dy, dx in _CORNERS], axis=-1)
    grads = np.stack([np.stack([sx[dx] * fy[:, dy], sy[dy] * fx[:, dx]], axis=-1) for dy, dx in _CORNERS], axis=1)
    return values, grads


@dataclass(frozen=True, eq=False)
class CutCells:
    """A domain on one node grid of a box [0, L_x] x [0, L_y] (the unit square unless ``extent`` says otherwise):
    which elements it covers, and the quadrature of the cut ones and of its boundary.

    Attributes
    ----------
    resolution : tuple of int
        (N_y, N_x).
    sdf : numpy.ndarray
        (N_y, N_x) signed distance at the nodes (negative inside).
    full, cut : numpy.ndarray
        (N_y - 1, N_x - 1) bool: elements wholly inside; elements the boundary crosses.
    element, values, grads, weights, points : numpy.ndarray
        The inside parts of the cut elements: per point its element (flat index i (N_x - 1) + j), the
        element's bilinear functions (P, 4) and their gradients (P, 4, 2) there, its weight (area) and
        its coordinates (P, 2), x first.
    b_element, b_values, b_grads, b_weights, b_points, b_normals : numpy.ndarray
        The same on the reconstructed boundary inside the box (weights are lengths), with the outward
        unit normals (B, 2).
    extent : tuple of float
        (L_x, L_y), the box's sides.
    """

    resolution: tuple[int, int]
    sdf: np.ndarray
    full: np.ndarray
    cut: np.ndarray
    element: np.ndarray
    values: np.ndarray
    grads: np.ndarray
    weights: np.ndarray
    points: np.ndarray
    b_element: np.ndarray
    b_values: np.ndarray
    b_grads: np.ndarray
    b_weights: np.ndarray
    b_points: np.ndarray
    b_normals: np.ndarray
    extent: tuple[float, float] = (1.0, 1.0)

    @property
    def spacing(self) -> tuple[float, float]:
        """(h_x, h_y)."""
        ny, nx = self.resolution
        return self.extent[0] / (nx - 1), self.extent[1] / (ny - 1)

    @property
    def inside(self) -> np.ndarray:
        """(N_y, N_x) bool: the nodes in the domain (signed distance <= 0)."""
        return self.sdf <= 0.0

    @property
    def active(self) -> np.ndarray:
        """(N_y, N_x) bool: the nodes of the elements the domain meets (the discrete space's support)."""
        ny, nx = self.resolution
        touched = self.full | self.cut
        out = np.zeros((ny, nx), dtype=bool)
        for dy, dx in _CORNERS:
            out[dy : ny - 1 + dy, dx : nx - 1 + dx] |= touched
        return out

    def area(self) -> float:
        """The reconstructed domain's area."""
        hx, hy = self.spacing
        return float(self.full.sum() * hx * hy + self.weights.sum())

    def integrate(self, f) -> float:
        """The integral over the reconstructed domain of ``f(points (n, 2)) -> (n,)``: the full elements by
        2x2 Gauss, the cut ones by their points (the energies' rule, for tests and checks)."""
        hx, hy = self.spacing
        i, j = np.nonzero(self.full)
        g = (0.5 - 0.5 / np.sqrt(3.0), 0.5 + 0.5 / np.sqrt(3.0))
        total = 0.0
        for a in g:
            for b in g:
                total += 0.25 * hx * hy * f(np.stack([(j + b) * hx, (i + a) * hy], axis=-1)).sum()
        return float(total + (self.weights * f(self.points)).sum())


def _crossings(shape: Shape, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Points where the boundary crosses the segments from inside points ``a`` to outside points ``b`` (n, 2)."""
    if len(a) == 0:
        return np.empty((0, 2))
    t = shape.crossing(a, b)
    return a + t[:, None] * (b - a)


def cut_cells(shape: Shape, resolution: Sequence[int], extent: Sequence[float] = (1.0, 1.0)) -> CutCells:
    """The cut-cell quadrature of ``shape`` on the node grid ``resolution`` (N_y, N_x) of the box [0, L_x] x [0, L_y],
    ``extent`` = (L_x, L_y) (default the unit square)."""
    ny, nx = (int(n) for n in resolution)
    if shape.dims != 2:
        raise ValueError(f"the cut-cell quadrature is 2-D; the shape is {shape.dims}-D")
    extent = (float(extent[0]), float(extent[1]))
    hx, hy = extent[0] / (nx - 1), extent[1] / (ny - 1)
    sdf = shape.on_grid((ny, nx), extent)
    inside = sdf <= 0.0
    if not inside.any():
        raise ValueError(f"the domain holds none of the {ny}x{nx} grid's nodes: it is empty or misses the grid")
    corners = np.stack([inside[dy : ny - 1 + dy, dx : nx - 1 + dx] for dy, dx in _CORNERS], axis=-1)
    full, cut = corners.all(axis=-1), corners.any(axis=-1) & ~corners.all(axis=-1)
    ci, cj = np.nonzero(cut)
    # Every triangle of every cut element: vertex coordinates (T, 3, 2), inside flags (T, 3), element.
    xy = np.stack([np.stack([(cj + dx) * hx, (ci + dy) * hy], axis=-1) for dy, dx in _CORNERS], axis=1)
    flags = corners[ci, cj]
    tri = np.array(_TRIANGLES)
    verts = np.concatenate([xy[:, t] for t in tri])
    vin = np.concatenate([flags[:, t] for t in tri])
    elem = np.concatenate([ci * (nx - 1) + cj] * len(tri))
    count = vin.sum(axis=1)
    pieces, p_elem = [verts[count == 3]], [elem[count == 3]]  # sub-triangles (n, 3, 2) inside
    segments, s_elem, s_across = [], [], []  # boundary segments (n, 2, 2); a vector from inside to outside
    cases = []
    for k in (1, 2):
        sel = count == k
        v, f, e = verts[sel], vin[sel], elem[sel]
        # Order the vertices: the odd one (inside if k = 1, outside if k = 2) first.
        odd = np.argmax(f if k == 1 else ~f, axis=1)
        order = np.stack([odd, (odd + 1) % 3, (odd + 2) % 3], axis=1)
        cases.append((k, np.take_along_axis(v, order[:, :, None], axis=1), e))
    # Every crossing of both cases in one call (from the inside vertex to the outside one): a shape's distance costs
    # the same few array operations for 10 points as for 1000.
    (_, v1, _), (_, v2, _) = cases
    starts = np.concatenate([v1[:, 0], v1[:, 0], v2[:, 1], v2[:, 2]])
    ends = np.concatenate([v1[:, 1], v1[:, 2], v2[:, 0], v2[:, 0]])
    crossings = np.split(_crossings(shape, starts, ends), np.cumsum([len(v1), len(v1), len(v2)]))
    for k, v, e in cases:
        a, b, c = v[:, 0], v[:, 1], v[:, 2]
        if k == 1:  # a inside: the triangle (a, p_ab, p_ac)
            pab, pac = crossings[0], crossings[1]
            pieces.append(np.stack([a, pab, pac], axis=1))
            p_elem.append(e)
            segments.append(np.stack([pab, pac], axis=1))
            s_across.append(0.5 * (b + c) - a)
        else:  # a outside: the quadrilateral (b, c, p_ca, p_ba) as two triangles
            pba, pca = crossings[2], crossings[3]
            pieces += [np.stack([b, c, pca], axis=1), np.stack([b, pca, pba], axis=1)]
            p_elem += [e, e]
            segments.append(np.stack([pba, pca], axis=1))
            s_across.append(a - 0.5 * (b + c))
        s_elem.append(e)
    tris, t_elem = np.concatenate(pieces), np.concatenate(p_elem)
    e1, e2 = tris[:, 1] - tris[:, 0], tris[:, 2] - tris[:, 0]
    area = 0.5 * np.abs(e1[:, 0] * e2[:, 1] - e1[:, 1] * e2[:, 0])
    points = np.einsum("qk,tkd->tqd", _TRI_POINTS, tris).reshape(-1, 2)
    weights = (area[:, None] * _TRI_WEIGHTS).ravel()
    element = np.repeat(t_elem, len(_TRI_WEIGHTS))
    seg, seg_elem, across = np.concatenate(segments), np.concatenate(s_elem), np.concatenate(s_across)
    tangent = seg[:, 1] - seg[:, 0]
    length = np.linalg.norm(tangent, axis=-1)
    normal = np.stack([tangent[:, 1], -tangent[:, 0]], axis=-1) / np.maximum(length, 1e-300)[:, None]
    # Outward: towards the outside vertices, from the inside ones (never along the segment, which separates them).
    normal *= np.where(np.einsum("nd,nd->n", normal, across) < 0, -1.0, 1.0)[:, None]
    b_points = (seg[:, :1] + _LINE_POINTS[None, :, None] * tangent[:, None]).reshape(-1, 2)
    # Pieces of no size: a vertex on the boundary (to rounding) leaves them; their normals would be noise.
    keep_t, keep_s = weights > 0, np.repeat(length > 1e-12 * min(hx, hy), len(_LINE_WEIGHTS))
    b_weights = (length[:, None] * _LINE_WEIGHTS).ravel()

    def basis(pts: np.ndarray, el: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        i, j = np.divmod(el, nx - 1)
        return bilinear_basis(pts[:, 0] / hx - j, pts[:, 1] / hy - i, hx, hy)

    values, grads = basis(points, element)
    b_element = np.repeat(seg_elem, len(_LINE_WEIGHTS))
    b_values, b_grads = basis(b_points, b_element)
    return CutCells((ny, nx), sdf, full, cut, element[keep_t], values[keep_t], grads[keep_t], weights[keep_t],
                    points[keep_t], b_element[keep_s], b_values[keep_s], b_grads[keep_s], b_weights[keep_s],
                    b_points[keep_s], np.repeat(normal, len(_LINE_WEIGHTS), axis=0)[keep_s], extent)
