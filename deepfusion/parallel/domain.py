"""The rules of a domain split, in one place and without torch: tiles per axis from ``parallel.domain``,
equal tiles, the U-Net's alignment on each multigrid level, and a configuration's split checked
whole. The configuration's checks, the trainer's process grid (:class:`deepfusion.parallel.halo.DomainSplit`),
``infer --domain`` and ``jobs --memory-per-node`` all ask here.

Messages carry no key: each caller names its own (``parallel.domain``, ``--domain``).
"""

from __future__ import annotations

import math
from typing import Sequence

from deepfusion.configuration.schema import Config, first_order

__all__ = ["tile_bounds", "domain_splits", "unet_alignment", "split_of", "check_split"]


def tile_bounds(n: int, parts: int, align: int = 1) -> list[tuple[int, int]]:
    """Split ``n`` nodes into ``parts`` equal contiguous ranges whose sizes are multiples of ``align``.

    Raises ValueError with a one-line reason when the grid does not split so (equal tiles keep
    a U-Net's pooling levels aligned across tiles).
    """
    if parts < 1:
        raise ValueError(f"need at least one tile per axis, got {parts}")
    if n % parts or (n // parts) % align:
        raise ValueError(f"{n} nodes do not split into {parts} tiles of a multiple of {align} nodes")
    size = n // parts
    return [(k * size, (k + 1) * size) for k in range(parts)]


def domain_splits(domain: Sequence[int], dims: int) -> tuple[int, ...]:
    """Tile counts as tiles per axis of a ``dims``-D grid (one number: slabs along the first axis)."""
    return tuple(int(p) for p in domain) if len(domain) == dims else (int(domain[0]),) + (1,) * (dims - 1)


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
