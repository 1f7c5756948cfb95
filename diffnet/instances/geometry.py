"""Domains as data: signed distance functions of analytic shapes and their unions, intersections and
differences, or of an occupancy image, in 2-D and 3-D.

A :class:`Shape` answers one question, the signed distance ``sdf(points)`` of points (..., d) given
x first (x, y[, z]): negative inside, positive outside, zero on the boundary. The immersed Q1 energies
(:mod:`diffnet.instances.cutcell`) need its sign at the grid's nodes and the boundary's crossings of the
element edges, found here on the shape itself (:meth:`Shape.crossing`), so that the reconstructed
boundary's vertices lie on the true one; the network reads the signed distance on the grid.

Distances: a disc's, a box's and a half-space's are exact; a union's (min), an intersection's (max)
and a difference's (max(a, -b)) are exact outside, resp. inside, and bounds elsewhere, with the right
sign and zero set everywhere, the usual constructive-solid-geometry rule; a star-shaped domain's is
the radial gap divided by the boundary's slope factor, exact to first order at the boundary; an
occupancy image's is the Euclidean distance transform of its voxels (:func:`scipy.ndimage.distance_transform_edt`),
interpolated linearly between the image's nodes, so its boundary lies half-way between an inside and
an outside node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, ClassVar, Sequence

import numpy as np

__all__ = ["Shape", "Disc", "Box", "HalfSpace", "Star", "Union", "Intersection", "Difference", "Occupancy",
           "grid_points", "check_hole_range", "hole_error"]


_ROUNDING = 4 * np.finfo(float).eps  # a distance's rounding, coordinates of order 1


def grid_points(resolution: Sequence[int], extent: Sequence[float] | None = None) -> np.ndarray:
    """The nodes of the unit square's or cube's grid ``resolution`` (axes outermost first) as points
    (*resolution, d), coordinates x first; ``extent`` (x first): a box's sides instead of 1."""
    extent = (1.0,) * len(resolution) if extent is None else tuple(extent)
    axes = [np.linspace(0.0, length, n) for n, length in zip(resolution, extent[::-1])]
    mesh = np.meshgrid(*axes, indexing="ij")
    return np.stack(mesh[::-1], axis=-1)


class Shape:
    """A domain by its signed distance: negative inside. Combine with ``|`` (union), ``&`` (intersection)
    and ``-`` (difference)."""

    dims: int = 2

    def sdf(self, points: np.ndarray) -> np.ndarray:
        """Signed distance of ``points`` (..., d), x first; shape (...)."""
        raise NotImplementedError

    def on_grid(self, resolution: Sequence[int], extent: Sequence[float] | None = None) -> np.ndarray:
        """The signed distance at the nodes of the unit square's or cube's grid, shape ``resolution`` (of the box
        with sides ``extent``, x first, if given)."""
        if len(resolution) != self.dims:
            raise ValueError(f"a {self.dims}-D shape on a grid of {len(resolution)} axes")
        return self.sdf(grid_points(resolution, extent))

    def crossing(self, inside: np.ndarray, outside: np.ndarray, steps: int = 52) -> np.ndarray:
        """Where the boundary crosses the segments from ``inside`` points (n, d) (distance <= 0) to ``outside``
        ones (> 0): the parameter t in [0, 1] of each crossing, to the distance's rounding.

        Secant steps through the last two points, kept inside the bracket of the sign change, and a bisection
        whenever a step would leave it or move more than half the step before last (Dekker's safeguard): at most
        ``2 steps`` evaluations and, a distance being close to linear along an element's edge, 5-6 in practice
        against bisection's 52 (the cut-cell set-up was half of a plate-with-a-hole solve, issue 74)."""
        lo, hi = np.zeros(len(inside)), np.ones(len(inside))
        d = outside - inside
        length = np.linalg.norm(d, axis=-1)
        x0, f0 = lo, self.sdf(inside)
        x1, f1 = hi, self.sdf(outside)
        before = np.ones(len(inside))  # the length of the step before last
        last = np.ones(len(inside))
        live = np.ones(len(inside), dtype=bool)
        # Whole arrays every step, the converged ones held: a few hundred edges, where indexing costs more than sums.
        for _ in range(2 * steps):
            if not live.any():
                break
            with np.errstate(divide="ignore", invalid="ignore"):
                t = x1 - f1 * (x1 - x0) / (f1 - f0)
            # Dekker's safeguard: a secant step must stay in the bracket and move less than half the step before last.
            t = np.where((t > lo) & (t < hi) & (np.abs(t - x1) <= 0.5 * before), t, 0.5 * (lo + hi))
            f = self.sdf(inside + t[:, None] * d)
            before, last = np.where(live, last, before), np.where(live, np.abs(t - x1), last)
            x0, f0 = np.where(live, x1, x0), np.where(live, f1, f0)
            x1, f1 = np.where(live, t, x1), np.where(live, f, f1)
            # On the boundary to rounding (a distance on the unit square or cube: a few ulps of 1): done.
            hit = live & (np.abs(f) <= _ROUNDING)
            lo = np.where(hit | live & (f <= 0), t, lo)
            hi = np.where(hit | live & (f > 0), t, hi)
            live &= ~hit & ((hi - lo) * length > _ROUNDING)
        return 0.5 * (lo + hi)

    def __or__(self, other: "Shape") -> "Shape":
        return Union((self, other))

    def __and__(self, other: "Shape") -> "Shape":
        return Intersection((self, other))

    def __sub__(self, other: "Shape") -> "Shape":
        return Difference(self, other)


