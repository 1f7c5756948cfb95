"""Runtime placement: threads, memory allocator and device of each rank, fixed before any torch work."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["available_cores", "cache_budget", "peak_memory_bytes", "node_memory_bytes", "resolve_threads", "apply_threads", "use_huge_pages", "find_mpiexec", "mpiexec_mismatch",
           "mpi4py_vendor", "launcher_vendor", "DeviceError", "select_device", "configure_cuda"]


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, not the whole machine)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def peak_memory_bytes() -> int:
    """This process's peak resident memory so far (its high-water mark, ``ru_maxrss``: KiB on Linux, bytes on
    macOS)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def node_memory_bytes() -> int | None:
    """The node's physical memory, or None where the system does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def cache_budget(requested_gib: float, node_bytes: int | None, ranks_on_node: int) -> int:
    """Bytes one rank may keep of its instances' set-up (:mod:`diffnet.backend.budget`): ``requested_gib``, or when 0
    a third of the node's memory shared by its ranks (the rest for the network's activations, the batch's fields
    and the system), at most the caches' default."""
    from diffnet.backend.budget import DEFAULT_BYTES

    if requested_gib > 0:
        return int(requested_gib * 2**30)
    if not node_bytes:
        return DEFAULT_BYTES
    return min(DEFAULT_BYTES, node_bytes // (3 * max(1, ranks_on_node)))


def resolve_threads(requested: int, ranks_on_node: int, cores: int | None = None) -> int:
    """Threads for one rank: ``requested``, or cores on the node / ranks on it when 0."""
    if requested > 0:
        return requested
    cores = available_cores() if cores is None else cores
    return max(1, cores // max(1, ranks_on_node))


def apply_threads(threads: int) -> None:
    """Set torch's intra-op threads, OpenMP's default and the BLAS pools (numpy's and scipy's OpenBLAS) to ``threads``.

    The BLAS pools matter where scipy factorises (the coarse correction's banded Cholesky): left at the core count
    beside a busy torch, OpenBLAS's threads spun against it and a 578-unknown banded factorisation took 8-27 ms
    instead of 0.3-0.9 ms on one thread (2 cores, benchmarks/product_cost.py). A pool loaded later reads the environment; one
    already loaded is resized by threadpoolctl."""
    import torch  # here, not at import: the CLI's input checks and `jobs` need no torch
    from threadpoolctl import threadpool_limits

    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)
    torch.set_num_threads(threads)
    threadpool_limits(limits=threads, user_api="blas")


def use_huge_pages() -> None:
    """Have torch's CPU allocator back large tensors with transparent huge pages (2 MiB).

    A training step at 512^2 and above allocates and frees gigabytes of activations,
    which glibc maps and unmaps every step; with 4 KiB pages the kernel faults each page
    in again (measured at 1024^2: 4 million faults and a third of the step). torch reads
    ``THP_MEM_ALLOC_ENABLE`` at its first allocation, so this must run before any
    tensor exists; a value the user set wins.
    """
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


# What `mpiexec --version` prints, lower-cased, for each MPI family mpi4py names (``MPI.get_vendor()``).
_LAUNCHER_MARKS = {"MPICH": ("hydra", "mpich"), "Intel MPI": ("intel(r) mpi",), "Open MPI": ("open mpi", "openrte", "open-mpi")}


@functools.lru_cache(maxsize=None)
def mpi4py_vendor(python: str = sys.executable) -> str | None:
    """The MPI that ``python``'s mpi4py is built on ("MPICH", "Open MPI", "Intel MPI", ...), or None (no mpi4py).

    Asked in a child process with MPI left uninitialised (``mpi4py.rc.initialize = False``): this process may
    be a launcher's parent, which must not become a singleton MPI process itself."""
    code = ("import mpi4py; mpi4py.rc.initialize = mpi4py.rc.finalize = False; from mpi4py import MPI; "
            "print(MPI.get_vendor()[0])")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


@functools.lru_cache(maxsize=None)
def launcher_vendor(mpiexec: str) -> str | None:
    """The MPI family of an ``mpiexec`` (from its ``--version``), or None when it does not say."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout + out.stderr).lower()
    # Intel MPI's Hydra also says "hydra": its own mark first.
    for vendor in ("Intel MPI", "Open MPI", "MPICH"):
        if any(mark in text for mark in _LAUNCHER_MARKS[vendor]):
            return vendor
    return None


def _candidates() -> list[str]:
    """Every ``mpiexec`` in reach, in preference order: beside this interpreter (the ``mpich`` wheel puts it
    there), then each one on PATH in its order."""
    found = [Path(sys.executable).parent / "mpiexec"]
    found += [Path(d) / "mpiexec" for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    out: list[str] = []
    for path in found:
        if path.is_file() and os.access(path, os.X_OK) and str(path) not in out:
            out.append(str(path))
    return out


def mpiexec_mismatch() -> str | None:
    """One line when no ``mpiexec`` in reach belongs to the MPI mpi4py is built on (a site MPI's mpi4py beside
    the ``mpich`` wheel's launcher, say), else None."""
    vendor, candidates = mpi4py_vendor(), _candidates()
    if vendor is None or not candidates or find_mpiexec() is not None:
        return None
    found = ", ".join(f"{c} ({launcher_vendor(c) or 'unknown'})" for c in candidates)
    return (f"mpi4py is built on {vendor}, and no mpiexec in reach is {vendor}'s: {found}; put {vendor}'s mpiexec "
            f"first on PATH (or reinstall mpi4py against the MPI whose launcher you use)")


def find_mpiexec() -> str | None:
    """The ``mpiexec`` of the MPI this interpreter's mpi4py is built on, or None.

    A launcher of another MPI starts each rank as a singleton (every rank rank 0 of 1) or fails
    to start: the first candidate (beside this interpreter, then along PATH) whose ``--version``
    names mpi4py's MPI, or one that names none where mpi4py's MPI is unknown. None when no
    candidate matches (:func:`mpiexec_mismatch` says why in one line).
    """
    candidates, vendor = _candidates(), mpi4py_vendor()
    if vendor is None:  # no mpi4py (or it cannot say): the first launcher, as before
        return candidates[0] if candidates else None
    for path in candidates:
        if launcher_vendor(path) == vendor:
            return path
    return None


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
    from diffnet.backend.precision import set_tf32

    set_tf32(tf32)
