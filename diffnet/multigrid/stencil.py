"""The stencil layout of the torch multigrid: a field's Hessian as a 3^d-point stencil, and its algebra.

A scalar family's Hessian at a field (S, *grid) is a stencil (S, 3^d, *grid), entry k at node i the
coupling of i to i + o_k (offsets o_k in :func:`itertools.product` order of (-1, 0, 1)); a family with C
unknown fields (S, C, *grid) has a block stencil (S, C, C, 3^d, *grid), entry [a, b, k] at node i coupling
component a at i to component b at i + o_k. Internally everything is in the block layout (C = 1 for a
scalar family: the same arithmetic).
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import TYPE_CHECKING

import numpy as np
import torch

from diffnet.backend.constants import constant

if TYPE_CHECKING:
    from diffnet.protocol.family import Family

__all__ = ["sparse_operator", "neighbour_offsets", "components", "as_blocks", "as_fields", "shifted", "apply_blocks", "apply_stencil",
           "free_couplings", "on_free_nodes", "coupling_index", "dense_operator"]


def neighbour_offsets(dims: int) -> list[tuple[int, ...]]:
    return list(itertools.product((-1, 0, 1), repeat=dims))


def components(family: Family) -> int:
    """C, the family's number of unknown fields: a field is (S, *grid) for C = 1, (S, C, *grid) otherwise."""
    return len(getattr(family, "unknowns", ("u",)))


def as_blocks(x: torch.Tensor, vector: bool) -> torch.Tensor:
    """Fields in the block layout (S, C, *grid): a scalar family's (S, *grid) get their C = 1 axis."""
    return x if vector else x[:, None]


def as_fields(x: torch.Tensor, vector: bool) -> torch.Tensor:
    """Block-layout fields (S, C, *grid) back in the family's own shape (:func:`as_blocks` undone)."""
    return x if vector else x[:, 0]


def shifted(x: torch.Tensor, offset: tuple[int, ...]) -> torch.Tensor:
    """y[..., i] = x[..., i + offset] (zero outside the grid) along x's last len(offset) axes."""
    pad = []
    for o in reversed(offset):
        pad += [max(-o, 0), max(o, 0)]
    padded = torch.nn.functional.pad(x, pad)
    # Along each axis the padding before it is max(-o, 0): node i + o sits at i + o + max(-o, 0).
    grid = x.shape[x.ndim - len(offset):]
    index = tuple(slice(max(-o, 0) + o, max(-o, 0) + o + n) for o, n in zip(offset, grid))
    return padded[(Ellipsis, *index)]


