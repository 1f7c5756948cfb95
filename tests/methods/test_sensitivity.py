"""The product's exact gradient in the instances' parameters (diffnet/multigrid/sensitivity.py): through the coarse
correction and the sweeps by the implicit function theorem, checked against central differences for every
differentiable built-in family that takes the correction. Through a trained run's whole product
(``Surrogate.evaluate``, ``Surrogate.jacobian``): tests/methods/test_coarse.py, on its corrected run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from diffnet.product.corrected import CoarseCorrected
from diffnet.multigrid.sweeps import Sweeps, prepared, sweep_sensitivity, sweeps
from diffnet.multigrid.coarse import CoarseSpace
from diffnet.multigrid.stencil import as_blocks
from diffnet.families.elasticity import ElasticityFamily, Elasticity3DFamily
from diffnet.families.groundwater import GroundwaterFamily
from diffnet.families.hyperelasticity import HyperelasticityFamily
from diffnet.families.poisson import PoissonFamily
from diffnet.families.poisson3d import Poisson3DFamily
from diffnet.families.reaction_diffusion import ReactionDiffusionFamily
from diffnet.families.torsion import StarTorsionFamily


def _instances(family, n, seed=3):
    return torch.as_tensor(family.sample(n, "random", seed), dtype=torch.float64)


def _product(family, nodes, sweeps, quadratic=True, scale=1.0, cycles=1):
    """p -> a weighted sum of the corrected, smoothed field of a fixed raw output: every stage after the network."""
    raw = scale * torch.randn(2, len(family.unknowns), *family.resolution, dtype=torch.float64,
                      generator=torch.Generator().manual_seed(1))
    weights = torch.randn(2, *family.field(raw, _instances(family, 2)).shape[1:], dtype=torch.float64,
                          generator=torch.Generator().manual_seed(2))
    corrected = CoarseCorrected(family, family, nodes, quadratic=quadratic, sweeps=sweeps, cycles=cycles)
    return lambda p: (corrected.field(raw, p) * weights).sum()


def _agrees_with_central_differences(f, p: torch.Tensor, grad: torch.Tensor, h: float = 1e-6, tol: float = 1e-6):
    """<grad, d> against (f(p + h d) - f(p - h d)) / 2h along two random directions d (every entry moves)."""
    for seed in (5, 6):
        d = torch.randn(p.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        expected = float((f(p + h * d) - f(p - h * d)) / (2 * h))
        assert abs(float((grad * d).sum()) - expected) <= tol * abs(expected), (float((grad * d).sum()), expected)


@pytest.mark.parametrize("family, nodes", [
    (PoissonFamily((14, 14)), 5),  # 13 intervals on 4: grids that do not nest
    (GroundwaterFamily((13, 13)), 4),  # the wells' rates move the load b(p), not the operator
    (Poisson3DFamily((5, 5, 5)), 3),
    (ReactionDiffusionFamily((11, 11)), 5),
    (ElasticityFamily((11, 10)), 4),  # two unknowns: the block Hessian and 2x2 diagonal blocks in the sweeps
    (Elasticity3DFamily((5, 5, 5)), 3),
], ids=["poisson", "groundwater", "poisson3d", "reaction_diffusion", "elasticity", "elasticity3d"])
def test_the_gradient_through_the_correction_and_the_sweeps_is_the_central_differences(family, nodes):
    assert family.has("differentiable")
    f = _product(family, nodes, sweeps=2)
    p = _instances(family, 2).requires_grad_(True)
    (grad,) = torch.autograd.grad(f(p), p)
    _agrees_with_central_differences(f, p.detach(), grad)


def test_the_gradient_through_repeated_cycles_is_the_central_differences():
    """model.cycles: the correction and its sweeps composed three times, each cycle's implicit-function terms at its
    own fields (the two-unknown family, S = C = 2)."""
    family = ElasticityFamily((11, 10))
    f = _product(family, 4, sweeps=2, cycles=3)
    p = _instances(family, 2).requires_grad_(True)
    (grad,) = torch.autograd.grad(f(p), p)
    _agrees_with_central_differences(f, p.detach(), grad)


def test_a_nonlinear_energys_minimiser_has_its_exact_gradient_and_refuses_sweeps():
    family = HyperelasticityFamily((7, 7))
    f = _product(family, 3, sweeps=0, quadratic=False, scale=1e-3)
    p = _instances(family, 2).requires_grad_(True)
    (grad,) = torch.autograd.grad(f(p), p)
    _agrees_with_central_differences(f, p.detach(), grad, h=1e-5, tol=1e-5)
    with pytest.raises(NotImplementedError, match="sweeps = 0"):
        _product(family, 3, sweeps=1, quadratic=False, scale=1e-3)(p)


def test_the_colour_steps_pull_back_as_the_sweeps_backward_pass():
    # sweep_sensitivity replays the sweeps step by step in torch; its pull-back must be Sweeps' (M^T)^k g.
    family = ElasticityFamily((9, 8))
    p = _instances(family, 2)
    u = family.field(torch.randn(2, 2, 9, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(4)), p)
    space = CoarseSpace.build(family, u, p, 4)
    v, g = as_blocks(u, True), torch.randn_like(as_blocks(u, True))
    back, states, directions = sweep_sensitivity(space.hessian, space.free, space.load, v, 3, g)
    operator = prepared(space.hessian, space.free)
    forward = sweeps(space.hessian, space.free, space.load, v, 3, operator)
    assert float((states[-1] - forward).abs().max()) <= 1e-12 * float(forward.abs().max())  # the same colours, order
    ctx = type("Ctx", (), {"operator": (space.hessian, space.free, operator), "count": 3, "vector": True,
                           "clock": __import__("diffnet.backend.clock", fromlist=["PartClock"]).PartClock(),
                           "instances": None, "needs_input_grad": (True, False, False)})()
    expected = Sweeps.backward(ctx, g)[0]
    assert float((back - expected).abs().max()) <= 1e-11 * float(expected.abs().max())
    assert len(states) == len(directions) == 3 * 2 * 4


def test_a_family_without_the_capability_does_not_declare_it():
    # A cut domain's geometry reaches its loss through numpy: its gradient there would be silently zero.
    assert not StarTorsionFamily((12, 12)).has("differentiable")


def test_newtons_polish_of_a_nonlinear_energy_has_the_adjoint_gradient_of_its_minimiser():
    """The Neo-Hookean product ending in Newton steps (after the coarse minimiser and sweeps, which have no exact
    gradient themselves): its gradient in the instances is the minimiser's adjoint (one Cholesky of the tangent at the
    polished field), checked against central differences of the whole product (S = C = 2); a quadratic energy's
    polish (V-cycles) still has none."""
    from diffnet.generators.networks import UNet
    from diffnet.product.product import Finish, Product

    family = HyperelasticityFamily((9, 9))
    torch.manual_seed(0)
    network = UNet(family.in_channels, 2, (4, 8)).double()
    product = Product(family, network, Finish(coarse=5, sweeps=2, polish=4))
    assert product.exact_parameter_gradients and product.why_no_exact_gradients() == ""
    assert product.chain().endswith("-> 4 Cholesky Newton steps")
    weights = torch.randn(2, 2, 9, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    f = lambda p: (product.differentiable(p) * weights).sum()  # noqa: E731
    p = _instances(family, 2).requires_grad_(True)
    np.testing.assert_allclose(product.differentiable(p).detach().numpy(), product.fields(p.detach().numpy()),
                               rtol=0, atol=1e-12)
    (grad,) = torch.autograd.grad(f(p), p)
    with torch.no_grad():
        _agrees_with_central_differences(f, p.detach(), grad, h=1e-5, tol=1e-5)
    poisson = PoissonFamily((9, 9))
    assert not Product(poisson, UNet(poisson.in_channels, 1, (4, 8)).double(),
                       Finish(coarse=5, polish=1)).exact_parameter_gradients
