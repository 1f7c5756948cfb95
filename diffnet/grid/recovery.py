"""Gradients of a nodal Q1 field recovered to the nodes, the way a Q1 code reports fluxes and stresses: at each
element's 2^d Gauss points (where the Q1 gradient is most accurate: superconvergent on a uniform grid),
extrapolated to the element's corners by the element's own basis, and averaged over the elements at each node,
weighted (an element a cut domain barely enters counts for its inside fraction).
"""

from __future__ import annotations

import numpy as np

from diffnet.grid.element import element_slices, gauss_basis

__all__ = ["gauss_gradients", "to_nodes", "at_gauss", "recovered_flux"]


def gauss_gradients(u: np.ndarray, spacing: tuple[float, ...]) -> np.ndarray:
    """du/dx_j at every element's Gauss points: (..., d, Q, *cells), j x first, for nodal ``u`` (..., *grid)."""
    u = np.asarray(u, dtype=np.float64)
    dims = len(spacing)
    grid = u.shape[u.ndim - dims:]
    _, *grads, _ = gauss_basis(*spacing)
    corners = np.stack([u[(..., *at)] for at in element_slices(grid)], axis=-1)  # (..., *cells, 2^d)
    out = np.stack([corners @ g.T for g in grads], axis=-2)  # (..., *cells, d, Q)
    lead = u.ndim - dims
    return np.moveaxis(out, (-2, -1), (lead, lead + 1))

def to_nodes(at_gauss: np.ndarray, dims: int, weight: np.ndarray | None = None) -> np.ndarray:
    """Values at every element's Gauss points (..., Q, *cells) of a ``dims``-D grid recovered to its nodes
    (..., *grid): extrapolated to each element's corners by the multilinear function through them, then averaged
    over the elements at each node with ``weight`` (*cells) (default 1; a node no weighted element touches gets 0)."""
    at_gauss = np.asarray(at_gauss, dtype=np.float64)
    values, *_ = gauss_basis(*([1.0] * dims))
    cells = at_gauss.shape[at_gauss.ndim - dims:]
    lead = at_gauss.shape[: at_gauss.ndim - dims - 1]
    weight = np.ones(cells) if weight is None else np.asarray(weight, dtype=np.float64)
    corner = np.einsum("aq,...q->...a", np.linalg.inv(values), np.moveaxis(at_gauss, -dims - 1, -1))
    grid = tuple(n + 1 for n in cells)
    total, count = np.zeros(lead + grid), np.zeros(grid)
    for a, at in enumerate(element_slices(grid)):
        total[(..., *at)] += weight * corner[..., a]
        count[at] += weight
    return np.divide(total, count, out=np.zeros_like(total), where=count > 0)


def at_gauss(field: np.ndarray, dims: int) -> np.ndarray:
    """A nodal field (..., *grid) interpolated to every element's Gauss points: (..., Q, *cells)."""
    field = np.asarray(field, dtype=np.float64)
    values, *_ = gauss_basis(*([1.0] * dims))
    grid = field.shape[field.ndim - dims:]
    corners = np.stack([field[(..., *at)] for at in element_slices(grid)], axis=-1)  # (..., *cells, 2^d)
    return np.moveaxis(corners @ values.T, -1, field.ndim - dims)


def recovered_flux(u: np.ndarray, nu: np.ndarray, spacing: tuple[float, ...]) -> np.ndarray:
    """The flux -ν∇u of nodal fields u and ν (S, *grid) at the Gauss points, recovered to the nodes: (S, d, *grid),
    components x first."""
    dims = len(spacing)
    flux = -at_gauss(nu, dims)[:, None] * gauss_gradients(u, spacing)  # (S, d, Q, *cells)
    return to_nodes(flux, dims)
