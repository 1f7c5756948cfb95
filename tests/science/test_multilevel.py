"""The multilevel output basis (synthesis, its transpose, the U-Net's heads) and Galerkin coarse levels."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from diffnet.generators.galerkin import GalerkinLoss
from diffnet.grid.transfer import interpolation_matrix
from diffnet.generators.multilevel import prolong, restrict, synthesis_adjoint, synthesise
from diffnet.generators.networks import UNet, build_network
from diffnet.families.burgers import BurgersFamily
from diffnet.families.poisson import PoissonFamily
from diffnet.solvers.fem import assemble


@pytest.mark.parametrize("align_corners", [True, False])
@pytest.mark.parametrize("sizes", [((5, 7), (9, 13)), ((8, 8), (16, 16)), ((17, 16), (33, 64)), ((3, 3), (4, 5))])
def test_interpolation_matrices_are_torchs_bilinear_interpolation(align_corners, sizes):
    (a, b) = sizes
    v = torch.randn(2, 3, *a, dtype=torch.float64)
    ay = torch.as_tensor(interpolation_matrix(a[0], b[0], align_corners))
    ax = torch.as_tensor(interpolation_matrix(a[1], b[1], align_corners))
    expected = F.interpolate(v, size=b, mode="bilinear", align_corners=align_corners)
    torch.testing.assert_close(ay @ v @ ax.T, expected, rtol=0, atol=1e-14)
    torch.testing.assert_close(prolong(v, b, align_corners), expected, rtol=0, atol=0)
    np.testing.assert_allclose(interpolation_matrix(a[0], b[0], align_corners).sum(axis=1), 1.0)  # constants kept


@pytest.mark.parametrize("align_corners, shapes", [(True, [(3, 4), (5, 7), (9, 13), (17, 25)]),
                                                   (False, [(2, 2), (4, 4), (8, 8), (16, 16)]),
                                                   (True, [(3, 4, 3), (5, 7, 5), (9, 13, 9)]),  # 3-D: trilinear
                                                   (False, [(2, 2, 2), (4, 4, 4), (8, 8, 8)])])
def test_synthesis_and_its_transpose_are_adjoint(align_corners, shapes):
    """<S c, v> = <c, S^T v> for random level fields c and fine fields v."""
    rng = np.random.default_rng(3)
    for _ in range(3):
        c = [torch.as_tensor(rng.normal(size=(2, 1, *s))) for s in shapes]
        v = torch.as_tensor(rng.normal(size=(2, 1, *shapes[-1])))
        lhs = (synthesise(c, align_corners) * v).sum()
        adj = synthesis_adjoint(v, shapes, align_corners)
        assert [tuple(a.shape[2:]) for a in adj] == [tuple(s) for s in shapes]
        rhs = sum((ck * ak).sum() for ck, ak in zip(c, adj))
        assert lhs.item() == pytest.approx(rhs.item(), rel=1e-12)
    # restrict is the transpose of prolong on its own.
    u = torch.as_tensor(rng.normal(size=(1, 1, *shapes[0])))
    w = torch.as_tensor(rng.normal(size=(1, 1, *shapes[1])))
    assert (prolong(u, shapes[1], align_corners) * w).sum().item() == pytest.approx(
        (u * restrict(w, shapes[0], align_corners)).sum().item(), rel=1e-12)


def test_multilevel_head_at_initialisation_equals_the_nodal_output():
    torch.manual_seed(0)
    nodal = UNet(3, 1, (4, 8, 16))
    torch.nn.init.normal_(nodal.head.weight, std=0.3)  # a trained-looking finest head
    multilevel = UNet(3, 1, (4, 8, 16), output="multilevel")
    missing, unexpected = multilevel.load_state_dict(nodal.state_dict(), strict=False)
    assert not unexpected and sorted(missing) == sorted(f"coarse_heads.{i}.{p}" for i in (0, 1) for p in ("weight", "bias"))
    x = torch.rand(2, 3, 30, 27)  # sides not multiples of 4: padding and cropping as the nodal net does
    assert torch.equal(multilevel(x), nodal(x))  # coarse heads start at zero
    # A coarse head's correction is smooth: one coefficient moves a whole region of the fine field.
    torch.nn.init.normal_(multilevel.coarse_heads[0].weight)
    change = (multilevel(x) - nodal(x))[0, 0].detach()
    assert change.abs().max() > 0
    assert (change.diff(dim=1).abs().max() / change.abs().max()) < 0.5


def test_multilevel_generator_is_built_from_the_config_key():
    stack = build_network("unet", 3, (4, 8), levels=(8, 16), top_channels=4, output="multilevel")
    assert stack.base.output == "multilevel" and len(stack.base.coarse_heads) == 1
    assert stack(torch.rand(1, 3, 16, 16)).shape == (1, 1, 16, 16)
    with pytest.raises(ValueError, match="unknown output"):
        UNet(3, 1, (4,), output="modal")


def test_galerkin_coarse_loss_is_the_fine_energy_of_the_prolonged_field():
    """The Galerkin level's Poisson loss of a coarse field u_H is the fine energy 1/2 (P u_H)^T K_h (P u_H)
    (K_h assembled by scipy.sparse, P the Kronecker product of the 1-D interpolations), over the lift's."""
    coarse, fine = PoissonFamily((9, 9)), PoissonFamily((17, 17))
    level = GalerkinLoss(coarse, fine)
    assert level.inputs(torch.zeros(1, 6)).shape == (1, 3, 9, 9) and level.resolution == (17, 17)
    rng = np.random.default_rng(5)
    a = torch.as_tensor(rng.uniform(-3, 3, size=(2, 6)))
    raw = torch.as_tensor(rng.normal(size=(2, 1, 9, 9)))
    raw[..., [0, -1]] = 0.0  # the Dirichlet columns carry no correction, on either grid
    loss = level.loss_terms(level.field(raw, a), a)["energy"].numpy()
    u_coarse = coarse.field(raw, a).numpy()
    P = np.kron(interpolation_matrix(9, 17, True), interpolation_matrix(9, 17, True))
    lift = 1.0 - np.linspace(0, 1, 17)[None, :].repeat(17, 0).ravel()
    for k in range(2):
        K, _ = assemble(fine.diffusivity_numpy(a[k : k + 1].numpy())[0], fine.spacing)
        u = P @ u_coarse[k].ravel()
        assert loss[k] == pytest.approx((u @ K @ u) / (lift @ K @ lift), rel=1e-10)


def test_galerkin_level_imposes_the_fine_boundary_conditions():
    """Burgers: the prolonged field still has the fine grid's exact initial row and inflow column."""
    coarse, fine = BurgersFamily((9, 9)), BurgersFamily((17, 17))
    level = GalerkinLoss(coarse, fine)
    c = torch.tensor([3.5], dtype=torch.float64)
    u = level.field(torch.randn(1, 1, 9, 9, dtype=torch.float64), c)
    assert u.shape == (1, 17, 17)
    x = torch.linspace(0, 1, 17, dtype=torch.float64)
    torch.testing.assert_close(u[0, 0], 0.5 * (1 - torch.cos(2 * torch.pi * 3.5 * x)))
    assert torch.all(u[0, :, 0] == 0)
    assert set(level.loss_terms(u, c)) == set(fine.loss_terms(u, c))
