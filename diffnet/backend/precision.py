"""The losses in float32 proper on CUDA: no TF32 inside the PDE's convolutions, whatever the network uses.

TF32 keeps 10 mantissa bits. In the Q1 energy's gradient that rounding is equivalent to a
relative solution error of about 3e-4 (measured on the Poisson family), above the 256^2
grid's own discretisation error (1e-4), while float32 proper is equivalent to about 3e-8.
cuDNN enables TF32 for convolutions by default on Ampere and later, and
``parallel.tf32 = true`` enables it for the network on purpose; the loss convolutions
therefore switch it off around themselves, in the forward and in the backward pass (an
autograd function, since the backward runs outside any context the forward sets). On a
CPU the flags change nothing. A torch from 2.9 on keeps per-operator ``fp32_precision`` settings
beside the old ``allow_tf32`` flags (and raises on reading the old ones once a program mixed them):
the switches here use whichever the running torch has (:func:`set_tf32`, :func:`tf32_state`).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F

__all__ = ["no_tf32", "conv", "set_tf32", "tf32_state"]


def _new_api() -> bool:
    """Whether the running torch has the per-operator ``fp32_precision`` settings (torch >= 2.9), which it obeys
    beside the old ``allow_tf32`` flags; there the old flags' getter raises once the two were mixed."""
    return hasattr(getattr(torch.backends.cudnn, "conv", None), "fp32_precision") and hasattr(
        torch.backends.cuda.matmul, "fp32_precision")


def tf32_state() -> tuple[object, object]:
    """The TF32 settings of cuDNN convolutions and CUDA matrix products, as the running torch keeps them:
    ``fp32_precision`` strings ("tf32", "ieee", "none": inherit) on a torch that has them, else the
    ``allow_tf32`` booleans."""
    if _new_api():
        return torch.backends.cudnn.conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision
    return torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32


def _restore(state: tuple[object, object]) -> None:
    if _new_api():
        torch.backends.cudnn.conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision = state
    else:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = state


def set_tf32(on: bool) -> None:
    """TF32 for float32 cuDNN convolutions and CUDA matrix products, on or off, through the settings the running
    torch obeys (on torch 2.11 cuDNN's convolutions read "tf32" by default)."""
    if _new_api():
        _restore(("tf32", "tf32") if on else ("ieee", "ieee"))
    else:
        _restore((on, on))


@contextlib.contextmanager
def no_tf32() -> Iterator[None]:
    """cuDNN convolutions and CUDA matrix products in full float32 inside the block; restored after."""
    before = tf32_state()
    set_tf32(False)
    try:
        yield
    finally:
        _restore(before)


class _Conv(torch.autograd.Function):
    """``F.conv2d`` or ``F.conv3d`` (by the input's dimensions) with constant weights, forward, backward and forward
    mode (a residual's Gauss-Newton columns are dual tensors) under :func:`no_tf32`."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(weight)
        ctx.save_for_forward(weight)
        ctx.shape = x.shape
        with no_tf32():
            return getattr(F, f"conv{x.ndim - 2}d")(x, weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (weight,) = ctx.saved_tensors
        with no_tf32():
            return getattr(torch.nn.grad, f"conv{len(ctx.shape) - 2}d_input")(ctx.shape, weight, grad), None

    @staticmethod
    def jvp(ctx, tangent: torch.Tensor, _weight_tangent) -> torch.Tensor:
        (weight,) = ctx.saved_tensors
        with no_tf32():
            return getattr(F, f"conv{tangent.ndim - 2}d")(tangent, weight)


def conv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """A loss convolution (no padding, stride 1) of ``x`` (S, C, *grid), 2-D or 3-D, with constant
    ``weight``, never in TF32."""
    if weight.requires_grad:
        raise ValueError("loss convolutions take constant weights")
    return _Conv.apply(x, weight)
