"""The PDE losses never run in TF32: every loss convolution, forward and backward, sees TF32 off,
whatever the process-wide flags say (on CUDA, a float32 loss then matches float64 to float32 rounding)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from diffnet.backend.precision import _restore, no_tf32, set_tf32, tf32_state
from diffnet.families.burgers import BurgersFamily
from diffnet.families.kl_family import KLFamily
from diffnet.families.poisson import PoissonFamily
from diffnet.families.poisson3d import Poisson3DFamily
from diffnet.families.reaction_diffusion import ReactionDiffusionFamily

PROBLEMS = [PoissonFamily((12, 13)), ReactionDiffusionFamily((12, 13), kappa=1.5, source=1.0),
            BurgersFamily((12, 13), viscosity=0.01, stencil="sobel"),
            BurgersFamily((12, 13), viscosity=0.01, stencil="conservative"), Poisson3DFamily((6, 7, 5))]


def _loss_and_grad(problem, dtype, device="cpu"):
    # One draw for every dtype and device: on the CPU in float64, then cast and moved (CUDA's generator draws
    # other numbers for float32 than for float64 under one seed, and the comparison would be of two fields).
    torch.manual_seed(0)
    params = (torch.rand(3, 6, dtype=torch.float64) * 6 - 3) if isinstance(problem, (KLFamily, Poisson3DFamily)) \
        else torch.rand(3, dtype=torch.float64) * 3 + 3
    params = params.to(dtype=dtype, device=device)
    raw = torch.randn(3, 1, *problem.resolution, dtype=torch.float64).to(dtype=dtype, device=device).requires_grad_(True)
    loss = sum(t.sum() for t in problem.loss_terms(problem.field(raw, params), params).values())
    loss.backward()
    return loss.detach(), raw.grad


# What tf32_state() reads with TF32 off: the fp32_precision strings on a torch that has them, else allow_tf32.
OFF = ("ieee", "ieee") if hasattr(getattr(torch.backends.cudnn, "conv", None), "fp32_precision") else (False, False)


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: f"{p.name}-{getattr(p, 'stencil', '')}")
def test_loss_convolutions_run_with_tf32_off(problem, monkeypatch):
    seen = []
    d = len(problem.resolution)
    conv, conv_input = getattr(F, f"conv{d}d"), getattr(torch.nn.grad, f"conv{d}d_input")

    def spy_conv(*args, **kwargs):
        seen.append(("conv", tf32_state()))
        return conv(*args, **kwargs)

    def spy_input(*args, **kwargs):
        seen.append(("conv_input", tf32_state()))
        return conv_input(*args, **kwargs)

    monkeypatch.setattr(F, f"conv{d}d", spy_conv)
    monkeypatch.setattr(torch.nn.grad, f"conv{d}d_input", spy_input)
    before = tf32_state()
    try:
        set_tf32(True)  # as cuDNN's default for convolutions, and parallel.tf32 for the network
        on = tf32_state()
        assert on != OFF
        _loss_and_grad(problem, torch.float32)
        assert tf32_state() == on  # restored
    finally:
        _restore(before)
    if getattr(problem, "stencil", "") != "conservative":  # the conservative residual has no convolutions
        assert {name for name, _ in seen} == {"conv", "conv_input"}  # forward and backward both seen
    assert all(state == OFF for _, state in seen), seen


@pytest.mark.skipif(OFF != ("ieee", "ieee"), reason="this torch has no fp32_precision settings")
def test_a_program_that_mixed_the_old_and_new_tf32_settings_still_gets_float32_losses():
    # torch >= 2.9 raises on reading allow_tf32 once cuDNN's conv and RNN settings differ (a program that set the
    # new API's conv setting alone); the switches here read and write only the settings this torch obeys.
    before = tf32_state(), torch.backends.cudnn.rnn.fp32_precision
    try:
        torch.backends.cudnn.conv.fp32_precision, torch.backends.cudnn.rnn.fp32_precision = "tf32", "ieee"
        with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
            torch.backends.cudnn.allow_tf32
        with no_tf32():
            assert tf32_state() == ("ieee", "ieee")
        assert torch.backends.cudnn.conv.fp32_precision == "tf32"
    finally:
        _restore(before[0])
        torch.backends.cudnn.rnn.fp32_precision = before[1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("problem", PROBLEMS[:3] + PROBLEMS[4:], ids=lambda p: f"{p.name}-{getattr(p, 'stencil', '')}")
def test_float32_loss_on_cuda_matches_float64_with_tf32_allowed(problem):
    before = tf32_state()
    try:
        set_tf32(True)
        loss32, grad32 = _loss_and_grad(problem, torch.float32, "cuda")
    finally:
        _restore(before)
    loss64, grad64 = _loss_and_grad(problem, torch.float64, "cuda")
    # float32 proper: ~1e-7 relative; TF32 (10 mantissa bits) would be ~1e-3.
    assert abs(loss32.double() - loss64).item() <= 1e-5 * abs(loss64).item()
    assert (grad32.double() - grad64).abs().max().item() <= 1e-5 * grad64.abs().max().item()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_tf32_is_what_makes_the_difference_on_cuda():
    # The check above has teeth: the same Poisson loss with TF32 left on inside the loss (the flags on, the
    # switch that turns them off made a no-op) breaks its bound on a GPU that has TF32. In the gradient: the loss
    # value, a sum of squares, averages TF32's rounding away (2.2e-6 relative on an H100, torch 2.11), while
    # the gradient's entries each carry it (TF32 keeps 10 mantissa bits: about 5e-4).
    import diffnet.backend.precision as precision

    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("no TF32 before Ampere")
    problem = PROBLEMS[0]
    before, keep = tf32_state(), precision.set_tf32
    try:
        set_tf32(True)
        precision.set_tf32 = lambda on: None  # no_tf32 looks it up when entered: the flags stay on
        _, grad_tf32 = _loss_and_grad(problem, torch.float32, "cuda")
    finally:
        precision.set_tf32 = keep
        _restore(before)
    _, grad64 = _loss_and_grad(problem, torch.float64, "cuda")
    assert (grad_tf32.double() - grad64).abs().max().item() > 1e-5 * grad64.abs().max().item()