def apply_blocks(stencil: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A x for a block stencil (S, C, C, 3^d, *grid) and fields x (S, C, *grid)."""
    # x padded once with a layer of zeros; each neighbour is then a view into it (a pad per
    # offset cost 27 copies of the field in 3-D). For C = 1 the products and their order are the
    # scalar stencil's.
    dims = x.ndim - 2
    padded = torch.nn.functional.pad(x, (1, 1) * dims)
    out = torch.zeros_like(x)
    for k, offset in enumerate(neighbour_offsets(dims)):
        view = padded[(slice(None), slice(None), *(slice(1 + o, 1 + o + n) for o, n in zip(offset, x.shape[2:])))]
        for b in range(x.shape[1]):
            out += stencil[:, :, b, k] * view[:, b : b + 1]
    return out


def apply_stencil(stencil: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A x for a 3^d-point stencil (S, 3^d, *grid) (offsets in :func:`itertools.product` order) and x (S, *grid),
    or a block stencil (S, C, C, 3^d, *grid) and fields x (S, C, *grid)."""
    if stencil.ndim == x.ndim + 2:
        return apply_blocks(stencil, x)
    return apply_blocks(stencil[:, None, None], x[:, None])[:, 0]


def free_couplings(stencil: torch.Tensor, free: torch.Tensor) -> torch.Tensor:
    """A block stencil (S, C, C, 3^d, *grid) with every coupling that starts or ends at a fixed node (free (S, C, *grid)
    False) cut: the free rows and columns of the operator, nothing on the fixed ones."""
    dims = free.ndim - 2
    mask = free.to(stencil.dtype)
    return torch.stack([stencil[:, :, :, k] * mask[:, :, None] * shifted(mask, o)[:, None]
                        for k, o in enumerate(neighbour_offsets(dims))], dim=3)


def on_free_nodes(stencil: torch.Tensor, free: torch.Tensor, symmetrise: bool = True) -> torch.Tensor:
    """The operator on the free nodes of a block stencil (S, C, C, 3^d, *grid) and free (S, C, *grid):
    couplings to fixed nodes cut (:func:`free_couplings`), identity rows on them, and with ``symmetrise``
    symmetrised ((a, i; b, i + o) and (b, i + o; a, i) are one coupling; a probed stencil holds both to rounding,
    a family's own holds them exactly: the built-in families' differ by 0.0, and symmetrising a 3-D stencil
    was a third of a V-cycle's build)."""
    dims = free.ndim - 2
    offsets = neighbour_offsets(dims)
    out = free_couplings(stencil, free)
    if symmetrise:
        mirror = [offsets.index(tuple(-x for x in o)) for o in offsets]
        swapped = out.transpose(1, 2)
        twin = torch.stack([shifted(swapped[:, :, :, mirror[k]], o) for k, o in enumerate(offsets)], dim=3)
        out = 0.5 * (out + twin)
    centre = offsets.index((0,) * dims)
    for a in range(free.shape[1]):
        out[:, a, a, centre] = torch.where(free[:, a], out[:, a, a, centre], torch.ones_like(out[:, a, a, centre]))
    return out



def coupling_index(grid: tuple[int, ...], components: int, reach: int = 1) -> tuple[np.ndarray, ...]:
    """Every coupling of a block stencil on ``grid`` that stays inside it, offsets up to ``reach`` along each axis
    (in :func:`itertools.product` order over (-reach, ..., reach)^d: 3^d points for 1, a coarse operator's 5^d for
    2): arrays (a, b, k, i, j) of the unknowns' components, the offset's index and the two nodes (flat, j = i + o_k),
    pairs (a, b) outermost. The dense matrices and the banded factors of stencils are filled through them."""
    n = math.prod(grid)
    index = np.arange(n).reshape(grid)
    found = []
    for k, offset in enumerate(itertools.product(range(-reach, reach + 1), repeat=len(grid))):
        rows = index[tuple(slice(max(-o, 0), m - max(o, 0)) for o, m in zip(offset, grid))].ravel()
        cols = index[tuple(slice(max(o, 0), m - max(-o, 0)) for o, m in zip(offset, grid))].ravel()
        found.append((np.full_like(rows, k), rows, cols))
    k, i, j = (np.concatenate(x) for x in zip(*found))
    a, b = (np.repeat(x.ravel(), len(i)) for x in np.indices((components, components)))
    return a, b, np.tile(k, components**2), np.tile(i, components**2), np.tile(j, components**2)


@functools.lru_cache(maxsize=16)
def _dense_index(c: int, grid: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Where each coupling of a block stencil (C, C, 3^d, *grid) inside the grid lands in its dense matrix
    (C n, C n), unknowns component-major (a n + i): flat indices into both."""
    n, offsets = math.prod(grid), 3 ** len(grid)
    a, b, k, i, j = coupling_index(grid, c)
    return ((a * c + b) * offsets + k) * n + i, (a * n + i) * (c * n) + b * n + j


def dense_operator(stencil: torch.Tensor) -> torch.Tensor:
    """A block stencil (S, C, C, 3^d, *grid) as dense matrices (S, C n, C n), unknowns component-major (a n + i);
    couplings that point outside the grid are not read. One scatter through index arrays made once per grid
    (the product with n unit vectors it replaces was most of a 3-D elasticity V-cycle's build)."""
    s, c, grid = stencil.shape[0], stencil.shape[1], tuple(stencil.shape[4:])
    like = torch.empty(0, dtype=torch.long, device=stencil.device)
    source = constant(("dense operator source", c, grid), lambda: _dense_index(c, grid)[0], like)
    target = constant(("dense operator target", c, grid), lambda: _dense_index(c, grid)[1], like)
    n = c * math.prod(grid)
    dense = stencil.new_zeros(s, n * n)
    dense[:, target] = stencil.reshape(s, -1)[:, source]
    return dense.reshape(s, n, n)


def sparse_operator(stencil: np.ndarray, free: np.ndarray):
    """One instance's block stencil (C, C, 3^d, *grid) restricted to its free unknowns ``free`` (C, *grid) bool, as a
    scipy CSR matrix over them, and their flat indices (component-major, a n + i): the system a classical solve of
    the Hessian factorises (the adjoint of ``deepfusion invert --classical``)."""
    import scipy.sparse as sp

    stencil, free = np.asarray(stencil), np.asarray(free, dtype=bool).reshape(-1)
    c, grid = stencil.shape[0], tuple(stencil.shape[3:])
    n, offsets = math.prod(grid), 3 ** len(grid)
    a, b, k, i, j = coupling_index(grid, c)
    values = stencil.reshape(-1)[((a * c + b) * offsets + k) * n + i]
    row, col = a * n + i, b * n + j
    keep = free[row] & free[col]
    index = np.flatnonzero(free)
    position = np.full(c * n, -1)
    position[index] = np.arange(len(index))
    matrix = sp.csr_matrix((values[keep], (position[row[keep]], position[col[keep]])), shape=(len(index),) * 2)
    return matrix, index
