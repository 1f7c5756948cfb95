"""Runtime placement: threads, memory allocator and device of each rank, fixed before any torch work."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

__all__ = ["available_cores", "resolve_threads", "apply_threads", "use_huge_pages", "find_mpiexec", "DeviceError",
           "select_device", "configure_cuda"]


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, not the whole machine)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def resolve_threads(requested: int, ranks_on_node: int, cores: int | None = None) -> int:
    """Threads for one rank: ``requested``, or cores on the node / ranks on it when 0."""
    if requested > 0:
        return requested
    cores = available_cores() if cores is None else cores
    return max(1, cores // max(1, ranks_on_node))


def apply_threads(threads: int) -> None:
    """Set torch's intra-op threads and OpenMP's default to ``threads``."""
    import torch  # here, not at import: the CLI's input checks and `jobs` need no torch

    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


def use_huge_pages() -> None:
    """Have torch's CPU allocator back large tensors with transparent huge pages (2 MiB).

    A training step at 512^2 and above allocates and frees gigabytes of activations,
    which glibc maps and unmaps every step; with 4 KiB pages the kernel faults each page
    in again (measured at 1024^2: 4 million faults and a third of the step). torch reads
    ``THP_MEM_ALLOC_ENABLE`` at its first allocation, so this must run before any
    tensor exists; a value the user set wins.
    """
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


def find_mpiexec() -> str | None:
    """The ``mpiexec`` matching this interpreter's mpi4py, or None.

    The launcher must belong to the MPI that mpi4py uses: prefer the one installed beside
    this interpreter (the ``mpich`` wheel puts it there), then the first on PATH.
    """
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


class DeviceError(ValueError):
    """The configured device is not usable here (a user error: exit status 2)."""


def select_device(requested: str, local_rank: int, local_size: int, *, cuda_available: bool | None = None,
                  gpu_count: int | None = None) -> str:
    """The torch device string for this rank: ``"cpu"``, or ``"cuda:I"`` one GPU per rank.

    Local rank r of the node takes GPU r. When the launcher has already given each rank
    its own GPU (``srun --gpus-per-task=1``, or ``CUDA_VISIBLE_DEVICES`` set per rank),
    each rank sees exactly one and takes it.

    Parameters
    ----------
    requested : {"cpu", "cuda"}
        ``parallel.device``.
    local_rank, local_size : int
        This rank's index among the ranks on its node, and their number.
    cuda_available, gpu_count : optional
        What torch reports (``torch.cuda.is_available()``, ``device_count()``) when not given.

    Raises
    ------
    DeviceError
        CUDA asked for and not present, or fewer GPUs than ranks on the node.
    """
    if requested == "cpu":
        return "cpu"
    if requested != "cuda":
        raise DeviceError(f"parallel.device: unknown device {requested!r}; choose 'cpu' or 'cuda'")
    if cuda_available is None or gpu_count is None:
        import torch

        cuda_available = torch.cuda.is_available() if cuda_available is None else cuda_available
        gpu_count = torch.cuda.device_count() if gpu_count is None else gpu_count
    if not cuda_available or gpu_count < 1:
        raise DeviceError("parallel.device = 'cuda' but no CUDA device is usable here "
                          "(no GPU visible, or a CPU-only torch); set parallel.device = 'cpu'")
    if gpu_count == 1:
        return "cuda:0"
    if local_size > gpu_count:
        raise DeviceError(f"parallel.device = 'cuda': {local_size} ranks on this node but {gpu_count} GPUs; "
                          f"start at most one rank per GPU")
    return f"cuda:{local_rank}"


def configure_cuda(tf32: bool) -> None:
    """TF32 for float32 matrix products and convolutions on Ampere and later, on or off."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
