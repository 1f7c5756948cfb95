"""The memory layout the convolutions run fastest in: channels last (NHWC, 3-D NDHWC) for a network's input.

oneDNN's convolutions keep the layout of their input; channels last was 1.2-2.3x faster on CPU here than
NCHW (benchmarks/product_cost.py: an elasticity U-Net at 64², one thread, batch 8: 4.4 against 10.3 ms per
instance).
Every place that runs a network on an input it built (inference, a second stage's first network) goes through
:func:`channels_last`; the model itself is left as it is.
"""

from __future__ import annotations

import torch

__all__ = ["channels_last"]


def channels_last(x: torch.Tensor) -> torch.Tensor:
    """A network input (S, C, *grid) in channels-last order (NHWC, 3-D: NDHWC)."""
    return x.contiguous(memory_format=torch.channels_last if x.ndim == 4 else torch.channels_last_3d)
