"""Per-instance node data against fields of C unknowns (diffnet.grid.nodal): every unknown of instance k gets
instance k's values, for C = 1, 2, 3 and, the case numpy's trailing-axis broadcasting hides, S = C."""

import numpy as np
import pytest

from diffnet.grid.nodal import inside_only, node_data, over_unknowns


def _holes(s: int, grid=(7, 9)) -> np.ndarray:
    """Signed distances of S instances, instance k's hole a different column band (> 0 inside the hole)."""
    x = np.arange(grid[1])
    return np.stack([np.broadcast_to(np.where(np.abs(x - 2 - 2 * k) <= 0, 1.0, -1.0), grid) for k in range(s)])


@pytest.mark.parametrize("c", [1, 2, 3])
def test_each_instance_masks_every_unknown_of_its_own_with_its_own_hole(c):
    s = c  # S = C: a (S, *grid) mask broadcast by numpy alone would pair instance k's mask with unknown k
    sdf = _holes(s)
    fields = np.random.default_rng(c).uniform(1.0, 2.0, (s, c, *sdf.shape[1:]))
    masked = inside_only(fields, sdf)
    for k in range(s):
        for j in range(c):
            np.testing.assert_array_equal(masked[k, j][sdf[k] > 0], 0.0)
            np.testing.assert_array_equal(masked[k, j][sdf[k] <= 0], fields[k, j][sdf[k] <= 0])
    one = inside_only(fields[:, 0], sdf)  # one unknown: fields (S, *grid)
    np.testing.assert_array_equal(one, masked[:, 0])


def test_node_data_takes_one_channel_and_refuses_per_unknown_shapes():
    sdf = _holes(2)
    np.testing.assert_array_equal(node_data(sdf[:, None], 2, sdf.shape[1:]), sdf)  # (S, 1, *grid) is (S, *grid)
    with pytest.raises(ValueError, match=r"^fam.domain\(params\) returned shape \[2, 2, 7, 9\] for 2 instances; it "
                                         r"must be one value per instance and node, \[2, 7, 9\], whatever the number"):
        node_data(np.stack([sdf, sdf], axis=1), 2, sdf.shape[1:], "fam.domain(params)")


def test_fields_of_another_grid_or_count_are_refused():
    sdf = _holes(2)
    with pytest.raises(ValueError, match="does not match fields"):
        over_unknowns(sdf, np.zeros((3, 2, 7, 9)))
    with pytest.raises(ValueError, match="does not match fields"):
        over_unknowns(sdf, np.zeros((2, 2, 7, 8)))
    with pytest.raises(ValueError, match="does not match fields"):
        over_unknowns(sdf, np.zeros((2, 2, 2, 7, 9)))
