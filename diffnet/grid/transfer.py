"""Transfers between node grids in numpy: the one 1-D linear interpolation every multigrid of the project is
built from, and the hierarchy of grids it coarsens through.

The generators' prolongations (:mod:`diffnet.generators.multilevel`), the torch V-cycle and coarse
correction (:mod:`diffnet.multigrid`) and the numpy geometric multigrid (:mod:`diffnet.solvers.gmg`,
:mod:`diffnet.solvers.matrix_stencil`) all read their transfers off :func:`interpolation_weights`, so a
field prolonged by the network and by the solver is the same field.
"""

from __future__ import annotations

import numpy as np

__all__ = ["interpolation_weights", "interpolation_matrix", "grid_hierarchy"]


def interpolation_weights(n_fine: int, n_coarse: int) -> tuple[np.ndarray, np.ndarray]:
    """(left, weight), each (n_fine,): fine node j of ``n_fine`` uniform nodes on [0, 1] takes ``1 - weight``
    of coarse node ``left`` and ``weight`` of ``left + 1`` among ``n_coarse`` nodes on [0, 1].

    Nested grids (n_fine = 2 n_coarse - 1) get exactly 0 and 1/2 (the position is j times one ratio, not
    a rounded ``linspace``); a one-node axis is held (left 0, weight 0).
    """
    if n_fine < 1 or n_coarse < 1:
        raise ValueError(f"need n_fine, n_coarse >= 1, got {n_fine}, {n_coarse}")
    if n_coarse == 1:
        return np.zeros(n_fine, dtype=np.int64), np.zeros(n_fine)
    x = np.arange(n_fine, dtype=np.float64) * ((n_coarse - 1) / (n_fine - 1)) if n_fine > 1 else np.zeros(1)
    left = np.minimum(np.floor(x).astype(np.int64), n_coarse - 2)
    return left, x - left


def interpolation_matrix(n_in: int, n_out: int, align_corners: bool = True) -> np.ndarray:
    """The dense (n_out, n_in) matrix of 1-D linear interpolation from ``n_in`` to ``n_out`` points.

    ``align_corners=True``: nodal grids whose end points are the domain's ends (every multigrid level,
    x_j = j / (n - 1)): :func:`interpolation_weights`. ``False``: cell-centred grids, as average pooling
    makes them (the U-Net's internal levels), with the end values held beyond the first and last centres.
    Both are PyTorch's conventions for ``interpolate``.
    """
    if n_in < 1 or n_out < 1:
        raise ValueError(f"need n_in, n_out >= 1, got {n_in}, {n_out}")
    if align_corners:
        left, w1 = interpolation_weights(n_out, n_in)
    else:
        src = np.maximum((np.arange(n_out, dtype=np.float64) + 0.5) * (n_in / n_out) - 0.5, 0.0)
        left = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
        w1 = src - left
    right = np.minimum(left + 1, n_in - 1)
    m = np.zeros((n_out, n_in))
    np.add.at(m, (np.arange(n_out), left), 1.0 - w1)
    np.add.at(m, (np.arange(n_out), right), w1)
    return m


def grid_hierarchy(shape: tuple[int, ...], coarsest: int) -> list[tuple[int, ...]]:
    """Node grids halving the cells per side from ``shape`` until a side has at most ``coarsest`` nodes, coarsest
    first (levels are counted from the coarsest everywhere: docs/design.md, "Words").

    (2^k + 1)-node grids nest exactly; others coarsen to ceil(N / 2) nodes.
    """
    grids = [tuple(shape)]
    while min(grids[-1]) > coarsest:
        grids.append(tuple((n + 1) // 2 for n in grids[-1]))
    return grids[::-1]
