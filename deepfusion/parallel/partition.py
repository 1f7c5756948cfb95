"""Pure functions deciding which global samples each rank computes at each step."""

from __future__ import annotations

import numpy as np

__all__ = ["steps_per_epoch", "epoch_permutation", "global_batch", "local_batch_size", "local_indices"]


def steps_per_epoch(n_samples: int, batch_size: int) -> int:
    """Full global batches per epoch; the remainder of the permutation is not used that epoch."""
    return n_samples // batch_size


def epoch_permutation(seed: int, epoch: int, n_samples: int) -> np.ndarray:
    """The order of the training samples in ``epoch``, the same on every rank and for any P."""
    return np.random.default_rng([seed, epoch]).permutation(n_samples)


def global_batch(seed: int, epoch: int, step: int, n_samples: int, batch_size: int) -> np.ndarray:
    """Indices of the global batch ``step`` (0-based within the epoch)."""
    if not 0 <= step < steps_per_epoch(n_samples, batch_size):
        raise ValueError(f"step {step} outside 0..{steps_per_epoch(n_samples, batch_size) - 1}")
    perm = epoch_permutation(seed, epoch, n_samples)
    return perm[step * batch_size : (step + 1) * batch_size]


def local_batch_size(batch_size: int, size: int) -> int:
    """floor(b / P): the samples each rank computes per step."""
    return batch_size // size


def local_indices(
    seed: int, epoch: int, step: int, rank: int, size: int, n_samples: int, batch_size: int
) -> np.ndarray:
    """The contiguous slice of the global batch that ``rank`` of ``size`` computes.

    When P does not divide b the last b mod P samples of each global batch are dropped,
    so the effective global batch is P * floor(b / P).
    """
    b_loc = local_batch_size(batch_size, size)
    batch = global_batch(seed, epoch, step, n_samples, batch_size)
    return batch[rank * b_loc : (rank + 1) * b_loc]
