"""A background thread that lets MPI move gradient buckets while backward computes.

MPI progresses a non-blocking collective only inside MPI calls. Within backward the only
calls are the gradient hooks' pokes, so between two hooks -- a long convolution's backward --
a bucket already started sits still; over shared memory that costs little, over a network it
leaves the link idle (measured on emulated 1 Gb/s nodes: the bucketed sum overlapped almost
nothing of a 0.35 s transfer, where gloo's own I/O threads overlap it). MPICH's built-in
progress thread (``MPIR_CVAR_ASYNC_PROGRESS``) spins on a core and made steps slower on
these 2-core ranks; this thread sleeps between pokes instead.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

__all__ = ["ProgressThread"]


class ProgressThread:
    """Call ``poke`` every ``interval_s`` while resumed; its owner serialises its own calls with :attr:`lock`.

    Parameters
    ----------
    poke : callable
        Lets outstanding requests progress without blocking (``reducer.poke``).
    interval_s : float
        Sleep between pokes.
    """

    def __init__(self, poke: Callable[[], None], interval_s: float) -> None:
        self.lock = threading.Lock()
        self._poke = poke
        self._interval = interval_s
        self._active = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="deepfusion-progress", daemon=True)
        self._thread.start()

    def resume(self) -> None:
        """Start poking (a bucket is in flight)."""
        self._active.set()

    def pause(self) -> None:
        """Stop poking (the owner waits on the requests itself now)."""
        self._active.clear()

    def close(self) -> None:
        """End the thread."""
        self._closed = True
        self._active.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self._active.wait()
            if self._closed:
                return
            time.sleep(self._interval)
            with self.lock:
                if self._active.is_set() and not self._closed:
                    self._poke()
