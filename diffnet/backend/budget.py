"""What one process keeps of its instances' set-up, in bytes: one budget, shared by the caches that keep it.

Training revisits every instance of a rank's shard each epoch, so what is built for one instance (its coarse space
and factor, a cut domain's discretisation, its Hessian, its assembled multigrid) is kept and served again; past a
cache's share of the budget the least recently used is built again when next met. Each cache reads its share when
it keeps something, so the budget may be set at any time before or during a run.

The budget is per process, and a node runs several: the engine sets it from the node's memory and its ranks
(``parallel.cache_gib``; ``deepfusion.parallel.runtime.cache_budget``). The default, 12 GiB, is what the caches held
before they shared one budget (coarse spaces 4, discretisations 2, Hessians 2, multigrids 4); two ranks at 128² each
reached it on a node of 23.5 GiB and the job was killed (issue 77).
"""

from __future__ import annotations

__all__ = ["DEFAULT_BYTES", "SHARES", "cache_bytes", "budget_bytes", "set_budget_bytes"]

DEFAULT_BYTES = 12 * 2**30

# Each cache's part of the budget (they sum to 1): the coarse spaces and the multigrids are the large ones per
# instance (a factor, a hierarchy), the cut cells' discretisations and Hessians a few MB each.
SHARES = {"coarse spaces": 1 / 3, "discretisations": 1 / 6, "hessians": 1 / 6, "multigrids": 1 / 3}

_BUDGET = [DEFAULT_BYTES]


def budget_bytes() -> int:
    """This process's budget for kept set-up, in bytes."""
    return _BUDGET[0]


def set_budget_bytes(nbytes: int) -> None:
    """Set this process's budget (bytes > 0); the caches trim to their new shares the next time they keep something."""
    if nbytes <= 0:
        raise ValueError(f"a cache budget must be > 0 bytes, got {nbytes}")
    _BUDGET[0] = int(nbytes)


def cache_bytes(cache: str) -> int:
    """The share of the budget of one cache (a key of :data:`SHARES`), in bytes."""
    return int(_BUDGET[0] * SHARES[cache])
