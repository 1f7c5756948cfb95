"""One sample's grid split into tiles: the operations a generator and a loss need to compute,
on one tile, exactly their share of the whole grid's result.

A :class:`Tiling` says which contiguous block of the grid's nodes this process holds and
provides the communications: the halo (the neighbouring tiles' layers next to this tile's
faces) and its adjoint (the halos' gradients returned), the sum over one sample's tiles, and
the gather of a whole field. It is communicator-free here; the engine's MPI tiling
(:mod:`deepfusion.parallel.halo`) implements it over a process grid.
:class:`Whole` is the one-tile case, where every operation is the plain one.

The layers below are the U-Net's, written against a tiling: a convolution pads with the
halo instead of zeros, group normalisation sums its statistics over the tiles, average
pooling is local when every tile starts on an even node, and the cell-centred 2x
upsampling reads a one-node halo. Each equals the whole-grid layer on the tile's nodes
(the tests compare them under ``mpiexec``).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

__all__ = ["Tiling", "Whole", "halo_pad", "tiled_conv", "tiled_group_norm", "tiled_upsample2", "owned_elements",
           "halo_unpad", "grow", "zero_boundary", "axis_coordinates", "element_sum"]


class Tiling:
    """This process's tile of a sample's node grid.

    Attributes
    ----------
    grid : tuple of int
        The whole grid's nodes per spatial axis.
    bounds : tuple of (int, int)
        For each spatial axis, the tile's node range [start, stop).
    """

    grid: tuple[int, ...]
    bounds: tuple[tuple[int, int], ...]

    @property
    def shape(self) -> tuple[int, ...]:
        """The tile's nodes per spatial axis."""
        return tuple(b - a for a, b in self.bounds)

    @property
    def tiles(self) -> int:
        """Tiles per sample (1: the whole grid)."""
        return 1

    def physical(self, axis: int, side: int) -> bool:
        """Whether the tile's face on ``axis`` (``side`` 0 low, 1 high) is the grid's boundary."""
        a, b = self.bounds[axis]
        return a == 0 if side == 0 else b == self.grid[axis]

    def pad_axis(self, x: torch.Tensor, axis: int, low: int, high: int, mode: str) -> torch.Tensor:
        """``x`` (S, C, *tile) grown along spatial ``axis`` by ``low`` and ``high`` layers: the
        neighbouring tiles' layers at faces between tiles, ``mode`` at the grid's boundary (see
        :func:`halo_pad`); differentiable. Every tile of a sample calls it with the same arguments."""
        return grow(x, 2 + axis, None, None, low, high, mode)

    def unpad_axis(self, g: torch.Tensor, axis: int, low: int, high: int, mode: str,
                   inplace: bool = False) -> torch.Tensor:
        """The adjoint of :meth:`pad_axis`: the gradient ``g`` of a grown tile back to the tile, the
        halos' parts returned to the tiles they came from and added into their faces (a replicated
        boundary face's into its edge layer). With ``inplace`` the result is a view of ``g``, whose
        layers it changes."""
        dim = 2 + axis
        inner = (not self.physical(axis, 0), not self.physical(axis, 1))
        lo_w = low if inner[0] or mode != "none" else 0  # layers grown at each face
        hi_w = high if inner[1] or mode != "none" else 0
        n = g.shape[dim] - lo_w - hi_w
        g_low, g_high = g.narrow(dim, 0, lo_w), g.narrow(dim, lo_w + n, hi_w)
        # My low halo came from the low neighbour's last layers, its gradient goes back there; the
        # low neighbour returns the gradient of its high halo: my first ``high`` layers.
        from_low, from_high = self.return_halos(axis, low, high, g_low if inner[0] and low else None,
                                                g_high if inner[1] and high else None, g)
        grad = g.narrow(dim, lo_w, n)
        grad = grad if inplace else grad.clone()
        if from_low is not None:
            grad.narrow(dim, 0, high).add_(from_low)
        if from_high is not None:
            grad.narrow(dim, n - low, low).add_(from_high)
        if mode == "replicate":
            if not inner[0] and low:
                grad.narrow(dim, 0, 1).add_(g_low.sum(dim=dim, keepdim=True))
            if not inner[1] and high:
                grad.narrow(dim, n - 1, 1).add_(g_high.sum(dim=dim, keepdim=True))
        return grad

    def return_halos(self, axis: int, low: int, high: int, to_low: torch.Tensor | None, to_high: torch.Tensor | None,
                     like: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Send the gradients of this tile's ``low``/``high`` halos (``to_low``/``to_high``) back to the
        neighbours along ``axis`` and receive those of the neighbours' halos, which are this tile's first
        ``high`` and last ``low`` layers; (None, None) here, where the tile has no neighbours."""
        return None, None

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` summed over the sample's tiles (every tile gets the sum); differentiable."""
        return t

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """The whole grid (S, C, *grid) from every tile's ``x`` (S, C, *tile), on every tile;
        differentiable (each tile gets its block of the gradient summed over the tiles)."""
        return x

    def local(self, full: torch.Tensor) -> torch.Tensor:
        """The tile's block of a whole-grid tensor (..., *grid)."""
        return full[(Ellipsis, *(slice(a, b) for a, b in self.bounds))]


class Whole(Tiling):
    """The whole grid as one tile."""

    def __init__(self, grid: Sequence[int]) -> None:
        self.grid = tuple(int(n) for n in grid)
        self.bounds = tuple((0, n) for n in self.grid)


def halo_pad(x: torch.Tensor, tiling: Tiling, width: int | Sequence[tuple[int, int]], mode: str = "zeros") -> torch.Tensor:
    """``x`` (S, C, *tile) grown by ``width`` layers per face: the neighbours' layers at faces
    between tiles, ``mode`` at the grid's boundary (``zeros``, ``replicate`` copies of the face,
    or ``none``: not grown there).

    ``width`` is one number, or a (low, high) pair per spatial axis. Axes are padded in
    order, each from the tile already grown along the earlier axes, so the corner layers
    come from the diagonal neighbours.
    """
    d = x.ndim - 2
    widths = [(width, width)] * d if isinstance(width, int) else [tuple(w) for w in width]
    for axis, (lo, hi) in enumerate(widths):
        if lo == hi == 0:
            continue
        x = tiling.pad_axis(x, axis, lo, hi, mode)
    return x


def halo_unpad(g: torch.Tensor, tiling: Tiling, width: int | Sequence[tuple[int, int]], mode: str = "zeros",
               inplace: bool = False) -> torch.Tensor:
    """The adjoint of :func:`halo_pad` (the axes in reverse order): the gradient of a padded tile to
    the tile's gradient, summed over the tiles that share layers."""
    d = g.ndim - 2
    widths = [(width, width)] * d if isinstance(width, int) else [tuple(w) for w in width]
    for axis in reversed(range(d)):
        lo, hi = widths[axis]
        if lo or hi:
            g = tiling.unpad_axis(g, axis, lo, hi, mode, inplace)
    return g


def grow(x: torch.Tensor, dim: int, low: torch.Tensor | None, high: torch.Tensor | None, lo: int, hi: int,
         mode: str) -> torch.Tensor:
    """``x`` with the halos ``low``/``high`` joined along ``dim``; a missing one (a face on the grid's
    boundary) is ``lo``/``hi`` layers of ``mode``."""
    if mode not in ("zeros", "replicate", "none"):
        raise ValueError(f"unknown halo mode {mode!r}; choose 'zeros', 'replicate' or 'none'")
    if low is None and lo and mode != "none":
        low = _face(x, dim, 0, lo, mode)
    if high is None and hi and mode != "none":
        high = _face(x, dim, 1, hi, mode)
    return torch.cat([t for t in (low, x, high) if t is not None], dim=dim)


def _face(x: torch.Tensor, dim: int, side: int, width: int, mode: str) -> torch.Tensor:
    """``width`` layers beyond a physical face: zeros, or copies of the face's layer."""
    if mode == "zeros":
        shape = list(x.shape)
        shape[dim] = width
        return x.new_zeros(shape)
    edge = x.narrow(dim, 0 if side == 0 else x.shape[dim] - 1, 1)
    return edge.expand(*[width if k == dim else -1 for k in range(x.ndim)])


def tiled_conv(conv: torch.nn.Module, x: torch.Tensor, tiling: Tiling) -> torch.Tensor:
    """A zero-padded 'same' convolution module (odd kernel, stride 1) applied to a tile."""
    k = conv.kernel_size[0]
    if k == 1:
        return conv(x)
    return _HaloConv.apply(x, conv.weight, conv.bias, tiling, k // 2)


class _HaloConv(torch.autograd.Function):
    """Convolution of the halo-padded tile that keeps only the tile for its backward pass.

    Autograd on ``conv(halo_pad(x))`` would store the padded copy of every convolution's input
    beside ``x`` (which the layer before keeps anyway): a second activation per convolution,
    as much as the split saves. Here the padding is redone in the backward pass (one more halo
    exchange, a thin layer) and the halos' gradients go back through its own backward.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, tiling, width):
        ctx.tiling, ctx.width, ctx.has_bias = tiling, width, bias is not None
        ctx.save_for_backward(x, weight)
        return _CONV[x.ndim - 2][0](halo_pad(x, tiling, width, "zeros"), weight, bias)

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        conv_input, conv_weight = _CONV[x.ndim - 2][1:]
        g = g.contiguous()
        padded = halo_pad(x, ctx.tiling, ctx.width, "zeros")
        shape = padded.shape
        grad_w = conv_weight(padded, weight.shape, g)
        del padded  # before the input gradient: one padded-size tensor alive at a time
        grad_x = halo_unpad(conv_input(shape, weight, g), ctx.tiling, ctx.width, "zeros", inplace=True)
        grad_b = g.sum(dim=(0, *range(2, g.ndim))) if ctx.has_bias else None
        return grad_x, grad_w, grad_b, None, None


_CONV = {2: (F.conv2d, torch.nn.grad.conv2d_input, torch.nn.grad.conv2d_weight),
         3: (F.conv3d, torch.nn.grad.conv3d_input, torch.nn.grad.conv3d_weight)}


def tiled_group_norm(norm: torch.nn.GroupNorm, x: torch.Tensor, tiling: Tiling) -> torch.Tensor:
    """GroupNorm with each (sample, group)'s mean and biased variance taken over all its tiles
    (two passes: the mean, then the squared deviations, as the whole-grid kernel is accurate)."""
    return _GroupNorm.apply(x, norm.weight, norm.bias, tiling, norm.num_groups, norm.eps)


class _GroupNorm(torch.autograd.Function):
    """GroupNorm over a sample's tiles that keeps, as PyTorch's kernel does, only its input and the
    statistics for the backward pass (the two sums of the gradient formula are summed over the
    tiles there); autograd on the formula would keep three activation-sized intermediates."""

    @staticmethod
    def forward(ctx, x, weight, bias, tiling, groups, eps):
        s, c = x.shape[:2]
        # The whole grid at this tensor's level (the tile and the grid coarsen together).
        count = c // groups
        for n, t, w in zip(tiling.grid, tiling.shape, x.shape[2:]):
            count *= n * w // t
        xg = x.reshape(s, groups, -1)
        mean = tiling.sum(xg.sum(dim=2, keepdim=True)) / count
        var = tiling.sum((xg - mean).square_().sum(dim=2, keepdim=True)) / count
        rstd = torch.rsqrt(var + eps)
        ctx.tiling, ctx.groups, ctx.count = tiling, groups, count
        ctx.save_for_backward(x, weight, mean, rstd)
        shape = (1, c) + (1,) * (x.ndim - 2)
        return (xg - mean).mul_(rstd).view(x.shape).mul_(weight.reshape(shape)).add_(bias.reshape(shape))

    @staticmethod
    def backward(ctx, g):
        # In place where it can be: the pass starts with every activation of the network alive.
        x, weight, mean, rstd = ctx.saved_tensors
        s, c = x.shape[:2]
        xh = (x.reshape(s, ctx.groups, -1) - mean).mul_(rstd)  # x normalised, (S, G, n)
        gc = g.reshape(s, c, -1)
        xc = xh.view(s, c, -1)
        grad_w = torch.einsum("scn,scn->c", gc, xc)
        grad_b = gc.sum(dim=(0, 2))
        dy = (gc * weight.reshape(1, c, 1)).view(s, ctx.groups, -1)
        m1 = ctx.tiling.sum(dy.sum(dim=2, keepdim=True)) / ctx.count
        m2 = ctx.tiling.sum(torch.einsum("sgn,sgn->sg", dy, xh)[..., None]) / ctx.count
        grad_x = dy.sub_(m1).sub_(xh.mul_(m2)).mul_(rstd).reshape(x.shape)
        return grad_x, grad_w, grad_b, None, None, None


def tiled_upsample2(x: torch.Tensor, tiling: Tiling) -> torch.Tensor:
    """Cell-centred 2x linear upsampling (``interpolate(..., align_corners=False)``) of a tile.

    With a one-layer halo (copies of the face at the grid's boundary, which is how the
    whole-grid kernel clamps) the upsampled padded tile, cut by two layers per face, is the
    tile's part of the whole grid's upsampling: the same quarter weights (to rounding: the
    kernel may order its sums otherwise on the padded shape).
    """
    d = x.ndim - 2
    padded = halo_pad(x, tiling, 1, "replicate")
    up = F.interpolate(padded, size=[2 * n for n in padded.shape[2:]], mode=("bilinear", "trilinear")[d - 2],
                       align_corners=False)
    return up[(Ellipsis, *(slice(2, -2),) * d)]


def owned_elements(x: torch.Tensor, tiling: Tiling) -> torch.Tensor:
    """The tile grown by one layer at every high face between tiles: the nodes of exactly the
    elements (cells between neighbouring nodes) this tile owns, so that a sum over elements,
    taken per tile and then over the tiles, counts every element once."""
    return halo_pad(x, tiling, [(0, 1)] * (x.ndim - 2), "none")


def zero_boundary(v: torch.Tensor, tiling: Tiling, axes: Sequence[int]) -> torch.Tensor:
    """``v`` (S, *tile) with the nodes on the grid's boundary planes normal to spatial ``axes`` set to
    zero: a tile's part of a Dirichlet mask (``F.pad(v[..., 1:-1], (1, 1))`` on the whole grid)."""
    d = len(tiling.grid)
    for axis in axes:
        a, b = tiling.bounds[axis]
        keep = torch.ones(b - a, dtype=v.dtype, device=v.device)
        if a == 0:
            keep[0] = 0.0
        if b == tiling.grid[axis]:
            keep[-1] = 0.0
        v = v * keep.reshape((-1,) + (1,) * (d - 1 - axis))
    return v


def axis_coordinates(tiling: Tiling, axis: int, like: torch.Tensor) -> torch.Tensor:
    """The tile's nodal coordinates on [0, 1] along spatial ``axis`` (as ``torch.linspace`` of the whole grid)."""
    a, b = tiling.bounds[axis]
    return torch.linspace(0.0, 1.0, tiling.grid[axis], dtype=like.dtype, device=like.device)[a:b]


def element_sum(energy, tiling: Tiling, *fields: torch.Tensor) -> torch.Tensor:
    """``energy(*fields)``, a per-sample sum over the elements of nodal fields (S, *grid), for the
    whole grid from this tile's fields (S, *tile): the tile's own elements (a one-node halo at the
    high faces between tiles), summed over the tiles; every tile gets the total (S,)."""
    return tiling.sum(energy(*(owned_elements(f[:, None], tiling)[:, 0] for f in fields)))
