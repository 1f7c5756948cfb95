"""Communicators: the collective operations the engine needs, passed in explicitly."""

from __future__ import annotations

import array
import fcntl
import os
import socket
import stat
import sys
import termios
import time
from contextlib import contextmanager, nullcontext
from typing import Iterator

import numpy as np

from deepfusion.parallel.watchdog import Watchdog

__all__ = ["SerialCommunicator", "MPICommunicator", "launched_under_mpi", "world", "abort_on_error"]

# Environment variables that MPI launchers (MPICH/Hydra, Intel MPI, Open MPI, PMIx) set
# in every rank they start.
_LAUNCHER_VARS = ("PMI_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")


def _as_array(buf: object) -> object:
    """A numpy view of a contiguous CPU tensor or array (no copy); a CUDA tensor as it is.

    mpi4py hands a CUDA tensor's device pointer (``__cuda_array_interface__``) to the MPI
    library, which must then be CUDA-aware (:func:`deepfusion.parallel.reducers.cuda_aware_mpi`).
    """
    if isinstance(buf, np.ndarray):
        arr = buf
    else:  # a torch tensor
        if not buf.is_contiguous() or buf.device.type not in ("cpu", "cuda"):
            raise ValueError("collectives need contiguous CPU (or, with CUDA-aware MPI, CUDA) buffers")
        if buf.device.type == "cuda":
            return buf.detach()
        arr = buf.detach().numpy()
    if not arr.flags.c_contiguous:
        raise ValueError("collectives need contiguous buffers")
    return arr


class SerialCommunicator:
    """A communicator of one rank: every collective is the identity."""

    rank = 0
    size = 1
    local_rank = 0
    local_size = 1
    thread_multiple = False

    def allreduce_(self, buf: object) -> object:
        """Sum ``buf`` (numpy array or CPU tensor) across ranks in place and return it."""
        return buf

    def iallreduce_(self, buf: object) -> None:
        """Start a non-blocking in-place sum; returns a request (None: nothing to wait for)."""
        return None

    def waitall(self, requests: list) -> None:
        """Complete the requests returned by :meth:`iallreduce_`."""

    def testall(self, requests: list) -> None:
        """Let outstanding requests progress without blocking."""

    def bcast_(self, buf: object, root: int = 0) -> object:
        """Broadcast a buffer from ``root`` in place."""
        return buf

    def allgather(self, obj: object) -> list:
        """Every rank's small object, in rank order."""
        return [obj]

    def barrier(self) -> None:
        """Wait for every rank."""

    def abort(self, code: int) -> None:
        """End every rank with exit status ``code``."""
        sys.exit(code)

    def watched(self, timeout_s: float):
        """Within it, a blocking collective that takes longer than ``timeout_s`` ends the job
        (:class:`deepfusion.parallel.watchdog.Watchdog`; 0: never). One rank has nothing to wait for."""
        return nullcontext()

    def mark(self, where: str) -> None:
        """Where the caller is (``"step 120"``), for the watchdog's message."""

    @property
    def library(self) -> str:
        """The MPI library in use."""
        return "none (serial)"


class MPICommunicator:
    """Collectives over an mpi4py communicator.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        The communicator to use (``MPI.COMM_WORLD`` for a whole job).
    """

    def __init__(self, comm) -> None:
        from mpi4py import MPI

        self._MPI = MPI
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank = node.Get_rank()
        self.local_size = node.Get_size()
        node.Free()
        # Whether MPI may be called from several threads at once (mpi4py asks for it).
        self.thread_multiple = MPI.Query_thread() == MPI.THREAD_MULTIPLE
        self._watchdog: Watchdog | None = None

    @contextmanager
    def watched(self, timeout_s: float) -> Iterator[None]:
        if timeout_s <= 0:
            yield
            return
        self._watchdog = Watchdog(timeout_s, self.rank, self.abort)
        try:
            yield
        finally:
            self._watchdog.stop()
            self._watchdog = None

    def mark(self, where: str) -> None:
        if self._watchdog is not None:
            self._watchdog.where = where

    @contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        dog = self._watchdog
        if dog is None:
            yield
            return
        dog.arm(what)
        try:
            yield
        finally:
            dog.disarm()

    def allreduce_(self, buf: object) -> object:
        with self._guard("an Allreduce"):
            self.comm.Allreduce(self._MPI.IN_PLACE, _as_array(buf), op=self._MPI.SUM)
        return buf

    def iallreduce_(self, buf: object):
        return self.comm.Iallreduce(self._MPI.IN_PLACE, _as_array(buf), op=self._MPI.SUM)

    def waitall(self, requests: list) -> None:
        if requests:
            with self._guard("the gradient sum"):
                self._MPI.Request.Waitall(requests)

    def testall(self, requests: list) -> None:
        if requests:
            self._MPI.Request.Testall(requests)

    def bcast_(self, buf: object, root: int = 0) -> object:
        with self._guard("a Bcast"):
            self.comm.Bcast(_as_array(buf), root=root)
        return buf

    def allgather(self, obj: object) -> list:
        with self._guard("an Allgather"):
            return self.comm.allgather(obj)

    def barrier(self) -> None:
        with self._guard("a Barrier"):
            self.comm.Barrier()

    def hierarchy(self) -> tuple["MPICommunicator", "MPICommunicator | None"]:
        """(this node's ranks, one rank per node), the second on node-local rank 0 only (collective).

        The node communicator groups the ranks that share memory; the leaders' communicator
        holds each node's local rank 0, in node order, and is None elsewhere.
        """
        MPI = self._MPI
        node = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        leaders = self.comm.Split(0 if node.Get_rank() == 0 else MPI.UNDEFINED, key=self.rank)
        wrap = lambda c: None if c == MPI.COMM_NULL else _sub(c, self)  # noqa: E731
        return wrap(node), wrap(leaders)

    def split(self, color: int, key: int) -> "MPICommunicator":
        """The ranks of the same ``color``, ordered by ``key`` (collective; shares this watchdog)."""
        return _sub(self.comm.Split(color, key), self)

    def abort(self, code: int) -> None:
        """End every rank of the job with status ``code``, after this rank's last lines have left it."""
        drain_stdio()
        self.comm.Abort(code)

    @property
    def library(self) -> str:
        return " ".join(self._MPI.Get_library_version().split("\n", 1)[0].split())