def _dims(*parts: "Shape") -> int:
    dims = {p.dims for p in parts}
    if len(dims) != 1:
        raise ValueError(f"shapes of different dimensions combined: {sorted(dims)}")
    return dims.pop()


@dataclass(frozen=True)
class Disc(Shape):
    """A disc (2-D) or ball (3-D): ``center`` x first, ``radius`` > 0."""

    center: tuple[float, ...]
    radius: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "center", tuple(float(c) for c in self.center))
        if not self.radius > 0:
            raise ValueError(f"a disc needs a radius > 0, got {self.radius}")

    @property
    def dims(self) -> int:
        return len(self.center)

    def sdf(self, points: np.ndarray) -> np.ndarray:
        return np.linalg.norm(points - np.asarray(self.center), axis=-1) - self.radius


@dataclass(frozen=True)
class Box(Shape):
    """An axis-aligned box [low, high] (x first)."""

    low: tuple[float, ...]
    high: tuple[float, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "low", tuple(float(v) for v in self.low))
        object.__setattr__(self, "high", tuple(float(v) for v in self.high))
        if len(self.low) != len(self.high) or not all(a < b for a, b in zip(self.low, self.high)):
            raise ValueError(f"a box needs low < high on every axis, got {self.low} and {self.high}")

    @property
    def dims(self) -> int:
        return len(self.low)

    def sdf(self, points: np.ndarray) -> np.ndarray:
        centre = (np.asarray(self.low) + np.asarray(self.high)) / 2
        q = np.abs(points - centre) - (np.asarray(self.high) - np.asarray(self.low)) / 2
        return np.linalg.norm(np.maximum(q, 0.0), axis=-1) + np.minimum(q.max(axis=-1), 0.0)


@dataclass(frozen=True)
class HalfSpace(Shape):
    """The points p with n . p <= offset (``normal`` n x first, normalised here)."""

    normal: tuple[float, ...]
    offset: float

    def __post_init__(self) -> None:
        n = np.asarray(self.normal, dtype=np.float64)
        if not np.linalg.norm(n) > 0:
            raise ValueError("a half-space needs a nonzero normal")
        object.__setattr__(self, "normal", tuple(n / np.linalg.norm(n)))

    @property
    def dims(self) -> int:
        return len(self.normal)

    def sdf(self, points: np.ndarray) -> np.ndarray:
        return points @ np.asarray(self.normal) - self.offset


