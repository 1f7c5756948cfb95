"""Constant tensors (stencil and quadrature weights, KL modes, coordinates) cached per dtype and device."""

from __future__ import annotations

from typing import Callable, Hashable

import numpy as np
import torch

__all__ = ["constant"]

_CACHE: dict[tuple, torch.Tensor] = {}
_LIMIT = 256  # distinct (key, dtype, device) entries; a run uses a handful


def constant(key: Hashable, make: Callable[[], np.ndarray | torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """``make()`` as a tensor with ``like``'s dtype and device, built once per (key, dtype, device).

    Building these from host arrays on every loss evaluation would copy them to the GPU
    every step, and a host-to-device copy is not allowed while a CUDA graph is captured.
    ``key`` must identify what ``make`` returns (the parameters it is built from).
    """
    full = (key, like.dtype, like.device)
    hit = _CACHE.get(full)
    if hit is None:
        if len(_CACHE) >= _LIMIT:
            _CACHE.clear()
        # Never an inference tensor: one first built under torch.inference_mode (an evaluation, the coarse
        # correction's fixed nodes) could not be saved for backward by a later training step in this process.
        with torch.inference_mode(False):
            hit = torch.as_tensor(make(), dtype=like.dtype, device=like.device).clone()
        _CACHE[full] = hit
    return hit
