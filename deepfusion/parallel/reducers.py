"""Gradient-buffer transports: MPI on host (or CUDA-aware device) memory, pinned-host staging, NCCL."""

from __future__ import annotations

import ctypes
import socket
from pathlib import Path

import torch

__all__ = ["MPIReducer", "StagedReducer", "NCCLReducer", "cuda_aware_mpi", "mpi_cuda_support", "make_reducer",
           "REDUCERS"]

REDUCERS = ("auto", "nccl", "mpi", "staged")


class MPIReducer:
    """Sum ranges of one flat buffer with the communicator's (non-blocking) Allreduce.

    The buffer goes to MPI as it is: host memory, or device memory when the MPI library
    is CUDA-aware. MPI does not order itself with torch's CUDA streams, so the device's
    pending work is finished before MPI reads device memory.

    Parameters
    ----------
    comm : communicator
        See :mod:`deepfusion.parallel.comm`.
    buffer : torch.Tensor
        The flat gradient buffer; every range handed to :meth:`start` is a slice of it.
    """

    name = "mpi"

    def __init__(self, comm, buffer: torch.Tensor) -> None:
        self.comm = comm
        self.buffer = buffer

    def _settle(self) -> None:
        if self.buffer.is_cuda:
            torch.cuda.current_stream(self.buffer.device).synchronize()

    def start(self, lo: int, hi: int):
        """Begin summing ``buffer[lo:hi]`` across ranks; returns a handle for :meth:`wait`."""
        self._settle()
        return self.comm.iallreduce_(self.buffer[lo:hi])

    def poke(self, handles: list) -> None:
        """Let outstanding sums progress without blocking (MPI moves only inside MPI calls)."""
        self.comm.testall([h for h in handles if h is not None])

    def wait(self, handles: list) -> None:
        """Complete the sums started by :meth:`start`; the results are in the buffer."""
        self.comm.waitall([h for h in handles if h is not None])

    def allreduce(self) -> None:
        """Sum the whole buffer across ranks, blocking."""
        self._settle()
        self.comm.allreduce_(self.buffer)


class StagedReducer(MPIReducer):
    """Through a pinned host copy: device -> host, MPI sum on the host, host -> device.

    For device buffers when the MPI library cannot read device memory. Works on a host
    buffer too (then the copies are plain memcpy), which is how CPU-only CI tests it.
    """

    name = "staged"

    def __init__(self, comm, buffer: torch.Tensor) -> None:
        super().__init__(comm, buffer)
        pin = buffer.is_cuda  # page-locked memory makes the copies DMA transfers
        self.host = torch.empty(buffer.numel(), dtype=buffer.dtype, pin_memory=pin)

    def start(self, lo: int, hi: int):
        host = self.host[lo:hi]
        host.copy_(self.buffer[lo:hi], non_blocking=True)
        self._settle()  # the copy must have landed before MPI reads the host memory
        return (self.comm.iallreduce_(host), lo, hi)

    def poke(self, handles: list) -> None:
        super().poke([h[0] for h in handles])

    def wait(self, handles: list) -> None:
        super().wait([h[0] for h in handles])
        for _, lo, hi in handles:
            self.buffer[lo:hi].copy_(self.host[lo:hi], non_blocking=True)

    def allreduce(self) -> None:
        self.host.copy_(self.buffer, non_blocking=True)
        self._settle()
        self.comm.allreduce_(self.host)
        self.buffer.copy_(self.host, non_blocking=True)


class NCCLReducer:
    """Sum device-buffer ranges with torch.distributed's NCCL backend.

    Processes are still started by mpiexec/srun and rank and size come from MPI: rank 0
    picks a free TCP port and its address, which are broadcast over MPI, and every rank
    joins the NCCL group there. NCCL orders its work with the current CUDA stream, so no
    host synchronisation is needed.
    """

    name = "nccl"

    def __init__(self, comm, buffer: torch.Tensor) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.buffer = buffer
        if not dist.is_initialized():
            address = _rendezvous_address() if comm.rank == 0 else None
            address = comm.allgather(address)[0]
            dist.init_process_group("nccl", init_method=f"tcp://{address}", rank=comm.rank,
                                    world_size=comm.size, device_id=buffer.device)

    def start(self, lo: int, hi: int):
        return self.dist.all_reduce(self.buffer[lo:hi], async_op=True)

    def poke(self, handles: list) -> None:
        """NCCL progresses on its own stream."""

    def wait(self, handles: list) -> None:
        for work in handles:
            work.wait()

    def allreduce(self) -> None:
        self.dist.all_reduce(self.buffer)


def _rendezvous_address() -> str:
    """``host:port`` of this node with a port free right now."""
    host = socket.gethostname()
    try:
        ip = socket.gethostbyname(host)
    except OSError:
        ip = "127.0.0.1"
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return f"{ip}:{port}"


def mpi_cuda_support() -> bool | None:
    """What the MPI library in this process says of CUDA device memory; None if it does not say.

    Asks ``MPIX_Query_cuda_support`` (Open MPI; MPICH 4 and later) of the MPI library
    mapped into this process (mpi4py's, once imported).
    """
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    paths = sorted({line.split()[-1] for line in maps.splitlines() if "/libmpi" in line})
    for path in paths:
        try:
            query = ctypes.CDLL(path).MPIX_Query_cuda_support
        except (OSError, AttributeError):
            continue
        query.restype = ctypes.c_int
        return bool(query())
    return None


def cuda_aware_mpi() -> bool:
    """Whether MPI can be handed CUDA device buffers directly (it says so itself)."""
    return bool(mpi_cuda_support())


def _gpus_shared(comm, device: torch.device) -> bool:
    """Whether two ranks use the same GPU of one node (NCCL refuses that; MPI does not)."""
    here = (socket.gethostname(), str(torch.cuda.get_device_properties(device).uuid) if device.type == "cuda" else "")
    places = comm.allgather(here)
    return len(set(places)) < len(places)


def make_reducer(mode: str, comm, buffer: torch.Tensor):
    """The transport for ``buffer`` under ``parallel.gpu_reduce`` = ``mode``.

    Host buffers go straight to MPI (``staged`` stages them too, for tests of that path).
    Device buffers: ``auto`` takes NCCL when torch has it and no two ranks share a GPU,
    else MPI when it is CUDA-aware, else staging; naming one forces it.
    """
    if mode not in REDUCERS:
        raise ValueError(f"unknown gradient transport {mode!r}; choose from {list(REDUCERS)}")
    if mode == "staged":
        return StagedReducer(comm, buffer)
    if not buffer.is_cuda:
        return MPIReducer(comm, buffer)
    import torch.distributed as dist

    if mode == "nccl" or (mode == "auto" and dist.is_available() and dist.is_nccl_available()
                          and not _gpus_shared(comm, buffer.device)):
        return NCCLReducer(comm, buffer)
    if mode == "mpi" or cuda_aware_mpi():
        return MPIReducer(comm, buffer)
    return StagedReducer(comm, buffer)
