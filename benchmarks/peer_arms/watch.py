"""A training clock that stops at a budget and records the held-out error along the way, its evaluations not
counted (each peer's error against its own training seconds)."""

from __future__ import annotations

import sys
import time
from typing import Callable

import numpy as np


class Watch:
    """Training seconds (evaluations excluded), the budget's end, and the error curve.

    Parameters
    ----------
    budget : float
        Training seconds allowed.
    score : callable
        Held-out fields (numpy) -> mean relative L2 error against the truth.
    points : int
        About how many times to evaluate along the budget (log-spaced, so the curve's start is seen too).
    label : str
        The arm's name in the progress lines.
    """

    def __init__(self, budget: float, score: Callable[[np.ndarray], float], points: int = 16, label: str = "") -> None:
        self.budget, self.score, self.label = float(budget), score, label
        first = min(2.0, self.budget / 4)
        self.marks = list(np.geomspace(first, self.budget, max(points, 2)))
        self.curve: list[dict] = []
        self._start = time.perf_counter()
        self._paused = 0.0

    def seconds(self) -> float:
        """Training seconds so far (what the evaluations took left out)."""
        return time.perf_counter() - self._start - self._paused

    def over(self) -> bool:
        return self.seconds() >= self.budget

    def due(self) -> bool:
        """Whether an evaluation is due (a mark passed)."""
        return bool(self.marks) and self.seconds() >= self.marks[0]

    def record(self, fields: Callable[[], np.ndarray], **extra) -> float:
        """Evaluate now, off the clock: ``fields()`` gives the held-out fields; returns their error."""
        now = self.seconds()
        t0 = time.perf_counter()
        error = float(self.score(fields()))
        self.curve.append({"seconds": now, "error": error, **extra})
        while self.marks and self.marks[0] <= now:
            self.marks.pop(0)
        self._paused += time.perf_counter() - t0
        print(f"  {self.label}: {now:7.1f} s  held-out error {error:.5f}"
              + "".join(f"  {k} {v}" for k, v in extra.items()), file=sys.stderr, flush=True)
        return error
