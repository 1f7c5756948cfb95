"""The multilevel output basis: bilinear prolongation between grids, and the synthesis
u = sum_l P_l c_l of one correction field per level with its transpose.

Why: the Q1 energy's Hessian in nodal values has condition number O(h^-2), so a generator
that emits nodal values moves the smooth error modes almost not at all (measured on the
Poisson family: the coarse level's discretisation error stays imprinted on the fine
field). Emitting one correction per level and summing them through the prolongation is a
linear reparameterisation of the same output: the loss and its minimiser are unchanged,
the gradient is a true gradient of that loss, and a smooth mode is one coefficient on a
coarse level instead of many small nodal ones.

The prolongation is PyTorch's bilinear (3-D: trilinear) ``interpolate``; it is separable linear
interpolation, ``A_y v A_x^T`` with the 1-D matrices of :func:`interpolation_matrix`,
so the transpose used by :func:`restrict` and :func:`synthesis_adjoint` is those matrices
transposed, not an autograd trick (the tests check both identities).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from diffnet.backend.constants import constant
from diffnet.grid.transfer import interpolation_matrix

__all__ = ["prolong", "prolong_block", "restrict", "synthesise", "synthesis_adjoint"]


_MODES = {1: "linear", 2: "bilinear", 3: "trilinear"}


def prolong(v: torch.Tensor, size: Sequence[int], align_corners: bool = True) -> torch.Tensor:
    """Bilinear (trilinear) interpolation of ``v`` (S, C, *grid) to (S, C, *size), grid 2-D (3-D).

    PyTorch's own kernel (O(n) work, where the matrix form costs a dense product per
    axis: about 100x the flops at 256^2); it equals ``A_y v A_x^T`` of
    :func:`interpolation_matrix` (one such factor per axis).
    """
    return F.interpolate(v, size=tuple(size), mode=_MODES[len(size)], align_corners=align_corners)


def prolong_block(v: torch.Tensor, size: Sequence[int], bounds: Sequence[tuple[int, int]],
                  align_corners: bool = True) -> torch.Tensor:
    """The block ``bounds`` ([start, stop) per axis of ``size``) of :func:`prolong` ``(v, size)``, without
    forming the rest: per axis, the interpolation matrix's rows of the block applied to the
    coarse layers they touch (a domain split's tile of a whole coarse field)."""
    d = len(size)
    for axis, (a, b) in enumerate(bounds):
        dim = v.ndim - d + axis
        rows = interpolation_matrix(v.shape[dim], size[axis], align_corners)[a:b]
        used = np.flatnonzero(np.abs(rows).sum(axis=0))
        lo, hi = int(used[0]), int(used[-1]) + 1
        m = constant(("interp block", v.shape[dim], size[axis], a, b, align_corners), lambda r=rows: r[:, lo:hi], v)
        v = torch.movedim(torch.tensordot(v.narrow(dim, lo, hi - lo), m, dims=([dim], [1])), -1, dim)
    return v


def restrict(v: torch.Tensor, size: Sequence[int], align_corners: bool = True) -> torch.Tensor:
    """The transpose of :func:`prolong` from ``size`` to ``v``'s grid: (..., *grid) -> (..., *size)."""
    d = len(size)
    for axis in range(d):
        n_fine = v.shape[v.ndim - d + axis]
        a = constant(("interp", size[axis], n_fine, align_corners),
                     lambda n=size[axis], m=n_fine: interpolation_matrix(n, m, align_corners), v)
        # Contract the axis with A (n_fine, n_coarse): its transpose applied along that axis.
        v = torch.movedim(torch.tensordot(v, a, dims=([v.ndim - d + axis], [0])), -1, v.ndim - d + axis)
    return v


def synthesise(terms: Sequence[torch.Tensor], align_corners: bool = True) -> torch.Tensor:
    """u = P(... P(P c_0 + c_1) ...) + c_n: terms coarse first, each prolonged to the next grid.

    Nested prolongation is the multigrid form of sum_l P_l c_l (P_l the product of the
    transfers from level l to the finest).
    """
    u = terms[0]
    for c in terms[1:]:
        u = prolong(u, c.shape[2:], align_corners) + c
    return u


def synthesis_adjoint(v: torch.Tensor, shapes: Sequence[Sequence[int]], align_corners: bool = True) -> list[torch.Tensor]:
    """The transpose of :func:`synthesise`: a fine field ``v`` to one field per level (``shapes`` coarse first)."""
    out = [v]
    for shape in reversed(shapes[:-1]):
        out.append(restrict(out[-1], shape, align_corners))
    return out[::-1]