@dataclass(frozen=True)
class Star(Shape):
    """A star-shaped 2-D domain about ``center``: radius r(θ) = r0 (1 + Σ_k a_k cos kθ + b_k sin kθ).

    ``cos`` and ``sin`` are the coefficients a_1..a_K and b_1..b_K. The distance is the radial gap
    ρ - r(θ) divided by sqrt(1 + (r'(θ) / ρ)^2), the boundary's slope factor: exact on a circle and
    to first order at any boundary point.
    """

    center: tuple[float, float]
    r0: float
    cos: tuple[float, ...] = ()
    sin: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        for key in ("center", "cos", "sin"):
            object.__setattr__(self, key, tuple(float(v) for v in getattr(self, key)))
        if len(self.cos) != len(self.sin):
            raise ValueError(f"a star needs as many cosine as sine coefficients, got {len(self.cos)} and {len(self.sin)}")
        if not self.r0 > 0:
            raise ValueError(f"a star needs r0 > 0, got {self.r0}")

    def radius(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """r(θ) and r'(θ)."""
        k = np.arange(1, len(self.cos) + 1)
        kt = np.multiply.outer(theta, k)
        a, b = np.asarray(self.cos), np.asarray(self.sin)
        r = self.r0 * (1.0 + (np.cos(kt) @ a if len(k) else 0.0) + (np.sin(kt) @ b if len(k) else 0.0))
        dr = self.r0 * ((-np.sin(kt) * k) @ a + (np.cos(kt) * k) @ b) if len(k) else np.zeros_like(theta)
        return r, dr

    def min_radius(self, samples: int = 2048) -> float:
        """The smallest r(θ) over ``samples`` directions."""
        return float(self.radius(np.linspace(0.0, 2.0 * np.pi, samples, endpoint=False))[0].min())

    def sdf(self, points: np.ndarray) -> np.ndarray:
        d = points - np.asarray(self.center)
        rho = np.linalg.norm(d, axis=-1)
        theta = np.arctan2(d[..., 1], d[..., 0])
        r, dr = self.radius(theta)
        slope = np.sqrt(1.0 + (dr / np.maximum(rho, 1e-12)) ** 2)
        return (rho - r) / slope

    def boundary(self, n: int) -> np.ndarray:
        """``n`` points on the boundary (n, 2), counter-clockwise, for plots and meshes."""
        theta = np.linspace(0.0, 2.0 * np.pi, n, endpoint=False)
        r, _ = self.radius(theta)
        return np.asarray(self.center) + r[:, None] * np.stack([np.cos(theta), np.sin(theta)], axis=-1)


@dataclass(frozen=True)
class _Combination(Shape):
    """Shapes combined point by point: the signed distance is ``combine`` over the parts' (exact
    outside for a union, inside for an intersection; a bound elsewhere, the sign always right)."""

    parts: tuple[Shape, ...]
    combine: ClassVar[Callable[..., np.ndarray]]

    def __post_init__(self) -> None:
        _dims(*self.parts)

    @property
    def dims(self) -> int:
        return _dims(*self.parts)

    def sdf(self, points: np.ndarray) -> np.ndarray:
        return type(self).combine([p.sdf(points) for p in self.parts], axis=0)


@dataclass(frozen=True)
class Union(_Combination):
    """The points in any of ``parts``."""

    combine = np.min


@dataclass(frozen=True)
class Intersection(_Combination):
    """The points in every one of ``parts``."""

    combine = np.max


@dataclass(frozen=True)
class Difference(Shape):
    """The points of ``base`` not in ``cut``."""

    base: Shape
    cut: Shape

    def __post_init__(self) -> None:
        _dims(self.base, self.cut)

    @property
    def dims(self) -> int:
        return _dims(self.base, self.cut)

    def sdf(self, points: np.ndarray) -> np.ndarray:
        return np.maximum(self.base.sdf(points), -self.cut.sdf(points))


@dataclass(frozen=True, eq=False)
class Occupancy(Shape):
    """A domain given by an image: ``image`` (boolean, axes outermost first) marks the nodes of a uniform
    grid on the unit square or cube that are inside. The signed distance is computed from the image
    (outside nodes: the distance to the nearest inside node, minus half a node spacing; inside ones the
    reverse) and interpolated linearly between its nodes."""

    image: np.ndarray
    _field: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        from scipy.ndimage import distance_transform_edt

        image = np.asarray(self.image, dtype=bool)
        if image.ndim not in (2, 3) or min(image.shape) < 2:
            raise ValueError(f"an occupancy image is 2-D or 3-D with at least 2 nodes a side, got {image.shape}")
        if not image.any():
            raise ValueError("the occupancy image has no inside node: the domain is empty")
        spacing = tuple(1.0 / (n - 1) for n in image.shape)
        half = 0.5 * min(spacing)
        outside = distance_transform_edt(~image, sampling=spacing) - half
        inside = distance_transform_edt(image, sampling=spacing) - half
        object.__setattr__(self, "image", image)
        object.__setattr__(self, "_field", np.where(image, -inside, outside))

    @property
    def dims(self) -> int:
        return self.image.ndim

    def sdf(self, points: np.ndarray) -> np.ndarray:
        from scipy.interpolate import RegularGridInterpolator

        axes = [np.linspace(0.0, 1.0, n) for n in self.image.shape]
        look = RegularGridInterpolator(axes, self._field, bounds_error=False, fill_value=None)
        p = np.asarray(points, dtype=np.float64)
        return look(p[..., ::-1].reshape(-1, self.dims)).reshape(p.shape[:-1])  # the image's axes, outermost first


def check_hole_range(hole_x: tuple[float, float], hole_y: tuple[float, float], hole_r: tuple[float, float]) -> None:
    """A hole of radius up to ``hole_r[1]`` centred in the ranges ``hole_x`` and ``hole_y`` must stay inside the unit
    square: else the configuration's one-line ``ValueError("hole_x: ...")`` (the plates' ``check_options``)."""
    for axis, (lo, hi) in (("x", hole_x), ("y", hole_y)):
        if not (lo - hole_r[1] > 0 and hi + hole_r[1] < 1):
            raise ValueError(f"hole_{axis}: a hole of radius up to {hole_r[1]} centred in [{lo}, {hi}] leaves the "
                             "plate; every hole must lie inside the unit square")


def hole_error(x: float, y: float, r: float, resolution: Sequence[int]) -> str | None:
    """What keeps a hole of centre (x, y) and radius r from being resolved on the unit square's ``resolution`` grid:
    under a cell across, or within a cell of the square's sides (None when it is fine)."""
    h = 1.0 / (min(resolution) - 1)
    if r < h:
        return (f"the hole's radius {r:.3g} is under a cell ({h:.3g}) of the {'x'.join(map(str, resolution))} grid: "
                "thinner than it resolves")
    if min(x - r, y - r, 1 - x - r, 1 - y - r) < h:
        return (f"the hole (x {x:.3g}, y {y:.3g}, r {r:.3g}) comes within a cell of the plate's side; it must lie "
                "inside the grid")
    return None
