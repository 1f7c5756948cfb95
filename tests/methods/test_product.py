"""The product built in one place (diffnet/product/product.py): set up once from a family, a generator and what finishes
its field, applied, stating its chain; its fields are the steps composed by hand (S = C = 2), a two-stage generator's
first stage alone, its gradients exact only where every step has them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from diffnet.families.burgers import BurgersFamily
from diffnet.families.elasticity import ElasticityFamily
from diffnet.families.poisson import PoissonFamily
from diffnet.generators.networks import UNet, build_network
from diffnet.generators.two_stage import SecondNetwork, TwoStage
from diffnet.multigrid.coarse import coarse_correction
from diffnet.product.product import Finish, Product, first_network


def _network(family, seed=0, extra=0):
    torch.manual_seed(seed)
    return UNet(family.in_channels + extra, len(family.unknowns), (4, 8)).double()


def test_the_chain_says_each_step_once_in_order():
    family = PoissonFamily((9, 9))
    network = _network(family)
    assert Product(family, network).chain() == "U-Net" and Product(family, network).name() == "DiffNet"
    full = Product(family, network, Finish(coarse=5, sweeps=2, cycles=3, polish=1))
    assert full.steps() == ["U-Net", "coarse correction on 5x5 (one kept solve)",
                            "2 symmetric Gauss-Seidel sweeps, 3 times", "1 V-cycle"]
    assert full.chain() == " -> ".join(full.steps()) and full.name() == "DiffNet + coarse correction, 2 sweeps x3, 1 V-cycle"
    assert repr(full) == f"Product(poisson [9, 9]: {full.chain()})"
    burgers = BurgersFamily((9, 9), stencil="conservative")
    residual = Product(burgers, _network(burgers), Finish(coarse=5, sweeps=1))
    assert residual.steps()[1:] == ["coarse correction on 5x5 (Gauss-Newton)", "1 symmetric Gauss-Seidel sweep on J^T J"]
    stacked = build_network("unet", family.in_channels, (4, 8), levels=(5, 9))
    assert Product(family, stacked).chain() == "U-Net deepened by 1 level"
    two = TwoStage(network, SecondNetwork(_network(family, 1, extra=1), 1), cycles=2)
    assert Product(family, two).chain() == ("U-Net, then a second U-Net fed its preconditioned residual B g "
                                            "(2 V-cycles)")
    with pytest.raises(ValueError, match="sweeps and cycles follow a coarse correction"):
        Finish(sweeps=2)
    with pytest.raises(ValueError, match="declares no polish step"):
        Product(BurgersFamily((9, 9)), network, Finish(polish=1))


def test_its_fields_are_the_network_then_its_steps_composed_by_hand():
    family = ElasticityFamily(resolution=(9, 9))  # two unknowns and two instances: S = C
    network = _network(family)
    params = family.sample(2, "sobol", 0)
    p = torch.as_tensor(params)
    product = Product(family, network, Finish(coarse=5, sweeps=2, cycles=2))
    with torch.no_grad():
        u = family.field(network(family.inputs(p)), p)
    for _ in range(2):
        u = coarse_correction(family, u, p, 5, quadratic=True, sweeps=2)
    np.testing.assert_allclose(product.fields(params), u.numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(product.fields(params, batch=1), u.numpy(), rtol=0, atol=1e-12)  # batches do not mix
    # Differentiable in the instances, the same fields; exact where every step is (a quadratic energy's are).
    assert product.exact_parameter_gradients and product.why_no_exact_gradients() == ""
    np.testing.assert_allclose(product.differentiable(p.clone()).detach().numpy(), u.numpy(), rtol=0, atol=1e-12)
    assert not Product(family, network, Finish(coarse=5, polish=1)).exact_parameter_gradients


def test_a_two_stage_products_first_stage_and_a_polished_ones_start():
    family = PoissonFamily((9, 9))
    first = _network(family)
    two = TwoStage(first, SecondNetwork(_network(family, 1, extra=1), 1))
    torch.nn.init.normal_(two.second.net.head.weight, std=0.1)  # a fresh U-Net's head starts at zero
    params = family.sample(2, "sobol", 0)
    product = Product(family, two, Finish(coarse=5))
    alone = product.first_stage()
    assert first_network(two) is first and alone.model is first and Product(family, first).first_stage() is None
    np.testing.assert_array_equal(alone.fields(params), Product(family, first, Finish(coarse=5)).fields(params))
    assert not np.allclose(product.fields(params), alone.fields(params))  # the second network adds its part
    polished = Product(family, first, Finish(coarse=5, polish=2))
    start = polished.without_polish()
    assert start.chain() == "U-Net -> coarse correction on 5x5 (one kept solve)"
    np.testing.assert_allclose(polished.fields(params), family.polish(params, start.fields(params), 2), rtol=0,
                               atol=1e-12)
