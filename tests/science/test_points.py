"""A field's values at points by the Q1 shape functions (diffnet.grid.points): exact on bilinear and trilinear
fields, differentiable in torch, the same for every leading shape (S = C included), bad points refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from diffnet.grid.points import point_weights, values_at


def _nodes(grid):
    axes = [np.linspace(0.0, 1.0, n) for n in grid]
    return np.meshgrid(*axes, indexing="ij")  # outermost axis first


def test_bilinear_and_trilinear_fields_are_read_exactly():
    rng = np.random.default_rng(0)
    y, x = _nodes((9, 13))
    field = 1.0 + 2.0 * x - 3.0 * y + 5.0 * x * y  # bilinear: in the Q1 space on any grid
    points = np.concatenate([rng.uniform(0, 1, (50, 2)), [[0, 0], [1, 1], [1, 0], [0.5, 1.0]]])
    px, py = points[:, 0], points[:, 1]
    np.testing.assert_allclose(values_at(field, (9, 13), points), 1 + 2 * px - 3 * py + 5 * px * py, atol=1e-13)
    z, y, x = _nodes((5, 6, 7))
    cube = x * y * z - 2.0 * z + 0.5 * x * y
    p = rng.uniform(0, 1, (40, 3))
    np.testing.assert_allclose(values_at(cube, (5, 6, 7), p),
                               p[:, 0] * p[:, 1] * p[:, 2] - 2 * p[:, 2] + 0.5 * p[:, 0] * p[:, 1], atol=1e-13)
    index, weight = point_weights((5, 6, 7), p)
    assert index.shape == weight.shape == (40, 8)
    np.testing.assert_allclose(weight.sum(axis=1), 1.0)
    assert (weight >= 0).all()


def test_leading_axes_are_kept_and_torch_is_differentiable():
    rng = np.random.default_rng(1)
    s = c = 3  # S = C: a mix-up of instances and unknowns would go unnoticed by shape alone
    fields = rng.normal(size=(s, c, 6, 8))
    points = rng.uniform(0, 1, (5, 2))
    out = values_at(fields, (6, 8), points)
    assert out.shape == (s, c, 5)
    for k in range(s):
        for a in range(c):
            np.testing.assert_allclose(out[k, a], values_at(fields[k, a], (6, 8), points), atol=1e-14)
    t = torch.tensor(fields, requires_grad=True)
    got = values_at(t, (6, 8), points)
    np.testing.assert_allclose(got.detach().numpy(), out, atol=1e-14)
    assert torch.autograd.gradcheck(lambda f: values_at(f, (6, 8), points), (t,))


@pytest.mark.parametrize("points, match", [([[0.5, 1.2]], "outside the unit square"), ([[np.nan, 0.1]], "not finite"),
                                           ([[0.1, 0.2, 0.3]], r"\(P, 2\)")])
def test_bad_points_are_refused_in_one_line(points, match):
    with pytest.raises(ValueError, match=match):
        values_at(np.zeros((4, 4)), (4, 4), points)
