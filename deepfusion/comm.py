"""Communicators: the collective operations the engine needs, passed in explicitly."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["SerialCommunicator"]


class SerialCommunicator:
    """A communicator of one rank: every collective is the identity."""

    rank = 0
    size = 1
    local_rank = 0
    local_size = 1

    def allreduce_(self, buf: Any) -> Any:
        """Sum ``buf`` across ranks in place and return it."""
        return buf

    def allreduce_scalar(self, value: float) -> float:
        """Sum a Python number across ranks."""
        return value

    def bcast(self, obj: Any, root: int = 0) -> Any:
        """Broadcast a small JSON-like object from ``root``."""
        return obj

    def bcast_array_(self, buf: np.ndarray, root: int = 0) -> np.ndarray:
        """Broadcast a numpy buffer from ``root`` in place."""
        return buf

    def barrier(self) -> None:
        """Wait for every rank."""

    def abort(self, code: int) -> None:
        """End every rank with exit status ``code``."""
        raise SystemExit(code)

    @property
    def library(self) -> str:
        """The MPI library in use."""
        return "none (serial)"
