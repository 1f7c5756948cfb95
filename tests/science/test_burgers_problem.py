"""The Burgers family: exact IC/BC construction and the Sobel residual's behaviour."""

import numpy as np
import pytest
import torch

from diffnet.discretisation.finite_difference import central_residual as residual
from diffnet.families.burgers import BurgersFamily, initial_condition


def test_exact_construction_imposes_ic_and_bc():
    p = BurgersFamily((12, 17))
    c = torch.tensor([3.3, 5.9], dtype=torch.float64)
    raw = torch.randn(2, 1, 12, 17, dtype=torch.float64)
    u = p.field(raw, c)
    x = torch.linspace(0, 1, 17, dtype=torch.float64)
    assert torch.allclose(u[:, 0], initial_condition(x, c))
    assert torch.allclose(u[:, :, 0], torch.zeros(2, 12, dtype=torch.float64))


def test_residual_has_one_equation_per_unknown():
    u = torch.rand(3, 10, 14, dtype=torch.float64)
    r = residual(u, 0.1, 0.1, 0.01)
    assert r.shape == (3, 9, 13)
    # Every unknown node influences the residual (no free row or column).
    u.requires_grad_(True)
    g = torch.autograd.grad(residual(u, 0.1, 0.1, 0.01).pow(2).sum(), u)[0]
    assert (g[:, 1:, 1:].abs() > 0).all()


@pytest.mark.parametrize("kind", ["sobel", "scharr"])
def test_reference_residual_small_compared_with_perturbed(kind):
    p = BurgersFamily((64, 64), viscosity=0.01, stencil=kind)
    c = np.array([3.3, 5.5])
    ref = torch.as_tensor(p.reference(c))
    ct = torch.as_tensor(c)
    r_ref = p.loss_terms(ref, ct)["residual"]
    gen = torch.Generator().manual_seed(0)
    noise = 0.05 * torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    noise[:, 0] = 0
    noise[:, :, 0] = 0
    r_pert = p.loss_terms(ref + noise, ct)["residual"]
    assert (r_pert > 20 * r_ref).all(), (r_ref, r_pert)
    # A smooth, physically wrong field (the IC frozen in time) is far worse too.
    frozen = ref[:, :1].expand_as(ref).clone()
    assert (p.loss_terms(frozen, ct)["residual"] > 20 * r_ref).all()


def test_penalty_term_vanishes_on_exact_boundaries():
    p = BurgersFamily((16, 16), boundary="penalty", penalty=10.0)
    c = torch.tensor([4.0], dtype=torch.float64)
    u = BurgersFamily((16, 16)).field(torch.randn(1, 1, 16, 16, dtype=torch.float64), c)
    assert p.loss_terms(u, c)["boundary"].item() == pytest.approx(0.0, abs=1e-20)
    assert p.loss_terms(u + 0.1, c)["boundary"].item() > 0.01


def test_sampling_modes():
    # Through the family (c_range [3, 6]): its box by the one sampler, and its own "list".
    family = BurgersFamily((9, 9), c_range=(3.0, 6.0), c_values=(3.5, 4.5))
    np.testing.assert_allclose(family.sample(4, "uniform", 0), [3, 4, 5, 6])
    r = family.sample(100, "random", 1)
    assert r.min() >= 3 and r.max() <= 6 and len(np.unique(r)) == 100
    s = family.sample(64, "sobol", 2)
    assert s.min() >= 3 and s.max() <= 6
    np.testing.assert_array_equal(family.sample(2, "list", 0), [3.5, 4.5])
    with pytest.raises(ValueError):
        family.sample(4, "grid", 0)


def test_unet_any_widths_and_odd_sizes():
    from diffnet.generators.networks import UNet

    for channels in [(12, 20), (7,), (8, 16, 36)]:
        net = UNet(3, 1, channels)
        out = net(torch.randn(2, 3, 13, 22))
        assert out.shape == (2, 1, 13, 22)
