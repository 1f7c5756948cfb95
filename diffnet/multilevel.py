"""The multilevel output basis: bilinear prolongation between grids, and the synthesis
u = sum_l P_l c_l of one correction field per level with its transpose.

Why: the Q1 energy's Hessian in nodal values has condition number O(h^-2), so a generator
that emits nodal values moves the smooth error modes almost not at all (measured on the
Poisson family: the coarse level's discretisation error stays imprinted on the fine
field). Emitting one correction per level and summing them through the prolongation is a
linear reparameterisation of the same output: the loss and its minimiser are unchanged,
the gradient is a true gradient of that loss, and a smooth mode is one coefficient on a
coarse level instead of many small nodal ones.

The prolongation is PyTorch's bilinear ``interpolate``; it is separable linear
interpolation, ``A_y v A_x^T`` with the 1-D matrices of :func:`interpolation_matrix`,
so the transpose used by :func:`restrict` and :func:`synthesis_adjoint` is those matrices
transposed, not an autograd trick (the tests check both identities).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from diffnet.constants import constant

__all__ = ["interpolation_matrix", "prolong", "restrict", "synthesise", "synthesis_adjoint"]


def interpolation_matrix(n_in: int, n_out: int, align_corners: bool) -> np.ndarray:
    """The (n_out, n_in) matrix of 1-D linear interpolation from ``n_in`` to ``n_out`` points.

    ``align_corners=True``: nodal grids whose end points are the domain's ends (the
    multigrid levels, x_j = j / (n - 1)). ``False``: cell-centred grids, as average pooling
    makes them (the U-Net's internal levels), with the end values held beyond the first
    and last centres. Both are PyTorch's conventions for ``interpolate``.
    """
    if n_in < 1 or n_out < 1:
        raise ValueError(f"need n_in, n_out >= 1, got {n_in}, {n_out}")
    dst = np.arange(n_out, dtype=np.float64)
    if align_corners:
        src = dst * ((n_in - 1) / (n_out - 1)) if n_out > 1 else np.zeros(1)
    else:
        src = np.maximum((dst + 0.5) * (n_in / n_out) - 0.5, 0.0)
    i0 = np.minimum(np.floor(src).astype(int), n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    w1 = src - i0
    m = np.zeros((n_out, n_in))
    np.add.at(m, (np.arange(n_out), i0), 1.0 - w1)
    np.add.at(m, (np.arange(n_out), i1), w1)
    return m


def _matrices(shape_in: tuple[int, int], shape_out: tuple[int, int], align_corners: bool, like: torch.Tensor):
    key = ("interp", shape_in, shape_out, align_corners)
    ay = constant(key + ("y",), lambda: interpolation_matrix(shape_in[0], shape_out[0], align_corners), like)
    ax = constant(key + ("x",), lambda: interpolation_matrix(shape_in[1], shape_out[1], align_corners), like)
    return ay, ax


def prolong(v: torch.Tensor, size: Sequence[int], align_corners: bool = True) -> torch.Tensor:
    """Bilinear interpolation of ``v`` (S, C, H, W) to (S, C, size[0], size[1]).

    PyTorch's own kernel (O(n) work, where the matrix form costs a dense product per
    axis: about 100x the flops at 256^2); it equals ``A_y v A_x^T`` of
    :func:`interpolation_matrix`.
    """
    return F.interpolate(v, size=tuple(size), mode="bilinear", align_corners=align_corners)


def restrict(v: torch.Tensor, size: Sequence[int], align_corners: bool = True) -> torch.Tensor:
    """The transpose of :func:`prolong` from ``size`` to ``v``'s grid: (..., H, W) -> (..., size[0], size[1])."""
    ay, ax = _matrices(tuple(size), tuple(v.shape[-2:]), align_corners, v)
    return ay.T @ v @ ax


def synthesise(corrections: Sequence[torch.Tensor], align_corners: bool = True) -> torch.Tensor:
    """u = P(... P(P c_0 + c_1) ...) + c_n: corrections coarse first, each prolonged to the next grid.

    Nested prolongation is the multigrid form of sum_l P_l c_l (P_l the product of the
    transfers from level l to the finest).
    """
    u = corrections[0]
    for c in corrections[1:]:
        u = prolong(u, c.shape[-2:], align_corners) + c
    return u


def synthesis_adjoint(v: torch.Tensor, shapes: Sequence[Sequence[int]], align_corners: bool = True) -> list[torch.Tensor]:
    """The transpose of :func:`synthesise`: a fine field ``v`` to one field per level (``shapes`` coarse first)."""
    out = [v]
    for shape in reversed(shapes[:-1]):
        out.append(restrict(out[-1], shape, align_corners))
    return out[::-1]
