"""Gradients of a nodal Q1 field recovered to the nodes, the way a Q1 code reports fluxes and stresses: at each
element's 2^d Gauss points (where the Q1 gradient is most accurate: superconvergent on a uniform grid),
extrapolated to the element's corners by the element's own basis, and averaged over the elements at each node,
weighted (an element a cut domain barely enters counts for its inside fraction).

Every function takes numpy arrays (float64 out) or torch tensors (the tensor's dtype and device out, differentiable
in the input: an observation of a flux or a stress in an inverse problem); the work is torch's either way, so the
two agree to rounding.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from diffnet.grid.element import element_slices, gauss_basis

__all__ = ["as_tensors", "gauss_gradients", "to_nodes", "at_gauss", "recovered_flux"]


def as_tensors(x) -> tuple[torch.Tensor, Callable]:
    """``x`` as a torch tensor (a tensor as it is; an array in float64) and the map that gives a result (a tensor or
    a dict of them) back in ``x``'s kind: the one numpy/torch switch of the derived fields."""
    if isinstance(x, torch.Tensor):
        return x, lambda y: y
    back = lambda y: {k: v.numpy() for k, v in y.items()} if isinstance(y, dict) else y.numpy()  # noqa: E731
    return torch.as_tensor(np.asarray(x, dtype=np.float64)), back


def _like(matrix: np.ndarray, t: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(matrix, dtype=t.dtype, device=t.device)


def _corners(t: torch.Tensor, dims: int) -> torch.Tensor:
    """The 2^d corner values of every element of nodal ``t`` (..., *grid): (..., *cells, 2^d)."""
    return torch.stack([t[(..., *at)] for at in element_slices(tuple(t.shape[t.ndim - dims:]))], dim=-1)


def gauss_gradients(u, spacing: tuple[float, ...]):
    """du/dx_j at every element's Gauss points: (..., d, Q, *cells), j x first, for nodal ``u`` (..., *grid)."""
    t, back = as_tensors(u)
    dims = len(spacing)
    _, *grads, _ = gauss_basis(*spacing)
    corners = _corners(t, dims)
    out = torch.stack([corners @ _like(g.T, t) for g in grads], dim=-2)  # (..., *cells, d, Q)
    lead = t.ndim - dims
    return back(torch.movedim(out, (-2, -1), (lead, lead + 1)))


def to_nodes(at_gauss, dims: int, weight: np.ndarray | None = None):
    """Values at every element's Gauss points (..., Q, *cells) of a ``dims``-D grid recovered to its nodes
    (..., *grid): extrapolated to each element's corners by the multilinear function through them, then averaged
    over the elements at each node with ``weight`` (*cells) (default 1; a node no weighted element touches gets 0)."""
    t, back = as_tensors(at_gauss)
    values, *_ = gauss_basis(*([1.0] * dims))
    cells = tuple(t.shape[t.ndim - dims:])
    lead = tuple(t.shape[: t.ndim - dims - 1])
    w = torch.ones(cells, dtype=t.dtype, device=t.device) if weight is None else _like(np.asarray(weight), t)
    corner = torch.einsum("aq,...q->...a", _like(np.linalg.inv(values), t), torch.movedim(t, -dims - 1, -1))
    grid = tuple(n + 1 for n in cells)
    total, count = t.new_zeros(lead + grid), t.new_zeros(grid)
    for a, at in enumerate(element_slices(grid)):
        total[(..., *at)] += w * corner[..., a]
        count[at] += w
    touched = count > 0
    return back(torch.where(touched, total / torch.where(touched, count, torch.ones_like(count)), total.new_zeros(())))


def at_gauss(field, dims: int):
    """A nodal field (..., *grid) interpolated to every element's Gauss points: (..., Q, *cells)."""
    t, back = as_tensors(field)
    values, *_ = gauss_basis(*([1.0] * dims))
    return back(torch.movedim(_corners(t, dims) @ _like(values.T, t), -1, t.ndim - dims))


def recovered_flux(u, nu, spacing: tuple[float, ...]):
    """The flux -ν∇u of nodal fields u and ν (S, *grid) at the Gauss points, recovered to the nodes: (S, d, *grid),
    components x first."""
    dims = len(spacing)
    flux = -at_gauss(nu, dims)[:, None] * gauss_gradients(u, spacing)  # (S, d, Q, *cells)
    return to_nodes(flux, dims)
