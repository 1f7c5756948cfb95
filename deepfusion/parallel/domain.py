"""The geometry of a domain split, without torch: tiles per axis and equal tiles. The configuration's
checks of a split (:mod:`deepfusion.configuration.split`), the trainer's process grid
(:class:`deepfusion.parallel.halo.DomainSplit`) and ``infer --domain`` ask here.

Messages carry no key: each caller names its own (``parallel.domain``, ``--domain``).
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["tile_bounds", "domain_splits"]


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
