"""The scaled Sobel/Scharr kernels differentiate low-order polynomials exactly."""

import numpy as np
import pytest
import torch

from diffnet.discretisation.finite_difference import apply_kernels, derivative_kernels, pad_extrapolate


def _grid(nt=9, nx=11, T=0.7):
    t = torch.linspace(0, T, nt, dtype=torch.float64)
    x = torch.linspace(0, 1, nx, dtype=torch.float64)
    return t[:, None].expand(nt, nx), x[None, :].expand(nt, nx), T / (nt - 1), 1.0 / (nx - 1)


@pytest.mark.parametrize("kind", ["sobel", "scharr"])
def test_linear_field_exact(kind):
    tt, xx, dt, dx = _grid()
    u = (1.5 + 2.0 * tt - 3.0 * xx)[None]
    d = apply_kernels(u, derivative_kernels(kind, dt, dx))[0]
    assert torch.allclose(d[0], torch.full_like(tt, 2.0), atol=1e-10)
    assert torch.allclose(d[1], torch.full_like(tt, -3.0), atol=1e-10)
    assert torch.allclose(d[2], torch.zeros_like(tt), atol=1e-8)


@pytest.mark.parametrize("kind", ["sobel", "scharr"])
def test_quadratic_field_exact_interior_and_edges(kind):
    tt, xx, dt, dx = _grid()
    u = (0.3 + tt - xx + 0.8 * tt**2 + 1.7 * xx**2 - 2.2 * tt * xx)[None]
    d = apply_kernels(u, derivative_kernels(kind, dt, dx))[0]
    u_t = 1 + 1.6 * tt - 2.2 * xx
    u_x = -1 + 3.4 * xx - 2.2 * tt
    # Interior nodes: the plain 3x3 stencils.
    assert torch.allclose(d[0, 1:-1, 1:-1], u_t[1:-1, 1:-1], atol=1e-9)
    assert torch.allclose(d[1, 1:-1, 1:-1], u_x[1:-1, 1:-1], atol=1e-9)
    assert torch.allclose(d[2, 1:-1, 1:-1], torch.full_like(u_x[1:-1, 1:-1], 3.4), atol=1e-7)
    # Edges: quadratic extrapolation makes the one-sided closure exact for quadratics too.
    assert torch.allclose(d[0], u_t, atol=1e-9)
    assert torch.allclose(d[1], u_x, atol=1e-9)
    assert torch.allclose(d[2], torch.full_like(u_x, 3.4), atol=1e-7)


def test_kernel_normalisation_matches_formula():
    k = derivative_kernels("scharr", 0.5, 0.25)
    w1, w2 = 3.0, 10.0
    expected_x = np.outer([w1, w2, w1], [-1, 0, 1]) / (2 * 0.25 * (2 * w1 + w2))
    np.testing.assert_allclose(k[1, 0].numpy(), expected_x)
    np.testing.assert_allclose(k[0, 0].numpy(), np.outer([-1, 0, 1], [w1, w2, w1]) / (2 * 0.5 * (2 * w1 + w2)))


def test_last_row_is_backward_difference():
    # With the quadratic ghost, the central difference on the last row equals the
    # second-order backward difference (3 u_n - 4 u_{n-1} + u_{n-2}) / (2 dt).
    u = torch.randn(1, 6, 5, dtype=torch.float64)
    p = pad_extrapolate(u)[0]
    central = (p[-1] - p[-3]) / 2.0
    backward = (3 * u[0, -1] - 4 * u[0, -2] + u[0, -3]) / 2.0
    assert torch.allclose(central[1:-1], backward, atol=1e-12)


def test_unknown_stencil_and_tiny_grid_refused():
    with pytest.raises(ValueError, match="unknown stencil"):
        derivative_kernels("prewitt", 1.0, 1.0)
    with pytest.raises(ValueError, match="3x3"):
        pad_extrapolate(torch.zeros(1, 2, 5))


def test_every_built_in_familys_own_hessian_is_symmetric_as_written():
    # The V-cycle symmetrises a probed Hessian only (diffnet.multigrid.stencil.on_free_nodes): a family's own is exact.
    import torch

    from diffnet.multigrid.hessian import block_hessian
    from diffnet.multigrid.stencil import on_free_nodes
    from diffnet.families.elasticity import ElasticityFamily, Elasticity3DFamily
    from diffnet.families.poisson import PoissonFamily
    from diffnet.families.poisson3d import Poisson3DFamily
    from diffnet.families.reaction_diffusion import ReactionDiffusionFamily

    for family in (PoissonFamily((17, 17)), Poisson3DFamily((9, 9, 9)), ReactionDiffusionFamily((17, 17)),
                   ElasticityFamily((13, 13)), Elasticity3DFamily((7, 7, 7))):
        p = torch.as_tensor(family.sample(2, "random", 1))
        u = family.field(torch.zeros(2, len(family.unknowns), *family.resolution, dtype=torch.float64), p)
        hessian, free = block_hessian(family, u, p)
        assert torch.equal(on_free_nodes(hessian, free), on_free_nodes(hessian, free, symmetrise=False)), family.name
