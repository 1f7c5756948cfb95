"""Convolutional generators: a U-Net encoder-decoder with per-sample normalisation only, and a
multilevel stack that deepens it at the top for finer grids."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from diffnet.generators.multilevel import prolong, prolong_block, synthesise
from diffnet.generators.tiling import Tiling, tiled_conv, tiled_group_norm, tiled_upsample2

__all__ = ["NETWORKS", "UNet", "LevelStack", "build_network", "describe_network", "parameter_count"]


def _norm(channels: int) -> nn.GroupNorm:
    # Per-sample statistics only (GroupNorm), so a sample's output never depends on the
    # rest of its batch and data-parallel training needs no synchronised statistics.
    # Up to 8 groups; the count must divide the channels.
    return nn.GroupNorm(math.gcd(8, channels), channels)


# Per spatial dimension: convolution and average pooling (the resampling is diffnet.generators.multilevel.prolong).
_CONV = {2: nn.Conv2d, 3: nn.Conv3d}
_POOL = {2: F.avg_pool2d, 3: F.avg_pool3d}


class _Block(nn.Sequential):
    """Two 3x3 (3x3x3) convolutions, each followed by GroupNorm and SiLU."""

    def __init__(self, c_in: int, c_out: int, dims: int = 2) -> None:
        conv = _CONV[dims]
        super().__init__(
            conv(c_in, c_out, 3, padding=1, bias=False),
            _norm(c_out),
            nn.SiLU(),
            conv(c_out, c_out, 3, padding=1, bias=False),
            _norm(c_out),
            nn.SiLU(),
        )

    def forward(self, x: torch.Tensor, tiling: Tiling | None = None) -> torch.Tensor:
        if tiling is None:
            return super().forward(x)
        for layer in self:
            if isinstance(layer, nn.GroupNorm):
                x = tiled_group_norm(layer, x, tiling)
            elif isinstance(layer, nn.SiLU):
                x = layer(x)
            else:
                x = tiled_conv(layer, x, tiling)
        return x


class UNet(nn.Module):
    """U-Net style encoder-decoder mapping (S, C_in, H, W) to (S, C_out, H, W), or in 3-D
    (S, C_in, D, H, W) to (S, C_out, D, H, W).

    Parameters
    ----------
    in_channels, out_channels : int
        Input and output channels.
    channels : sequence of int
        Width of each scale, finest first; the encoder halves the resolution between
        scales (average pooling) and the decoder doubles it back (bilinear upsampling)
        with skip connections. Inputs whose sides are not multiples of
        ``2 ** (len(channels) - 1)`` are padded by replication and the output cropped.
    checkpoint_activations : bool
        In training, keep only each scale's inputs for the backward pass and recompute
        the scale (resampling, concatenation, both convolutions, normalisations and
        activations) when its gradient is needed: memory per sample drops by about half,
        at the cost of a second forward pass; the result is the same.
    output : {"nodal", "multilevel"}
        ``nodal``: one 1x1 head on the finest features gives the output. ``multilevel``:
        every decoder resolution (the bottom included) has its own 1x1 head, and the
        output is their terms summed through bilinear prolongation
        (:func:`diffnet.generators.multilevel.synthesise`, cell-centred as the pooling makes the
        scales): the same function class, a far better conditioned parameterisation of
        the smooth modes. The finest head is ``head`` in both, every head starts at zero.
    dims : {2, 3}
        Spatial dimensions: 2-D convolutions, pooling and bilinear resampling, or their 3-D
        counterparts (the same channel plan and options).
    """

    # Activations alive at once in an inference pass, per sample and grid node, in units of the
    # first scale's width: the skip tensors (about 2x that width over the whole pyramid) and a
    # block's input and output (the Surrogate's chunk size is set from it).
    live_widths = 6

    def __init__(
        self, in_channels: int, out_channels: int, channels: tuple[int, ...], checkpoint_activations: bool = False,
        output: str = "nodal", dims: int = 2,
    ) -> None:
        super().__init__()
        if dims not in _CONV:
            raise ValueError(f"dims must be 2 or 3, got {dims}")
        if len(channels) < 1 or any(c < 1 for c in channels):
            raise ValueError(f"channels must be positive integers, got {channels}")
        if output not in ("nodal", "multilevel"):
            raise ValueError(f"unknown output {output!r}; choose 'nodal' or 'multilevel'")
        self.channels = tuple(int(c) for c in channels)
        self.checkpoint_activations = bool(checkpoint_activations)
        self.output = output
        self.dims = dims
        self.down = nn.ModuleList()
        c_prev = in_channels
        for c in self.channels:
            self.down.append(_Block(c_prev, c, dims))
            c_prev = c
        self.up = nn.ModuleList(
            _Block(self.channels[i + 1] + self.channels[i], self.channels[i], dims)
            for i in reversed(range(len(self.channels) - 1))
        )
        self.head = _CONV[dims](self.channels[0], out_channels, 1)
        # The coarser scales' heads of the multilevel output, coarsest first.
        self.coarse_heads = nn.ModuleList(
            _CONV[dims](c, out_channels, 1) for c in (reversed(self.channels[1:]) if output == "multilevel" else ())
        )
        # Start from a zero correction: the generator's first field is the one its
        # boundary construction gives, not noise.
        for head in (self.head, *self.coarse_heads):
            nn.init.zeros_(head.weight)
            nn.init.zeros_(head.bias)

    def forward(self, x: torch.Tensor, tiling: Tiling | None = None) -> torch.Tensor:
        return self.run(x, tiling)[0]

    def run(self, x: torch.Tensor, tiling: Tiling | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The output (S, out_channels, *grid) and the finest features (S, channels[0], *grid).

        With a ``tiling`` (:mod:`diffnet.generators.tiling`), ``x`` is one tile of each sample's grid and the
        result that tile's part of the whole grid's output; every tile side must then be a
        multiple of ``2 ** (len(channels) - 1)`` (no padding between tiles).
        """
        if self.output == "nodal":
            feats = self.features(x, tiling=tiling)
            return self.head(feats), feats
        crop = _crop(x)
        scales = self.features(x, every_scale=True, tiling=tiling)  # coarsest first, on the padded grids
        terms = [head(f) for head, f in zip(self.coarse_heads, scales[:-1])] + [self.head(scales[-1])]
        if tiling is None:
            out = synthesise(terms, align_corners=False)
        else:
            out = terms[0]
            for c in terms[1:]:
                out = tiled_upsample2(out, tiling) + c
        return out[crop], scales[-1][crop]

    def features(self, x: torch.Tensor, every_scale: bool = False, tiling: Tiling | None = None):
        """The finest scale's features (S, channels[0], *grid), before the 1x1 output head; with
        ``every_scale``, the features of every decoder resolution, coarsest first, uncropped."""
        crop = _crop(x)
        m = 2 ** (len(self.channels) - 1)
        pads = [(-n) % m for n in x.shape[2:]]
        if any(pads) and tiling is not None:
            raise ValueError(f"a tiled U-Net needs tile sides that are multiples of {m} (2^(scales - 1)), "
                             f"got {list(x.shape[2:])}")
        if any(pads):
            x = F.pad(x, tuple(v for p in reversed(pads) for v in (0, p)), mode="replicate")
        # Recomputation only pays where a backward pass follows.
        run = _recomputed if self.checkpoint_activations and self.training and torch.is_grad_enabled() else _direct
        skips = []
        for i, block in enumerate(self.down):
            x = run(_down, block, x, i > 0, tiling)
            skips.append(x)
        skips.pop()
        scales = [x]
        for block in self.up:
            x = run(_up, block, x, skips.pop(), tiling)
            scales.append(x)
        return scales if every_scale else x[crop]


