"""One training step's local work (forward, loss, backward), eager or replayed from a CUDA graph."""

from __future__ import annotations

import contextlib
from typing import Callable

import torch

from diffnet.backend import layout

__all__ = ["loss_sum", "make_local_step", "training_step"]

GRAPH_WARMUP = 3  # eager steps on a side stream before a CUDA graph is captured (CUDA's requirement)

Terms = dict[str, torch.Tensor]


def loss_sum(model, family, p: torch.Tensor, *, autocast: str = "none",
             channels_last: bool = False, tiling=None) -> tuple[torch.Tensor, Terms]:
    """The batch's summed loss (a scalar to differentiate) and its per-term sums (detached).

    Every optimiser uses this one definition: the Adam steps (divided by the global batch),
    the L-BFGS objective, and the benchmarks' training steps. With a ``tiling``
    (:class:`deepfusion.parallel.halo.MPITiling`: this rank holds one tile of each sample) the generator
    and the loss run on the tile, every tile gets each sample's whole loss, and each
    contributes 1/tiles of it: summed over all ranks, every sample counts once.
    """
    # bf16 autocast covers the network only: the PDE loss (differences of nearby
    # values, energies) stays in the training dtype, where it keeps its digits.
    amp = torch.autocast(p.device.type, dtype=torch.bfloat16) if autocast == "bf16" else contextlib.nullcontext()
    x = family.inputs(p)
    if tiling is not None:
        x = tiling.local(x).contiguous()  # a copy: the whole grid's input is not kept
    if channels_last:
        x = layout.channels_last(x)
    with amp:
        raw = model(x) if tiling is None else model(x, tiling)
    if tiling is None:
        terms = family.output_loss_terms(raw.to(p.dtype), p)
    else:
        terms = {k: t / tiling.tiles for k, t in family.tile_loss_terms(raw.to(p.dtype), p, tiling).items()}
    return sum(t.sum() for t in terms.values()), {name: t.detach().sum() for name, t in terms.items()}


def _forward(model, family, b_eff: int, autocast: str, tiling=None) -> Callable[[torch.Tensor], tuple[torch.Tensor, Terms]]:
    def run(p: torch.Tensor) -> tuple[torch.Tensor, Terms]:
        total, sums = loss_sum(model, family, p, autocast=autocast, tiling=tiling)
        return total / b_eff, sums

    return run


def make_local_step(model, family, sync, b_eff: int, *, autocast: str = "none", cuda_graph: bool = False,
                    example: torch.Tensor | None = None, tiling=None) -> Callable[[torch.Tensor], Terms]:
    """A function p -> per-term loss sums that leaves this rank's gradients in ``sync``'s buffer.

    Parameters
    ----------
    model, family
        The replica and the family it trains on.
    sync : deepfusion.parallel.gradsync.GradSync
        Owner of the gradients; with ``cuda_graph`` it must be in ``flat`` mode (no hooks
        may run inside a captured graph).
    b_eff : int
        The global batch the loss is averaged over.
    autocast : {"none", "bf16"}
        Run the network under bf16 autocast.
    cuda_graph : bool
        Capture forward, loss and backward once (after ``GRAPH_WARMUP`` eager runs on a side
        stream, as CUDA requires) and replay the graph every step: the step's many small
        kernel launches become one. Needs static shapes, which training has (every step
        has the same local batch); ``example`` is a batch of that shape.
    tiling
        This rank's tile of each sample under a domain split (see :func:`loss_sum`).
    """
    run = _forward(model, family, b_eff, autocast, tiling)
    if not cuda_graph:
        def eager(p: torch.Tensor) -> Terms:
            loss, sums = run(p)
            sync.zero_grad()
            loss.backward()
            return sums

        return eager

    if sync.mode != "flat":
        raise ValueError("a CUDA-graphed step needs the flat gradient sum (hooks cannot run in a graph)")
    static = example.clone()

    def body() -> Terms:
        loss, sums = run(static)
        loss.backward()
        return sums

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(GRAPH_WARMUP):
            sync.zero_grad()
            body()
    torch.cuda.current_stream().wait_stream(side)
    # One rank: gradients None, so the captured backward allocates them in the graph's
    # pool and every replay rewrites them. P ranks: the captured backward accumulates
    # into the flat buffer's views, which are zeroed before each replay.
    sync.zero_grad()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = body()

    def replay(p: torch.Tensor) -> Terms:
        static.copy_(p)
        if sync.comm.size > 1:
            sync.buffer.zero_()
        graph.replay()
        return out

    return replay


def training_step(model, family, optimizer, *, autocast: str = "none",
                  channels_last: bool = False) -> Callable[[torch.Tensor], Terms]:
    """One rank's whole training step on a batch ``p`` (zero, forward, loss, backward, optimiser
    step), as the trainer runs it without communication: what benchmarks/flops.py and memory.py time."""

    def step(p: torch.Tensor) -> Terms:
        optimizer.zero_grad(set_to_none=True)
        total, sums = loss_sum(model, family, p, autocast=autocast, channels_last=channels_last)
        (total / p.shape[0]).backward()
        optimizer.step()
        return sums

    return step
