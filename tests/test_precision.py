"""The PDE losses never run in TF32: every loss convolution, forward and backward, sees TF32 off,
whatever the process-wide flags say (on CUDA, a float32 loss then matches float64 to float32 rounding)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from diffnet.problems.burgers import BurgersProblem
from diffnet.problems.poisson import KLFamily, PoissonProblem
from diffnet.problems.poisson3d import Poisson3D
from diffnet.problems.reaction_diffusion import ReactionDiffusionProblem

PROBLEMS = [PoissonProblem((12, 13)), ReactionDiffusionProblem((12, 13), kappa=1.5, source=1.0),
            BurgersProblem((12, 13), viscosity=0.01, stencil="sobel"),
            BurgersProblem((12, 13), viscosity=0.01, stencil="conservative"), Poisson3D((6, 7, 5))]


def _loss_and_grad(problem, dtype, device="cpu"):
    torch.manual_seed(0)
    params = (torch.rand(3, 6) * 6 - 3) if isinstance(problem, (KLFamily, Poisson3D)) else torch.rand(3) * 3 + 3
    params = params.to(dtype=dtype, device=device)
    raw = torch.randn(3, 1, *problem.resolution, dtype=dtype, device=device, requires_grad=True)
    loss = sum(t.sum() for t in problem.loss_terms(problem.field(raw, params), params).values())
    loss.backward()
    return loss.detach(), raw.grad


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: f"{p.name}-{getattr(p, 'stencil', '')}")
def test_loss_convolutions_run_with_tf32_off(problem, monkeypatch):
    seen = []
    d = len(problem.resolution)
    conv, conv_input = getattr(F, f"conv{d}d"), getattr(torch.nn.grad, f"conv{d}d_input")

    def spy_conv(*args, **kwargs):
        seen.append(("conv", torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32))
        return conv(*args, **kwargs)

    def spy_input(*args, **kwargs):
        seen.append(("conv_input", torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32))
        return conv_input(*args, **kwargs)

    monkeypatch.setattr(F, f"conv{d}d", spy_conv)
    monkeypatch.setattr(torch.nn.grad, f"conv{d}d_input", spy_input)
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True  # as cuDNN's default
        _loss_and_grad(problem, torch.float32)
        assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == (True, True)  # restored
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before
    if getattr(problem, "stencil", "") != "conservative":  # the conservative residual has no convolutions
        assert {name for name, *_ in seen} == {"conv", "conv_input"}  # forward and backward both seen
    assert all(not cudnn and not matmul for _, cudnn, matmul in seen), seen


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("problem", PROBLEMS[:3] + PROBLEMS[4:], ids=lambda p: f"{p.name}-{getattr(p, 'stencil', '')}")
def test_float32_loss_on_cuda_matches_float64_with_tf32_allowed(problem):
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
        loss32, grad32 = _loss_and_grad(problem, torch.float32, "cuda")
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before
    loss64, grad64 = _loss_and_grad(problem, torch.float64, "cuda")
    # float32 proper: ~1e-7 relative; TF32 (10 mantissa bits) would be ~1e-3.
    assert abs(loss32.double() - loss64).item() <= 1e-5 * abs(loss64).item()
    assert (grad32.double() - grad64).abs().max().item() <= 1e-5 * grad64.abs().max().item()
