"""A nodal field's values at points: the Q1 element's shape functions, as the discretisation itself reads the field.

A field on the unit square's or cube's node grid (N_y, N_x) or (N_z, N_y, N_x) is, inside each element, the
bilinear (trilinear) interpolation of its 2^d corner values: :func:`point_weights` gives, for each point, the flat
indices of its element's corners and their shape-function values, and :func:`values_at` (or :func:`read_at`, given
them) applies them to fields of any leading shape, numpy or torch (where the values are differentiable in the fields: an observation operator for
an inverse problem). Points are given x first, as everywhere else in the project.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

__all__ = ["point_weights", "values_at", "read_at", "extent_of", "box_text"]


def extent_of(family) -> tuple[float, ...]:
    """The sides of the box a family's grid spans, x first: its coordinates' last values (1 for the unit square or
    cube; the cylinder's channel 2.2 x 0.41)."""
    return tuple(float(v[-1]) for v in reversed(list(family.coordinates().values())))


def box_text(extent: Sequence[float]) -> str:
    """``the unit square`` / ``the unit cube``, or ``the box [0, 2.2] x [0, 0.41]``."""
    if all(e == 1.0 for e in extent):
        return f"the unit {'square' if len(extent) == 2 else 'cube'}"
    return "the box " + " x ".join(f"[0, {e:g}]" for e in extent)


def point_weights(resolution: Sequence[int], points, extent: Sequence[float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The corners and shape-function values of each point's element on the node grid ``resolution`` (axes
    outermost first) of the unit square or cube.

    Parameters
    ----------
    resolution : sequence of int
        Nodes per axis, outermost first: (N_y, N_x) or (N_z, N_y, N_x).
    points : array_like
        (P, d) coordinates, x first, each in [0, 1] (in [0, L] for a box of sides ``extent``).
    extent : sequence of float, optional
        The box's sides, x first (default 1: the unit square or cube).

    Returns
    -------
    index : numpy.ndarray
        (P, 2^d) flat node indices (C order over ``resolution``) of each point's element corners.
    weight : numpy.ndarray
        (P, 2^d) the corners' Q1 shape functions at the point (non-negative, summing to 1).

    Raises
    ------
    ValueError
        Points of the wrong dimension, not finite, or outside the box (one line naming the first).
    """
    grid = tuple(int(n) for n in resolution)
    dims = len(grid)
    p = np.asarray(points, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] != dims:
        raise ValueError(f"points must be (P, {dims}) coordinates x first on a {dims}-D grid, got shape {list(p.shape)}")
    extent = np.ones(dims) if extent is None else np.asarray(extent, dtype=np.float64)
    bad = ~np.isfinite(p).all(axis=1) | (p < 0.0).any(axis=1) | (p > extent).any(axis=1)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        need = "in [0, 1]" if (extent == 1.0).all() else "inside its sides " + ", ".join(f"{e:g}" for e in extent)
        raise ValueError(f"point {k} = {p[k].tolist()} is outside {box_text(extent)} (or not finite): every "
                         f"coordinate must be {need}")
    p = p / extent
    axes = grid[::-1]  # x first, as the points
    cells, local = [], []
    for axis, n in enumerate(axes):
        scaled = p[:, axis] * (n - 1)
        cell = np.clip(np.floor(scaled).astype(np.int64), 0, n - 2)  # a point on the last node: the last element
        cells.append(cell)
        local.append(scaled - cell)
    strides = np.cumprod((1,) + axes[:-1])  # flat index = sum over axes (x first) of index * stride
    index, weight = [], []
    for corner in itertools.product((0, 1), repeat=dims):
        index.append(sum((c + o) * s for c, o, s in zip(cells, corner, strides)))
        weight.append(np.prod([t if o else 1.0 - t for t, o in zip(local, corner)], axis=0))
    return np.stack(index, axis=1), np.stack(weight, axis=1)


def values_at(fields, resolution: Sequence[int], points, extent: Sequence[float] | None = None):
    """The values of nodal ``fields`` (..., *resolution) at ``points`` (P, d), x first: (..., P), read by the Q1
    shape functions (exact for a field bilinear, or trilinear, in each element). numpy in, numpy out; a torch tensor
    in, a torch tensor out, differentiable in the fields. ``extent``: the box's sides (default the unit square)."""
    return read_at(fields, resolution, point_weights(resolution, points, extent))


def read_at(fields, resolution: Sequence[int], weights: tuple[np.ndarray, np.ndarray]):
    """:func:`values_at` with the points' :func:`point_weights` already at hand (several fields at the same points)."""
    grid = tuple(int(n) for n in resolution)
    if tuple(fields.shape[len(fields.shape) - len(grid):]) != grid:
        raise ValueError(f"fields of shape {list(fields.shape)} do not end in the grid {list(grid)}")
    index, weight = weights
    flat = fields.reshape(*fields.shape[: len(fields.shape) - len(grid)], -1)
    if isinstance(flat, np.ndarray):
        return (flat[..., index] * weight).sum(axis=-1)
    import torch

    picked = flat[..., torch.as_tensor(index, device=flat.device)]
    return (picked * torch.as_tensor(weight, dtype=flat.dtype, device=flat.device)).sum(dim=-1)
