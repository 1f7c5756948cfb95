"""Runtime placement: threads per rank and the memory allocator, applied before any torch work."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

__all__ = ["available_cores", "resolve_threads", "apply_threads", "use_huge_pages", "find_mpiexec"]


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
