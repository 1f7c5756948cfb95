"""Gradient summation across ranks: one flat Allreduce, or buckets overlapped with backward (summed
by MPI's Allreduce, or node by node; in the training dtype or bfloat16)."""

from __future__ import annotations

import hashlib
from contextlib import nullcontext

import torch

from deepfusion.parallel.hierarchical import HierarchicalReducer
from deepfusion.parallel.progress import ProgressThread
from deepfusion.parallel.reducers import make_reducer

__all__ = ["GradSync", "GRADSYNC_MODES", "ParameterDrift", "broadcast_parameters", "check_parameters"]

GRADSYNC_MODES = ("bucketed", "flat", "hierarchical")


class ParameterDrift(RuntimeError):
    """Ranks hold different parameters."""


class GradSync:
    """Sum gradients across ranks, in place, into one flat buffer that the grads view.

    With more than one rank, every parameter's ``.grad`` is made a view into one
    contiguous buffer (laid out in reverse registration order, roughly the order backward
    produces them), so autograd accumulates straight into it and no copy is needed before
    or after communication. With one rank the gradients are left to autograd.

    Parameters
    ----------
    model : torch.nn.Module
        The replica on this rank.
    comm : communicator
        See :mod:`deepfusion.parallel.comm`.
    mode : {"bucketed", "flat", "hierarchical"}
        ``flat``: one blocking Allreduce of the whole buffer after backward.
        ``bucketed``: the buffer is cut into buckets of about ``bucket_mb`` MiB; a
        non-blocking Allreduce of a bucket starts from a gradient hook as soon as its
        last gradient is accumulated, so communication overlaps the rest of backward.
        ``hierarchical``: the same buckets, each summed within the node, then across
        nodes among one rank per node, then broadcast within the node
        (:mod:`deepfusion.parallel.hierarchical`).
    bucket_mb : float
        Target bucket size in MiB.
    transport : {"auto", "nccl", "mpi", "staged"}
        How the buffer is summed (:func:`deepfusion.parallel.reducers.make_reducer`): host
        buffers through MPI; device buffers through NCCL, CUDA-aware MPI or pinned host
        staging. The buckets, hooks and semantics are the same for all.
    grad_dtype : {"train", "bfloat16"}
        The type the sum travels in between nodes (host buffers only): the gradients' own,
        or bfloat16 (half the bytes; each node's share is summed in float32).
    progress_ms : float
        With buckets, poke MPI from a background thread every ``progress_ms`` while
        buckets are in flight (:mod:`deepfusion.parallel.progress`); 0: only from the hooks.
    """

    def __init__(
        self, model: torch.nn.Module, comm, mode: str = "bucketed", bucket_mb: float = 4.0, transport: str = "auto",
        grad_dtype: str = "train", progress_ms: float = 1.0,
    ) -> None:
        if mode not in GRADSYNC_MODES:
            raise ValueError(f"unknown gradient sync mode {mode!r}")
        self.comm = comm
        self.mode = mode
        weights = [p for p in model.parameters() if p.requires_grad]
        self._params = weights
        ordered = list(reversed(weights))
        total = sum(p.numel() for p in ordered)
        first = ordered[0]
        self._numel = total
        self.buffer = torch.zeros(total if comm.size > 1 else 0, dtype=first.dtype, device=first.device)
        # Buckets: contiguous ranges of the buffer, each closed once it reaches the size.
        limit = max(1, int(bucket_mb * 2**20 / self.buffer.element_size()))
        self.buckets: list[tuple[int, int]] = []
        self._sizes: list[int] = []  # parameters in each bucket
        self._bucket_of: dict[int, int] = {}
        offset, start, members = 0, 0, 0
        for p in ordered:
            n = p.numel()
            if comm.size > 1:
                p.grad = self.buffer[offset : offset + n].view_as(p)
            self._bucket_of[id(p)] = len(self.buckets)
            offset += n
            members += 1
            if offset - start >= limit:
                self.buckets.append((start, offset))
                self._sizes.append(members)
                start, members = offset, 0
        if start < offset:
            self.buckets.append((start, offset))
            self._sizes.append(members)
        self.reducer = None
        if comm.size > 1 and (mode == "hierarchical" or grad_dtype != "train"):
            self.reducer = HierarchicalReducer(comm, self.buffer, grad_dtype, hierarchical=mode == "hierarchical")
        elif comm.size > 1:
            self.reducer = make_reducer(transport, comm, self.buffer)
        self._pending = [0] * len(self.buckets)
        self._requests: list = []
        self._hooks = []
        self._pump = None
        if mode != "flat" and comm.size > 1:
            for p in ordered:
                self._hooks.append(p.register_post_accumulate_grad_hook(self._ready))
            # NCCL progresses on its own; the thread needs an MPI that takes calls from two threads.
            if progress_ms > 0 and self.reducer.name != "nccl" and comm.thread_multiple:
                self._pump = ProgressThread(lambda: self.reducer.poke(self._requests), progress_ms / 1e3)
        # Serialises this thread's reducer calls with the progress thread's (none without it).
        self._lock = self._pump.lock if self._pump else nullcontext()

    @property
    def numel(self) -> int:
        """Scalars communicated per step."""
        return self._numel

    def zero_grad(self) -> None:
        """Zero the gradient buffer (keeping the views) and arm the buckets."""
        if self.comm.size == 1:
            # Nothing to communicate: let autograd write fresh gradients rather than
            # accumulate into a zeroed buffer (one pass less over the gradient memory).
            for p in self._params:
                p.grad = None
            return
        self.buffer.zero_()
        self._pending = list(self._sizes)
        self._requests = []

    def _ready(self, p: torch.Tensor) -> None:
        k = self._bucket_of[id(p)]
        self._pending[k] -= 1
        with self._lock:
            if self._pending[k] == 0:
                start, stop = self.buckets[k]
                self._requests.append(self.reducer.start(start, stop))
                if self._pump:
                    self._pump.resume()
            # MPI progresses non-blocking collectives only inside MPI calls: poke it.
            self.reducer.poke(self._requests)

    def finish(self) -> None:
        """Complete the sum: wait for the buckets, or run the flat Allreduce."""
        if self.comm.size == 1:
            return
        if self.mode == "flat":
            self.reducer.allreduce()
            return
        if self._pump:
            self._pump.pause()
        with self._lock:  # a poke may still be under way
            if any(self._pending):
                # A parameter got no gradient this step (unused in the graph): its bucket
                # never closed, so reduce those buckets now, in the same order on every rank.
                for k, left in enumerate(self._pending):
                    if left:
                        start, stop = self.buckets[k]
                        self._requests.append(self.reducer.start(start, stop))
                        self._pending[k] = 0
            self.reducer.wait(self._requests)
        self._requests = []

    def close(self) -> None:
        """Remove the gradient hooks and end the progress thread."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._pump:
            self._pump.close()
            self._pump = None
            self._lock = nullcontext()


def _state_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    return [t for t in model.state_dict().values() if t.is_floating_point() or t.dtype == torch.int64]


def broadcast_parameters(model: torch.nn.Module, comm, root: int = 0) -> None:
    """Overwrite every rank's parameters and buffers with those of ``root``."""
    if comm.size == 1:
        return
    with torch.no_grad():
        for t in _state_tensors(model):
            tmp = t.detach().cpu().contiguous().clone()  # through host memory: any device
            comm.bcast_(tmp, root=root)
            t.copy_(tmp)


def parameter_digest(model: torch.nn.Module) -> str:
    """A SHA-1 of every parameter's and buffer's bytes (cheap next to a training step)."""
    h = hashlib.sha1()
    for t in _state_tensors(model):
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def check_parameters(model: torch.nn.Module, comm, step: int) -> None:
    """Raise :class:`ParameterDrift` on every rank if any two ranks' parameters differ."""
    if comm.size == 1:
        return
    digests = comm.allgather(parameter_digest(model))
    if len(set(digests)) > 1:
        odd = [r for r, d in enumerate(digests) if d != digests[0]]
        raise ParameterDrift(f"parameters differ across ranks at step {step} (ranks {odd} differ from rank 0)")