def _sub(comm, parent: MPICommunicator) -> MPICommunicator:
    """A sub-communicator sharing ``parent``'s watchdog (its blocking waits are watched too)."""
    sub = MPICommunicator(comm)
    sub._guard = parent._guard  # the parent's watchdog, whenever it is set
    return sub


def launched_under_mpi(environ: dict[str, str] | None = None) -> bool:
    """Whether an MPI launcher started this process with more than one rank possible."""
    env = os.environ if environ is None else environ
    if any(var in env for var in _LAUNCHER_VARS):
        return True
    # srun sets SLURM_PROCID for every task, also without MPI; count only multi-task steps.
    return "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1") or 1) > 1


def world() -> SerialCommunicator | MPICommunicator:
    """The job's communicator: MPI's world when launched by mpiexec/srun with P > 1.

    MPI is initialised only when a launcher started the process, so a plain
    ``deepfusion`` on a laptop never touches the MPI library.
    """
    if not launched_under_mpi():
        return SerialCommunicator()
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_size() == 1:
        return SerialCommunicator()
    return MPICommunicator(MPI.COMM_WORLD)


_DRAIN_S = 5.0  # the longest an aborting rank waits for its launcher to take its last lines


def _unread(fd: int) -> int:
    """Bytes written to ``fd`` that its reader has not taken yet (0 where that cannot be known)."""
    try:
        mode = os.fstat(fd).st_mode
        count = array.array("i", [0])
        if stat.S_ISFIFO(mode):  # a pipe (Hydra's proxy, srun): the bytes still in it
            fcntl.ioctl(fd, termios.FIONREAD, count)
        elif stat.S_ISSOCK(mode):  # a socket: the bytes its peer has not acknowledged
            fcntl.ioctl(fd, termios.TIOCOUTQ, count)
        return count[0]
    except OSError:  # a file or terminal: written is delivered
        return 0


def drain_stdio(timeout_s: float = _DRAIN_S) -> None:
    """Flush stdout and stderr and wait (at most ``timeout_s``) until their readers have taken every byte.

    A rank's output reaches the user through the launcher's proxy, which reads the rank's pipes and
    forwards them. MPI_Abort makes the proxy kill its ranks and close those pipes; a line still
    unread in a pipe then never arrives (seen under load: a job that ended with status 4 and an empty
    stderr). Aborting only once the pipes are empty makes the message precede the abort.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    deadline = time.monotonic() + timeout_s
    while (_unread(1) or _unread(2)) and time.monotonic() < deadline:
        time.sleep(0.005)


@contextmanager
def abort_on_error(comm, code: int = 1) -> Iterator[None]:
    """End every rank when this rank raises, instead of leaving the others in a collective.

    The exception is printed with the rank that raised it, then MPI_Abort takes the
    whole job down. With one rank the exception propagates as usual.
    """
    if comm.size == 1:
        yield
        return
    try:
        yield
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - anything left uncaught would hang the others
        host = socket.gethostname()
        print(f"deepfusion: error on rank {comm.rank} ({host}): {type(exc).__name__}: {exc}", file=sys.stderr)
        comm.abort(code)
