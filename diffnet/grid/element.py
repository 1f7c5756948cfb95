"""The Q1 (multilinear) reference element in numpy, in 2-D and 3-D: its nodes, its basis at the 2^d Gauss
points, and the element matrices built from them.

One element serves both sides of the project: the torch energies DiffNet is trained on
(:mod:`diffnet.discretisation.energy` turns these rows into convolution kernels) and the assembled
systems and multigrid of the classical solvers (:mod:`diffnet.solvers`), so the network's loss and the
reference solve are the quadratic forms of one matrix. ``spacing`` is (hx, hy[, hz]), x first.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

__all__ = ["ELEMENT_NODES", "element_nodes", "gauss_basis", "element_slices", "element_matrices"]

# Gauss points of the 2-point rule on [0, 1]; each carries weight 1/2.
_G = (0.5 - 0.5 / math.sqrt(3.0), 0.5 + 0.5 / math.sqrt(3.0))


def element_nodes(dims: int) -> tuple[tuple[int, ...], ...]:
    """An element's nodes as offsets from its lowest corner, one per axis outermost first ((dy, dx) in
    2-D, (dz, dy, dx) in 3-D), the last axis fastest: the order of :func:`gauss_basis`'s columns, of a
    2^d convolution kernel read row-major, and of every element matrix built from them (diffnet/solvers/)."""
    return tuple(itertools.product((0, 1), repeat=dims))


# The bilinear element's nodes, (dy, dx).
ELEMENT_NODES = element_nodes(2)


def gauss_basis(*spacing: float) -> tuple[np.ndarray, ...]:
    """The multilinear basis on one element, evaluated at its 2^d Gauss points.

    Parameters
    ----------
    *spacing : float
        The node spacings, x first: ``(hx, hy)`` for the bilinear element, ``(hx, hy, hz)`` for the
        trilinear one.

    Returns
    -------
    values, grad_x, grad_y[, grad_z] : numpy.ndarray
        Shape (2^d Gauss points, 2^d nodes): N_a and its derivatives at each point. Nodes are ordered
        as :func:`element_nodes`; Gauss points likewise (the last axis, x, fastest).
    weight : float
        The quadrature weight of every point including the Jacobian, prod(h) / 2^d.
    """
    dims = len(spacing)
    if dims not in (2, 3):
        raise ValueError(f"need 2 or 3 spacings (x first), got {len(spacing)}")
    nodes = element_nodes(dims)
    values = np.empty((2**dims, 2**dims))
    grads = [np.empty((2**dims, 2**dims)) for _ in range(dims)]
    for q, point in enumerate(itertools.product(_G, repeat=dims)):
        xs = point[::-1]  # the point's coordinates x first
        for a, node in enumerate(nodes):
            corner = node[::-1]
            f = [x if c else 1.0 - x for x, c in zip(xs, corner)]  # the 1-D factors, x first
            v = 1.0
            for fk in f:
                v *= fk
            values[q, a] = v
            for k in range(dims):  # d/dx_k: the k-th factor's slope times the others, x first
                g = 1.0 if corner[k] else -1.0
                for j in range(dims):
                    if j != k:
                        g *= f[j]
                grads[k][q, a] = g / spacing[k]
    return (values, *grads, math.prod(spacing) / 2**dims)


def element_slices(shape: tuple[int, ...]) -> list[tuple[slice, ...]]:
    """Per element node (:func:`~diffnet.grid.element.element_nodes` order), the slice of a node array of ``shape``
    that holds that corner of every element: gathering through it gives (cells) arrays, adding into it scatters."""
    return [tuple(slice(o, n - 1 + o) for o, n in zip(offset, shape)) for offset in element_nodes(len(shape))]


def element_matrices(spacing: tuple[float, ...], kappa: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per Gauss point q the element stiffness w grad N_a . grad N_b, shape (Q, 2^d, 2^d); the reaction
    term's element matrix kappa^2 w sum_q N_a N_b, (2^d, 2^d); the basis at the Gauss points, (Q, 2^d)."""
    values, *grads, w = gauss_basis(*spacing)
    stiff = w * sum(g[:, :, None] * g[:, None, :] for g in grads)
    return stiff, kappa**2 * w * values.T @ values, values
