"""Graceful stop: SIGTERM/SIGINT become a request honoured at the next step boundary."""

from __future__ import annotations

import signal
from contextlib import contextmanager
from types import FrameType
from typing import Iterator

import numpy as np

__all__ = ["StopRequest", "stop_on_signals"]


class StopRequest:
    """A flag set by a signal handler and read by the training loop.

    The handler only records the signal: the loop agrees on it with the other ranks at
    the next step boundary, writes a checkpoint and returns, so no rank is left inside
    a collective and no checkpoint is cut short. A second SIGINT (Ctrl-C twice) raises
    :class:`KeyboardInterrupt` at once.
    """

    def __init__(self) -> None:
        self.signal: str | None = None

    @property
    def requested(self) -> bool:
        """Whether a stop was asked for on this rank."""
        return self.signal is not None

    def agreed(self, comm) -> bool:
        """Whether any rank was asked to stop (one tiny Allreduce, so every rank must call it)."""
        flag = np.array([1.0 if self.requested else 0.0])
        comm.allreduce_(flag)
        return bool(flag[0] > 0)

    def request(self, name: str) -> None:
        """Ask for a stop (what the handler does; also usable directly)."""
        self.signal = self.signal or name

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if name == "SIGINT" and self.signal == "SIGINT":
            raise KeyboardInterrupt
        self.request(name)


@contextmanager
def stop_on_signals(signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> Iterator[StopRequest]:
    """Turn ``signals`` into a :class:`StopRequest` while the block runs, then restore the handlers."""
    stop = StopRequest()
    previous = {s: signal.signal(s, stop._handle) for s in signals}
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
