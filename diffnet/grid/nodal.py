"""Per-instance node data against fields of any number of unknowns.

A family's fields are (S, *grid) for one unknown and (S, C, *grid) for C of them; what it knows per
instance and node (a domain's signed distance, the mask of the nodes inside it) is (S, *grid) whatever C
is. numpy aligns trailing axes, so ``np.where(inside, fields, 0)`` with a (S, *grid) mask and (S, C, *grid)
fields raises when S != C and, worse, pairs instance k's mask with unknown k when S == C. Every place a
mask meets a field goes through :func:`over_unknowns` instead.
"""

from __future__ import annotations

import numpy as np

__all__ = ["node_data", "over_unknowns", "inside_only"]


def node_data(values, count: int, grid: tuple[int, ...], what: str = "domain(instances)") -> np.ndarray:
    """``values`` as per-instance node data (count, *grid), float64: given as (count, *grid), or as
    (count, 1, *grid) (one channel, as a field of one unknown is written); any other shape raises
    ``ValueError`` naming ``what`` and the shape it must have."""
    data = np.asarray(values, dtype=np.float64)
    grid = tuple(grid)
    if data.shape == (count, 1, *grid):
        data = data[:, 0]
    if data.shape != (count, *grid):
        raise ValueError(f"{what} returned shape {list(data.shape)} for {count} instance{'s' if count != 1 else ''}; "
                         f"it must be one value per instance and node, {list((count, *grid))}, whatever the number "
                         f"of unknowns")
    return data


def over_unknowns(per_node: np.ndarray, fields: np.ndarray) -> np.ndarray:
    """``per_node`` (S, *grid) broadcast to ``fields`` (S, *grid) or (S, C, *grid): instance k's values for every
    unknown of instance k (a read-only view). Raises ``ValueError`` when the two do not share S and the grid."""
    per_node, fields = np.asarray(per_node), np.asarray(fields)
    s, grid = per_node.shape[0], per_node.shape[1:]
    extra = fields.ndim - per_node.ndim
    if fields.shape[:1] != (s,) or fields.shape[fields.ndim - len(grid):] != grid or extra not in (0, 1):
        raise ValueError(f"node data {list(per_node.shape)} does not match fields {list(fields.shape)}: expected "
                         f"fields {list(per_node.shape)} or (S, C, *grid) {[s, 'C', *grid]}")
    return np.broadcast_to(per_node.reshape(s, *([1] * extra), *grid), fields.shape)


def inside_only(fields: np.ndarray, sdf: np.ndarray) -> np.ndarray:
    """``fields`` (S, *grid) or (S, C, *grid) with every unknown set to zero at the nodes outside each instance's
    domain (``sdf`` (S, *grid), the signed distance: > 0 outside)."""
    fields = np.asarray(fields)
    return np.where(over_unknowns(np.asarray(sdf) <= 0, fields), fields, 0.0)
