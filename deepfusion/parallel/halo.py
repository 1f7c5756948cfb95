"""Domain parallelism: one sample's grid split into tiles over a group of MPI ranks, with halo
exchange and the sums over a sample's tiles (the :class:`diffnet.generators.tiling.Tiling` of a process grid).

The job's ranks form a data x domain grid: ``domain`` = [P_1, ..., P_d] ranks split every
sample (tile (i_1, ..., i_d) on domain rank i_1 * P_2 ... P_d + ... + i_d, row-major), and
consecutive groups of prod(domain) ranks are the data-parallel replicas, as with
``parallel.domain = 1`` each rank is one. Halos move by non-blocking point-to-point
messages (MPI_Isend/Irecv, both faces at once); their gradients go back the same way
and are added into the faces they came from.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from deepfusion.parallel.domain import tile_bounds
from diffnet.generators.tiling import Tiling, grow

__all__ = ["domain_groups", "data_group", "MPITiling", "DomainSplit"]


def domain_groups(comm, tiles: int):
    """(the domain group of this rank, its data group): ``comm``'s ranks in consecutive blocks of
    ``tiles`` (one sample's tiles), and the ranks holding the same tile of every block (collective)."""
    if tiles < 1 or comm.size % tiles:
        raise ValueError(f"{tiles} tiles per sample need a multiple of {tiles} ranks, the job has "
                         f"{comm.size}")
    if tiles == 1:
        return None, comm
    return comm.split(comm.rank // tiles, comm.rank), comm.split(comm.rank % tiles, comm.rank)


class MPITiling(Tiling):
    """This rank's tile of every sample's grid in a domain group.

    Parameters
    ----------
    comm : deepfusion.parallel.comm.MPICommunicator
        The domain group: prod(``splits``) ranks that together hold one sample.
    grid : sequence of int
        The whole grid's nodes per spatial axis.
    splits : sequence of int
        Tiles per spatial axis.
    align : int
        Every tile side a multiple of this (``2 ** (U-Net levels - 1)``, so pooling stays local).
    """

    def __init__(self, comm, grid: Sequence[int], splits: Sequence[int], align: int = 1) -> None:
        self.comm = comm
        self.grid = tuple(int(n) for n in grid)
        self.splits = tuple(int(p) for p in splits)
        if len(self.splits) != len(self.grid):
            raise ValueError(f"{len(self.splits)} splits for a {len(self.grid)}-D grid")
        if math.prod(self.splits) != comm.size:
            raise ValueError(f"{list(self.splits)} needs {math.prod(self.splits)} ranks per sample, "
                             f"the domain group has {comm.size}")
        self.coords = tuple(int(c) for c in np.unravel_index(comm.rank, self.splits))
        self.bounds = tuple(tile_bounds(n, p, align)[c] for n, p, c in zip(self.grid, self.splits, self.coords))

    @property
    def tiles(self) -> int:
        return self.comm.size

    def neighbour(self, axis: int, step: int) -> int | None:
        """The domain rank of the tile ``step`` (-1 or +1) along ``axis``; None beyond the grid."""
        c = list(self.coords)
        c[axis] += step
        if not 0 <= c[axis] < self.splits[axis]:
            return None
        return int(np.ravel_multi_index(c, self.splits))

    def pad_axis(self, x, axis, low, high, mode):
        if self.splits[axis] == 1:
            return super().pad_axis(x, axis, low, high, mode)
        # One autograd node on every tile, faces between tiles or not, so that every tile's
        # backward pass reaches the same exchanges in the same order.
        return _Exchange.apply(x, self, axis, low, high, mode)

    def return_halos(self, axis, low, high, to_low, to_high, like):
        if self.splits[axis] == 1:
            return None, None
        dim = 2 + axis
        return self.swap(axis, None if to_low is None else to_low.contiguous(),
                         None if to_high is None else to_high.contiguous(),
                         _resized(like.shape, dim, high) if self.neighbour(axis, -1) is not None and high else None,
                         _resized(like.shape, dim, low) if self.neighbour(axis, +1) is not None and low else None,
                         like)

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        return _AllSum.apply(t, self.comm)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        return _Gather.apply(x, self)

    def block(self, rank: int) -> tuple[slice, ...]:
        """The index of domain rank ``rank``'s tile in a whole-grid tensor (..., *grid)."""
        coords = np.unravel_index(rank, self.splits)
        return (Ellipsis, *(slice(*tile_bounds(n, p)[c]) for n, p, c in zip(self.grid, self.splits, coords)))

    def swap(self, axis: int, to_low: torch.Tensor | None, to_high: torch.Tensor | None,
             from_low: tuple[int, ...] | None, from_high: tuple[int, ...] | None, like: torch.Tensor):
        """Send ``to_low``/``to_high`` to the neighbours along ``axis`` and receive tensors of the shapes
        ``from_low``/``from_high`` from them (None: nothing that way); both faces in flight at once."""
        MPI = self.comm._MPI
        world, requests, received = self.comm.comm, [], [None, None]
        for side, (step, out, shape) in enumerate(((-1, to_low, from_low), (+1, to_high, from_high))):
            peer = self.neighbour(axis, step)
            if peer is None:
                continue
            # Tags name the face as the receiver sees it: a tile's high face is its neighbour's low one.
            if shape is not None:
                buf = torch.empty(shape, dtype=like.dtype)
                received[side] = buf
                requests.append(world.Irecv(buf.numpy(), source=peer, tag=2 * axis + side))
            if out is not None:  # through host memory: a CUDA tile's faces are staged (no CUDA-aware MPI needed)
                out = out.detach().cpu().contiguous()
                received.append(out)  # keep the send buffer alive until Waitall
                requests.append(world.Isend(out.numpy(), dest=peer, tag=2 * axis + (1 - side)))
        with self.comm._guard("a halo exchange"):
            MPI.Request.Waitall(requests)
        return tuple(None if r is None else r.to(like.device) for r in received[:2])


class _Exchange(torch.autograd.Function):
    """One axis's halos: forward sends the tile's face layers to the neighbours that need them (its
    first ``high`` layers to the low neighbour, its last ``low`` ones to the high one) and grows the
    tile (:func:`diffnet.generators.tiling.grow`); backward returns the halos' gradients to the tiles they came
    from, which add them into those faces (and a replicated boundary face's into its edge layer)."""

    @staticmethod
    def forward(ctx, x, tiling, axis, low, high, mode):
        dim, n = 2 + axis, x.shape[2 + axis]
        if max(low, high) > n:
            raise ValueError(f"a halo of {max(low, high)} layers is wider than the tile's {n}")
        has_low, has_high = tiling.neighbour(axis, -1) is not None, tiling.neighbour(axis, +1) is not None
        lo_t, hi_t = tiling.swap(axis, x.narrow(dim, 0, high) if has_low and high else None,
                                 x.narrow(dim, n - low, low) if has_high and low else None,
                                 _resized(x.shape, dim, low) if has_low and low else None,
                                 _resized(x.shape, dim, high) if has_high and high else None, x)
        ctx.tiling, ctx.axis, ctx.low, ctx.high, ctx.mode, ctx.shape = tiling, axis, low, high, mode, x.shape
        return grow(x.detach(), dim, lo_t, hi_t, low, high, mode)

    @staticmethod
    def backward(ctx, g):
        return ctx.tiling.unpad_axis(g, ctx.axis, ctx.low, ctx.high, ctx.mode), None, None, None, None, None


def _resized(shape: torch.Size, dim: int, width: int) -> tuple[int, ...]:
    return tuple(width if k == dim else s for k, s in enumerate(shape))


class _AllSum(torch.autograd.Function):
    """The sum over a domain group; its gradient is the sum of the gradients (every rank's loss
    depends on every rank's contribution)."""

    @staticmethod
    def forward(ctx, t, comm):
        ctx.comm = comm
        return _host_allreduce(comm, t)

    @staticmethod
    def backward(ctx, grad):
        return _host_allreduce(ctx.comm, grad), None


def _host_allreduce(comm, t: torch.Tensor) -> torch.Tensor:
    """The sum of ``t`` over ``comm``, staged through host memory (a CUDA tensor too), on ``t``'s device."""
    return comm.allreduce_(t.detach().cpu().clone().contiguous()).to(t.device)


class _Gather(torch.autograd.Function):
    """The whole grid from every tile, on every tile (MPI_Allgather of the equal tiles); backward
    sums the whole grid's gradient over the tiles and keeps this tile's block."""

    @staticmethod
    def forward(ctx, x, tiling):
        ctx.tiling = tiling
        device, x = x.device, x.detach().cpu().contiguous()  # through host memory, as the halos
        parts = torch.empty((tiling.tiles, *x.shape), dtype=x.dtype)
        with tiling.comm._guard("a tile gather"):
            tiling.comm.comm.Allgather(x.numpy(), parts.numpy())
        full = x.new_empty((*x.shape[:2], *tiling.grid))
        for r in range(tiling.tiles):
            full[tiling.block(r)] = parts[r]
        return full.to(device)

    @staticmethod
    def backward(ctx, grad):
        tiling = ctx.tiling
        total = _host_allreduce(tiling.comm, grad)
        return total[tiling.block(tiling.comm.rank)].clone(), None


class DomainSplit:
    """This rank's place in the job's data x domain process grid (``parallel.domain``).

    Built once per run from the configuration's tiles per axis (:func:`deepfusion.configuration.split.split_of`;
    collective); the tiles' geometry is :mod:`deepfusion.parallel.domain`'s. ValueError when the tiles do not
    divide the ranks.

    Parameters
    ----------
    comm : deepfusion.parallel.comm.MPICommunicator
        The whole job.
    splits : sequence of int
        Tiles per spatial axis (:func:`deepfusion.parallel.domain.domain_splits`).

    Attributes
    ----------
    domain : MPICommunicator
        The ranks that hold this rank's samples, one tile each.
    data_rank, data_size : int
        This rank's data-parallel group and the number of groups: the batch is split over the groups
        as over ranks without a split.
    """

    def __init__(self, comm, splits: Sequence[int]) -> None:
        self.splits = tuple(int(p) for p in splits)
        self.tiles = math.prod(self.splits)
        self.domain, _ = domain_groups(comm, self.tiles)  # raises when the tiles do not divide the ranks
        self.data_rank, self.data_size = comm.rank // self.tiles, comm.size // self.tiles

    @property
    def data_group(self) -> tuple[int, int]:
        """(this rank's data-parallel group, the number of groups)."""
        return self.data_rank, self.data_size

    def tiling(self, grid: Sequence[int]) -> MPITiling:
        """This rank's tile of ``grid`` (equal tiles; the U-Net checks its own alignment)."""
        return MPITiling(self.domain, grid, self.splits)


def data_group(comm, domain: DomainSplit | None) -> tuple[int, int]:
    """(this rank's data-parallel group, the number of groups): the rank and the job's size without a
    split, the ``domain``'s groups with one."""
    return (comm.rank, comm.size) if domain is None else domain.data_group