def _crop(x: torch.Tensor) -> tuple:
    """The index that cuts a padded (S, C, *grid) tensor back to ``x``'s grid."""
    return (Ellipsis, *(slice(0, n) for n in x.shape[2:]))


def _down(block: _Block, x: torch.Tensor, pool: bool, tiling: Tiling | None = None) -> torch.Tensor:
    """One encoder scale: halve the resolution (except at the finest scale), then the block.
    (Pooling is local to a tile: every tile starts on an even node.)"""
    return block(_POOL[x.ndim - 2](x, 2) if pool else x, tiling)


def _up(block: _Block, x: torch.Tensor, skip: torch.Tensor, tiling: Tiling | None = None) -> torch.Tensor:
    """One decoder scale: double the resolution, join the skip connection, then the block."""
    if tiling is None:
        x = prolong(x, [2 * n for n in x.shape[2:]], align_corners=False)
    else:
        x = tiled_upsample2(x, tiling)
    return block(torch.cat([x, skip], dim=1), tiling)


def _direct(segment, *args) -> torch.Tensor:
    return segment(*args)


def _recomputed(segment, *args) -> torch.Tensor:
    # Non-reentrant checkpointing: works when no input requires grad (the first scale)
    # and with autograd hooks on the parameters (the bucketed gradient reduction).
    return checkpoint(segment, *args, use_reentrant=False)


