"""The U-Net generator and the multilevel stack: activation checkpointing changes memory, not
results; a deepened level starts from the coarser level's solution; the channels-last layout they run in
(diffnet/backend/layout.py) changes no result."""

import pytest
import torch
import torch.nn.functional as F

from diffnet.generators.networks import LevelStack, UNet, build_network
from diffnet.families.burgers import BurgersFamily
from diffnet.families.poisson import PoissonFamily


def _pair(in_channels: int, channels: tuple[int, ...]) -> tuple[UNet, UNet]:
    torch.manual_seed(0)
    plain = UNet(in_channels, 1, channels)
    # A non-zero head, so gradients reach every layer.
    torch.nn.init.normal_(plain.head.weight, std=0.1)
    ckpt = UNet(in_channels, 1, channels, checkpoint_activations=True)
    ckpt.load_state_dict(plain.state_dict())
    return plain, ckpt


def _loss_and_grads(model, problem, params):
    # In float64: the claim is that recomputation is the same computation, so it is held to
    # float64 rounding (1e-12 of the largest entry), not to a float32 bound.
    model = model.double()
    params = params.double()
    model.zero_grad(set_to_none=True)
    u = problem.field(model(problem.inputs(params)), params)
    loss = sum(t.mean() for t in problem.loss_terms(u, params).values())
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("problem, params", [
    (PoissonFamily((37, 45)), torch.rand(3, 6) * 6 - 3),  # sides not multiples of 8: padded and cropped
    (BurgersFamily((33, 33), viscosity=0.01), torch.tensor([3.3, 4.1, 5.9])),
], ids=["poisson", "burgers"])
def test_checkpointed_gradients_equal_plain(problem, params):
    plain, ckpt = _pair(problem.in_channels, (8, 16, 32, 32))
    loss_p, grads_p = _loss_and_grads(plain, problem, params)
    loss_c, grads_c = _loss_and_grads(ckpt, problem, params)
    assert torch.equal(loss_p, loss_c)  # the recomputed forward is the same forward
    assert grads_p.keys() == grads_c.keys()
    for name, g in grads_p.items():
        assert g.abs().max() > 0, name
        torch.testing.assert_close(grads_c[name], g, rtol=0, atol=1e-12 * g.abs().max().item(), msg=name)


def test_checkpointing_only_in_training_with_grad():
    plain, ckpt = _pair(3, (8, 16))
    x = torch.rand(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(plain(x), ckpt(x))
    ckpt.eval()
    assert torch.equal(plain.eval()(x), ckpt(x).detach())


def _stack(checkpoint_activations=False):
    torch.manual_seed(1)
    stack = build_network("unet", 3, (8, 16), checkpoint_activations, levels=(12, 24, 48), top_channels=8)
    for head in [stack.base.head, *(top.head for top in stack.tops)]:
        torch.nn.init.normal_(head.weight, std=0.1)  # non-zero, so every level contributes
    return stack


def test_level_views_share_the_stacks_parameters():
    stack = _stack()
    assert isinstance(stack, LevelStack) and len(stack.tops) == 2
    names = dict(stack.named_parameters())
    for k in range(3):
        view = stack.level(k)
        for name, p in view.named_parameters():
            assert p is names[name], name  # the same tensors: training a level trains the stack
        assert len(list(view.parameters())) == len([n for n in names if n.startswith("base.")
                                                    or any(n.startswith(f"tops.{j}.") for j in range(k))])
    x = torch.rand(2, 3, 48, 48)
    assert torch.equal(stack.level(2)(x), stack(x))
    assert stack.level(0)(torch.rand(2, 3, 12, 12)).shape == (2, 1, 12, 12)


def test_a_new_level_starts_as_the_prolonged_coarse_solution():
    stack = _stack().double()  # float64: the claim is an identity
    torch.nn.init.zeros_(stack.tops[1].head.weight)
    torch.nn.init.zeros_(stack.tops[1].head.bias)  # as built: a fresh level adds no correction
    x = torch.rand(2, 3, 48, 48, dtype=torch.float64)
    coarse = F.interpolate(x, size=(24, 24), mode="bilinear", align_corners=True)
    prolonged = F.interpolate(stack.level(1)(coarse), size=(48, 48), mode="bilinear", align_corners=True)
    torch.testing.assert_close(stack(x), prolonged, rtol=0, atol=1e-12)
    # Grids other than the trained ones are resampled by the same ratios.
    assert stack(torch.rand(1, 3, 40, 40, dtype=torch.float64)).shape == (1, 1, 40, 40)


def test_stack_checkpointing_gives_the_plain_gradients():
    problem, params = PoissonFamily((48, 48)), torch.rand(2, 6) * 6 - 3
    plain, ckpt = _stack(), _stack(checkpoint_activations=True)
    loss_p, grads_p = _loss_and_grads(plain, problem, params)
    loss_c, grads_c = _loss_and_grads(ckpt, problem, params)
    assert torch.equal(loss_p, loss_c)
    for name, g in grads_p.items():
        assert g.abs().max() > 0, name
        torch.testing.assert_close(grads_c[name], g, rtol=0, atol=1e-12 * g.abs().max().item(), msg=name)


@pytest.mark.parametrize("dims", [2, 3])
def test_the_channels_last_layout_changes_the_memory_order_not_the_output(dims):
    from diffnet.backend.layout import channels_last

    torch.manual_seed(0)
    net = UNet(2, 1, (4, 8), dims=dims).double()
    torch.nn.init.normal_(net.head.weight)  # a fresh U-Net's head starts at zero
    x = torch.randn(2, 2, *([8] * dims), dtype=torch.float64)
    y = channels_last(x)
    fmt = torch.channels_last if dims == 2 else torch.channels_last_3d
    assert y.is_contiguous(memory_format=fmt) and torch.equal(y, x)
    with torch.no_grad():
        assert torch.allclose(net(y), net(x), rtol=0, atol=1e-12)
