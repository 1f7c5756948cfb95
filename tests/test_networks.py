"""The U-Net generator: activation checkpointing changes memory, not results."""

import pytest
import torch

from diffnet.networks import UNet
from diffnet.problems.burgers import BurgersProblem
from diffnet.problems.poisson import PoissonProblem


def _pair(in_channels: int, channels: tuple[int, ...]) -> tuple[UNet, UNet]:
    torch.manual_seed(0)
    plain = UNet(in_channels, 1, channels)
    # A non-zero head, so gradients reach every layer.
    torch.nn.init.normal_(plain.head.weight, std=0.1)
    ckpt = UNet(in_channels, 1, channels, checkpoint_activations=True)
    ckpt.load_state_dict(plain.state_dict())
    return plain, ckpt


def _loss_and_grads(model, problem, params):
    model.zero_grad(set_to_none=True)
    u = problem.field(model(problem.inputs(params)), params)
    loss = sum(t.mean() for t in problem.loss_terms(u, params).values())
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("problem, params", [
    (PoissonProblem((37, 45)), torch.rand(3, 6) * 6 - 3),  # sides not multiples of 8: padded and cropped
    (BurgersProblem((33, 33), viscosity=0.01), torch.tensor([3.3, 4.1, 5.9])),
], ids=["poisson", "burgers"])
def test_checkpointed_gradients_equal_plain(problem, params):
    plain, ckpt = _pair(problem.in_channels, (8, 16, 32, 32))
    loss_p, grads_p = _loss_and_grads(plain, problem, params)
    loss_c, grads_c = _loss_and_grads(ckpt, problem, params)
    assert torch.equal(loss_p, loss_c)  # the recomputed forward is the same forward
    assert grads_p.keys() == grads_c.keys()
    for name, g in grads_p.items():
        assert g.abs().max() > 0, name
        # Float32 summation order is the only allowed difference.
        torch.testing.assert_close(grads_c[name], g, rtol=1e-5, atol=1e-6 * g.abs().max().item(), msg=name)


def test_checkpointing_only_in_training_with_grad():
    plain, ckpt = _pair(3, (8, 16))
    x = torch.rand(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(plain(x), ckpt(x))
    ckpt.eval()
    assert torch.equal(plain.eval()(x), ckpt(x).detach())