class _Refinement(nn.Module):
    """One level on top of a coarser generator, on a grid ``1 / ratio`` times finer.

    The coarser generator runs on the inputs resampled to its own grid (bilinear, with the
    boundary nodes on the boundary, as the nodal grids are); its output field and features
    are prolonged back to this grid the same way, and a block at this resolution, which
    sees them beside the inputs, adds a correction. The correction's head starts at zero,
    so a new level starts as the coarser generator's prolonged solution: nested
    iteration, as in multigrid.
    """

    def __init__(self, in_channels: int, coarse_channels: int, width: int, ratio: float, dims: int = 2,
                 out_channels: int = 1) -> None:
        super().__init__()
        self.ratio = float(ratio)
        self.block = _Block(in_channels + coarse_channels + out_channels, width, dims)
        self.head = _CONV[dims](width, out_channels, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def coarse_size(self, size: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(max(3, round(n * self.ratio)) for n in size)

    def forward(self, x: torch.Tensor, raw: torch.Tensor, feats: torch.Tensor, recompute: bool,
                tiling: Tiling | None = None):
        if tiling is None:
            up = [prolong(t, x.shape[2:]) for t in (raw, feats)]
        else:  # the whole coarse output, prolonged onto this tile only
            up = [prolong_block(t, tiling.grid, tiling.bounds) for t in (raw, feats)]
        h = (_recomputed if recompute else _direct)(self.block, torch.cat([x, *up], dim=1), tiling)
        return up[0] + self.head(h), h


class _Levels(nn.Module):
    """The generator of one level: the base network and the refinements up to that level."""

    def __init__(self, base: UNet, tops: list[_Refinement]) -> None:
        super().__init__()
        self.base = base
        self.tops = nn.ModuleList(tops)

    def forward(self, x: torch.Tensor, tiling: Tiling | None = None) -> torch.Tensor:
        return self._run(x, len(self.tops), tiling)[0]

    def _run(self, x: torch.Tensor, k: int, tiling: Tiling | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Level k's output and features. With a ``tiling`` (``x`` one tile), the top level's block
        runs on the tile and the coarser levels whole on every tile of the sample: their grids are
        2^-d of this one's, and the memory that matters is the finest grid's."""
        if k == 0:
            return self.base.run(x, tiling)
        top = self.tops[k - 1]
        whole = x if tiling is None else tiling.gather(x)
        coarse = prolong(whole, top.coarse_size(whole.shape[2:]))
        raw, feats = self._run(coarse, k - 1)
        recompute = self.base.checkpoint_activations and self.training and torch.is_grad_enabled()
        return top(x, raw, feats, recompute, tiling)


class LevelStack(_Levels):
    """A U-Net for the coarsest grid with one refinement level on top for each finer grid.

    This is how a multigrid run deepens its generator (``multigrid.transfer = "deepen"``):
    level k's generator, :meth:`level`, is the U-Net on the grid ``k`` levels down plus
    the first k refinements; the whole stack is the finest level's generator. Its
    parameters are those of every level, so one checkpoint layout serves all its visits.

    Parameters
    ----------
    base : UNet
        The coarsest level's generator.
    in_channels : int
        Input channels of the family's inputs.
    ratios : sequence of float
        For each finer level, coarse nodes per side over fine nodes per side (about 1/2).
    width : int
        Channels of every refinement block.
    out_channels : int
        Output channels, the base U-Net's (one per unknown field of the family).
    """

    def __init__(self, base: UNet, in_channels: int, ratios: tuple[float, ...], width: int,
                 out_channels: int = 1) -> None:
        coarse = [base.channels[0]] + [width] * (len(ratios) - 1)
        super().__init__(base, [_Refinement(in_channels, c, width, r, base.dims, out_channels)
                                for c, r in zip(coarse, ratios)])

    def level(self, k: int) -> nn.Module:
        """The generator of level ``k`` (0 = the base U-Net alone); it shares this stack's parameters."""
        if not 0 <= k <= len(self.tops):
            raise ValueError(f"level {k} outside 0..{len(self.tops)}")
        view = _Levels(self.base, list(self.tops[:k]))
        view.train(self.training)
        return view


# model.name -> the base generator's class (constructed as cls(in, out, channels, checkpoint, output, dims=dims)).
NETWORKS: dict[str, type] = {"unet": UNet}


def build_network(
    name: str,
    in_channels: int,
    channels: tuple[int, ...],
    checkpoint_activations: bool = False,
    levels: tuple[int, ...] = (),
    top_channels: int = 16,
    output: str = "nodal",
    dims: int = 2,
    out_channels: int = 1,
) -> nn.Module:
    """Construct the generator named in the config (``model.*``; with ``levels``, nodes per side
    of a multigrid run's grids, a :class:`LevelStack` deepened once per finer grid; ``output``
    the base U-Net's output basis, see :class:`UNet`; ``dims`` 2 or 3 spatial dimensions;
    ``out_channels`` one per unknown field of the family, :attr:`diffnet.protocol.family.Family.fields`)."""
    if name not in NETWORKS:
        raise ValueError(f"unknown model {name!r}; choose from {sorted(NETWORKS)}")
    base = NETWORKS[name](in_channels, out_channels, channels, checkpoint_activations, output, dims=dims)
    if len(levels) < 2:
        return base
    ratios = tuple(levels[k] / levels[k + 1] for k in range(len(levels) - 1))
    return LevelStack(base, in_channels, ratios, top_channels, out_channels)


def describe_network(model: nn.Module) -> str:
    """The network as a phrase for a product's chain: 'U-Net', 'U-Net deepened by 2 levels' (a :class:`LevelStack`)."""
    if isinstance(model, _Levels):
        return f"U-Net deepened by {len(model.tops)} level{'s' if len(model.tops) != 1 else ''}"
    return "U-Net" if isinstance(model, UNet) else type(model).__name__


def parameter_count(model: nn.Module) -> int:
    """Number of trainable scalars."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
