"""Convolutional generators: a U-Net encoder-decoder with per-sample normalisation only."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["UNet", "build_network", "parameter_count"]


def _norm(channels: int) -> nn.GroupNorm:
    # Per-sample statistics only (GroupNorm), so a sample's output never depends on the
    # rest of its batch and data-parallel training needs no synchronised statistics.
    # Up to 8 groups; the count must divide the channels.
    return nn.GroupNorm(math.gcd(8, channels), channels)


class _Block(nn.Sequential):
    """Two 3x3 convolutions, each followed by GroupNorm and SiLU."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__(
            nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
            _norm(c_out),
            nn.SiLU(),
            nn.Conv2d(c_out, c_out, 3, padding=1, bias=False),
            _norm(c_out),
            nn.SiLU(),
        )


class UNet(nn.Module):
    """U-Net style encoder-decoder mapping (S, C_in, H, W) to (S, C_out, H, W).

    Parameters
    ----------
    in_channels, out_channels : int
        Input and output channels.
    channels : sequence of int
        Width of each level, finest first; the encoder halves the resolution between
        levels (average pooling) and the decoder doubles it back (bilinear upsampling)
        with skip connections. Inputs whose sides are not multiples of
        ``2 ** (len(channels) - 1)`` are padded by replication and the output cropped.
    checkpoint_activations : bool
        In training, keep only each level's inputs for the backward pass and recompute
        the level (resampling, concatenation, both convolutions, normalisations and
        activations) when its gradient is needed: memory per sample drops by about half,
        at the cost of a second forward pass; the result is the same.
    """

    def __init__(
        self, in_channels: int, out_channels: int, channels: tuple[int, ...], checkpoint_activations: bool = False
    ) -> None:
        super().__init__()
        if len(channels) < 1 or any(c < 1 for c in channels):
            raise ValueError(f"channels must be positive integers, got {channels}")
        self.channels = tuple(int(c) for c in channels)
        self.checkpoint_activations = bool(checkpoint_activations)
        self.down = nn.ModuleList()
        c_prev = in_channels
        for c in self.channels:
            self.down.append(_Block(c_prev, c))
            c_prev = c
        self.up = nn.ModuleList(
            _Block(self.channels[i + 1] + self.channels[i], self.channels[i])
            for i in reversed(range(len(self.channels) - 1))
        )
        self.head = nn.Conv2d(self.channels[0], out_channels, 1)
        # Start from a zero correction: the generator's first field is the one its
        # boundary construction gives, not noise.
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        m = 2 ** (len(self.channels) - 1)
        ph, pw = (-h) % m, (-w) % m
        if ph or pw:
            x = F.pad(x, (0, pw, 0, ph), mode="replicate")
        # Recomputation only pays where a backward pass follows.
        run = _recomputed if self.checkpoint_activations and self.training and torch.is_grad_enabled() else _direct
        skips = []
        for i, block in enumerate(self.down):
            x = run(_down, block, x, i > 0)
            skips.append(x)
        skips.pop()
        for block in self.up:
            x = run(_up, block, x, skips.pop())
        return self.head(x)[..., :h, :w]


def _down(block: _Block, x: torch.Tensor, pool: bool) -> torch.Tensor:
    """One encoder level: halve the resolution (except at the finest level), then the block."""
    return block(F.avg_pool2d(x, 2) if pool else x)


def _up(block: _Block, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
    """One decoder level: double the resolution, join the skip connection, then the block."""
    x = F.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False)
    return block(torch.cat([x, skip], dim=1))


def _direct(segment, *args) -> torch.Tensor:
    return segment(*args)


def _recomputed(segment, *args) -> torch.Tensor:
    # Non-reentrant checkpointing: works when no input requires grad (the first level)
    # and with autograd hooks on the parameters (the bucketed gradient reduction).
    return checkpoint(segment, *args, use_reentrant=False)


def build_network(
    name: str, in_channels: int, channels: tuple[int, ...], checkpoint_activations: bool = False
) -> nn.Module:
    """Construct the generator named in the config (``model.name``, ``model.checkpoint_activations``)."""
    if name == "unet":
        return UNet(in_channels, 1, channels, checkpoint_activations)
    raise ValueError(f"unknown model {name!r}; choose from ['unet']")


def parameter_count(model: nn.Module) -> int:
    """Number of trainable scalars."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
