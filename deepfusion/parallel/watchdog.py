"""A watchdog on blocking collectives: a lost node or link ends the job instead of hanging it.

A rank whose peer is gone (its node died, its link went down) waits in the next Allreduce
forever: MPI has no timeout, and over TCP a silent peer is not an error. The watchdog is a
daemon thread that looks at one deadline; each blocking collective sets it before it starts
and clears it when it returns, so a step costs two attribute writes and the thread wakes a
few times per timeout. When a deadline passes, the rank prints one line naming the step and
the operation, and ends the whole job (``MPI_Abort``, with a hard exit as the fallback should
the abort itself not get through). Checkpoints are written atomically before the next step's
collectives, so the last one is intact and the same command resumes from it.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from typing import Callable

__all__ = ["EXIT_COLLECTIVE_TIMEOUT", "Watchdog"]

EXIT_COLLECTIVE_TIMEOUT = 4
_GRACE_S = 15.0  # how long the abort may take (up to 5 s for the launcher to take the message) before the process exits on its own


class Watchdog:
    """End the job when an armed operation does not finish within ``timeout_s``.

    Parameters
    ----------
    timeout_s : float
        The longest a blocking collective may take (``parallel.collective_timeout_s``).
    rank : int
        This rank, for the message.
    abort : callable
        Called with the exit status to end every rank (the communicator's ``abort``).
    """

    def __init__(self, timeout_s: float, rank: int, abort: Callable[[int], None]) -> None:
        if timeout_s <= 0:
            raise ValueError("the collective timeout must be > 0 seconds")
        self.timeout_s = timeout_s
        self.rank = rank
        self.where = "start-up"  # the trainer's position, for the message ("step 120")
        self._abort = abort
        self._deadline: float | None = None
        self._what = ""
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="deepfusion-watchdog", daemon=True)
        self._thread.start()

    def arm(self, what: str) -> None:
        """A blocking operation ``what`` starts now."""
        self._what = what
        self._deadline = time.monotonic() + self.timeout_s

    def disarm(self) -> None:
        """The operation finished."""
        self._deadline = None

    def stop(self) -> None:
        """End the thread (nothing is watched after this)."""
        self._deadline = None
        self._stopped.set()
        self._thread.join()

    def _watch(self) -> None:
        poll = min(1.0, max(0.05, self.timeout_s / 10))
        while not self._stopped.wait(poll):
            deadline = self._deadline
            if deadline is not None and time.monotonic() > deadline:
                self._expire()
                return

    def _expire(self) -> None:
        print(f"deepfusion: rank {self.rank} ({socket.gethostname()}): {self._what} at {self.where} did not "
              f"complete within parallel.collective_timeout_s = {self.timeout_s:g} s (a rank, node or link is "
              f"lost); ending the job; the last checkpoint is intact and the same command resumes from it",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        threading.Timer(_GRACE_S, os._exit, args=(EXIT_COLLECTIVE_TIMEOUT,)).start()
        self._abort(EXIT_COLLECTIVE_TIMEOUT)
        os._exit(EXIT_COLLECTIVE_TIMEOUT)
