"""A configuration's domain split checked whole: tiles per axis of ``parallel.domain``, the U-Net's
alignment on each multigrid level, and what a split sample can be trained with. The configuration's
checks, ``deepfusion train`` (its process grid) and ``jobs --memory-per-node`` ask here; the tiles'
geometry is :mod:`deepfusion.parallel.domain`'s.

Messages carry no key: each caller names its own (``parallel.domain``, ``--domain``).
"""

from __future__ import annotations

import math

from deepfusion.configuration.schema import Config, first_order
from deepfusion.parallel.domain import domain_splits, tile_bounds

__all__ = ["unet_alignment", "split_of", "check_split"]


def unet_alignment(cfg: Config, level: int = -1) -> int:
    """Nodes a tile side must be a multiple of on multigrid level ``level`` (-1: the finest grid).

    The U-Net pools ``len(model.channels) - 1`` times, so where it runs on a level's grid its tiles
    are multiples of ``2 ** (len(channels) - 1)``; a deepened stack runs it on the coarsest grid only
    and tiles a refinement block (any size) on the finer ones, unless its transfer carries the U-Net.
    """
    levels = len(cfg.multigrid.levels)
    index = level % levels if levels else 0
    unet = index == 0 or levels < 2 or cfg.multigrid.transfer == "carry"
    return 2 ** (len(cfg.model.channels) - 1) if unet else 1


def split_of(cfg: Config) -> tuple[int, ...] | None:
    """The configuration's tiles per axis, or None when it splits no sample."""
    domain = cfg.parallel.domain
    if not domain or math.prod(domain) == 1:
        return None
    return domain_splits(domain, len(cfg.problem.resolution))


def check_split(cfg: Config, dims: int) -> None:
    """Raise ValueError (one line) when ``parallel.domain`` cannot train: a tile count per axis or
    one, CPU ranks, a first-order optimiser, rediscretised coarse levels, and every level's grid in
    equal tiles aligned for the U-Net."""
    par = cfg.parallel
    if len(par.domain) not in (1, dims):
        raise ValueError(f"give one tile count per axis of the {dims}-D grid, or one for slabs (got {list(par.domain)})")
    if par.device != "cpu":
        raise ValueError("the halo exchange runs on CPU ranks; use parallel.device = 'cpu'")
    if first_order(cfg.train.optimizer) != cfg.train.optimizer:
        raise ValueError("a split sample is trained by Adam or SGD; use train.optimizer = 'adam' or 'sgd'")
    if cfg.multigrid.coarse_loss != "rediscretised":
        raise ValueError("the coarse levels' Galerkin loss is not split; use multigrid.coarse_loss = 'rediscretised'")
    splits = domain_splits(par.domain, dims)
    res, levels = tuple(cfg.problem.resolution), cfg.multigrid.levels
    grids = [(n,) * len(res) for n in levels] if levels else [res]
    for k, grid in enumerate(grids):
        try:
            for n, p in zip(grid, splits):
                tile_bounds(n, p, unet_alignment(cfg, k))
        except ValueError as e:
            raise ValueError(f"{e} (the {'x'.join(map(str, grid))} grid)") from None
