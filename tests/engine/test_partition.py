"""Which samples each rank computes: disjoint, covering, independent of P (no MPI needed)."""

import numpy as np
import pytest

from deepfusion.parallel.partition import epoch_permutation, global_batch, local_batch_size, local_indices, steps_per_epoch


@pytest.mark.parametrize("n, b", [(64, 16), (40, 8), (17, 4)])
def test_batches_cover_epoch_without_repeats(n, b):
    for epoch in range(3):
        seen = np.concatenate([global_batch(5, epoch, k, n, b) for k in range(steps_per_epoch(n, b))])
        assert len(seen) == len(set(seen.tolist())) == steps_per_epoch(n, b) * b
        assert set(seen.tolist()) <= set(range(n))


@pytest.mark.parametrize("P", [1, 2, 3, 4, 8])
def test_ranks_disjoint_and_cover_global_batch(P):
    n, b = 64, 16
    for epoch in range(2):
        for k in range(steps_per_epoch(n, b)):
            parts = [local_indices(1, epoch, k, r, P, n, b) for r in range(P)]
            assert all(len(p) == local_batch_size(b, P) == b // P for p in parts)
            joined = np.concatenate(parts)
            assert len(set(joined.tolist())) == len(joined)  # disjoint
            # Contiguous slices of the same global batch, whatever P is.
            np.testing.assert_array_equal(joined, global_batch(1, epoch, k, n, b)[: (b // P) * P])


def test_global_batches_independent_of_p_and_vary_by_epoch():
    a = [global_batch(3, 0, k, 32, 8) for k in range(4)]
    for P in (1, 2, 4):
        b = [np.concatenate([local_indices(3, 0, k, r, P, 32, 8) for r in range(P)]) for k in range(4)]
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    assert not np.array_equal(epoch_permutation(3, 0, 32), epoch_permutation(3, 1, 32))
    assert not np.array_equal(epoch_permutation(3, 0, 32), epoch_permutation(4, 0, 32))


def test_step_out_of_range():
    with pytest.raises(ValueError):
        global_batch(0, 0, 4, 32, 8)

