"""A two-level gradient sum: within each node over shared memory, across nodes among one rank per node,
optionally in bfloat16 on the network.

Each bucket's sum is a chain of non-blocking steps: a node-local ``Ireduce`` to the node's
rank 0; on that rank, the sum across nodes; a node-local ``Ibcast`` of the result. Across
nodes the sum is either an ``Iallreduce`` in the training dtype, or -- with
``parallel.grad_dtype = "bfloat16"`` -- a reduce-scatter and an all-gather of bfloat16
values built from ``Ialltoall`` and ``Iallgather`` (each node sums its share in float32, so
only the wire carries 16 bits, and every rank ends with the same rounded sum). MPICH has no
bfloat16 sum (its ``MPIX_BFLOAT16`` is null in the wheel's build, measured), hence the two
collectives; they send the same bytes per rank as a ring Allreduce, half of float32's.

Collectives on one communicator must be started in the same order on every rank, so each
kind of step has its own communicator and a bucket's chain never starts a step before the
bucket started earlier has started it.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

__all__ = ["HierarchicalReducer", "GRAD_DTYPES"]

GRAD_DTYPES = ("train", "bfloat16")


def _bf16_bits(x: torch.Tensor) -> np.ndarray:
    """``x`` rounded to bfloat16 (round to nearest even), as uint16 bit patterns."""
    return x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def _from_bf16_bits(bits: np.ndarray) -> torch.Tensor:
    """float32 values of bfloat16 bit patterns (exact)."""
    return torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16).float()


class _Chain:
    """The steps of one bucket's sum; ``step`` is how many have been started, ``request`` the pending one."""

    def __init__(self, steps: list[Callable[[], object]]) -> None:
        self.steps = steps
        self.step = 0
        self.request = None

    def done(self) -> bool:
        return self.step == len(self.steps) and self.request is None


class HierarchicalReducer:
    """Sum ranges of a flat host buffer across ranks, node by node (see the module docstring).

    Parameters
    ----------
    comm : deepfusion.parallel.comm.MPICommunicator
        The job's communicator.
    buffer : torch.Tensor
        The flat gradient buffer (CPU).
    grad_dtype : {"train", "bfloat16"}
        The type on the network: the buffer's own, or bfloat16.
    hierarchical : bool
        Reduce within each node first (else every rank takes part in the network step, which
        is how ``grad_dtype = "bfloat16"`` runs under the flat and bucketed sums).
    """

    name = "hierarchical"

    def __init__(self, comm, buffer: torch.Tensor, grad_dtype: str = "train", hierarchical: bool = True) -> None:
        if grad_dtype not in GRAD_DTYPES:
            raise ValueError(f"unknown gradient dtype {grad_dtype!r}; choose from {list(GRAD_DTYPES)}")
        if buffer.is_cuda:
            raise ValueError("the hierarchical and bfloat16 gradient sums are for host buffers")
        self.comm = comm
        self.buffer = buffer
        self.array = buffer.numpy()
        self.bf16 = grad_dtype == "bfloat16"
        if hierarchical:
            node, self.leaders = comm.hierarchy()
            self.node = node if node.size > 1 else None
        else:
            self.node, self.leaders = None, comm
        # One communicator per kind of step (see the module docstring).
        if self.node is not None:
            self._reduce_comm = self.node.comm.Dup()
            self._bcast_comm = self.node.comm.Dup()
        if self.bf16 and self.leaders is not None:
            self._scatter_comm = self.leaders.comm.Dup()
            self._gather_comm = self.leaders.comm.Dup()
        from mpi4py import MPI

        self._MPI = MPI
        self._chains: list[_Chain] = []
        # bfloat16 staging arrays of each bucket range, made on its first sum and reused every step.
        self._staging: dict[tuple[int, int], tuple[np.ndarray, ...]] = {}

    # -------------------------------------------------------------- the steps of a chain

    def _steps(self, lo: int, hi: int) -> list[Callable[[], object]]:
        MPI, part = self._MPI, self.array[lo:hi]
        steps: list[Callable[[], object]] = []
        if self.node is not None:
            root = self.node.rank == 0
            steps.append(lambda: self._reduce_comm.Ireduce(MPI.IN_PLACE if root else part, part if root else None,
                                                           op=MPI.SUM, root=0))
        if self.leaders is not None and self.leaders.size > 1:
            if self.bf16:
                steps += self._bf16_steps(lo, hi)
            else:
                steps.append(lambda: self.leaders.comm.Iallreduce(MPI.IN_PLACE, part, op=MPI.SUM))
        if self.node is not None:
            steps.append(lambda: self._bcast_comm.Ibcast(part, root=0))
        return steps

    def _bf16_steps(self, lo: int, hi: int) -> list[Callable[[], object]]:
        k = self.leaders.size
        chunk = math.ceil((hi - lo) / k)
        if (lo, hi) not in self._staging:  # send's padding past hi - lo stays zero
            send = np.zeros(k * chunk, dtype=np.uint16)
            self._staging[lo, hi] = (send, np.empty_like(send), np.empty(chunk, dtype=np.uint16), np.empty_like(send))
        send, recv, mine, gathered = self._staging[lo, hi]

        def scatter():  # my values, rounded to bf16, chunk j to node j
            send[: hi - lo] = _bf16_bits(self.buffer[lo:hi])
            return self._scatter_comm.Ialltoall(send, recv)

        def gather():  # my chunk summed over nodes in float32, rounded once, then to everyone
            mine[:] = _bf16_bits(_from_bf16_bits(recv).view(k, chunk).sum(0))
            return self._gather_comm.Iallgather(mine, gathered)

        def unpack():
            self.buffer[lo:hi] = _from_bf16_bits(gathered[: hi - lo])
            return None

        return [scatter, gather, unpack]

    # -------------------------------------------------------------- the reducer interface

    def start(self, lo: int, hi: int) -> _Chain:
        """Begin summing ``buffer[lo:hi]``; returns a handle for :meth:`wait`."""
        chain = _Chain(self._steps(lo, hi))
        self._chains.append(chain)
        self._advance(block=False)
        return chain

    def poke(self, handles: list) -> None:
        """Let the chains move on as far as their requests have completed, without blocking."""
        self._advance(block=False)

    def wait(self, handles: list) -> None:
        """Complete every chain started; the sums are in the buffer."""
        self._advance(block=True)
        self._chains = []

    def allreduce(self) -> None:
        """Sum the whole buffer, blocking."""
        self.start(0, self.buffer.numel())
        self.wait([])

    def _advance(self, block: bool) -> None:
        started_before = math.inf  # steps the previous chain has started
        for chain in self._chains:
            while not chain.done():
                if chain.request is not None:
                    if block:
                        self.comm.waitall([chain.request])  # watched by the collective watchdog
                    elif not chain.request.Test():
                        break
                    chain.request = None
                if chain.step == len(chain.steps) or chain.step >= started_before:
                    break
                chain.request = chain.steps[chain.step]()
                chain.step += 1
            started_before = chain.step
