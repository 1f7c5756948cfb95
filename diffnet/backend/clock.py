"""Seconds per part of a generator's passes: where one instance's time goes.

A product of the networks and the coarse correction spends its time in a few parts: the network(s), the
fine Hessian the correction and the V-cycle read, the coarse operator A_c, its factorisation, the coarse
solves, the loss's gradient, a second stage's V-cycle. The generator's families accumulate each part's
seconds in one :class:`PartClock` (handed to them, never a global), which training, the evaluation and
``compare`` read and report.

On a GPU the parts' kernels run asynchronously: each part synchronises the device before it reads the time,
so that the seconds are the part's and not those of the kernels queued before it.
"""

from __future__ import annotations

import contextlib
import time
from typing import Iterator

__all__ = ["PartClock", "total", "part_text", "NETWORK", "HESSIAN", "JACOBIAN", "OPERATOR", "FACTORISATION", "SOLVES", "GRADIENT", "VCYCLE",
           "LINE_SEARCH", "SWEEPS", "POLISH", "CORRECTION_PARTS", "NEWTON_STEPS", "MINIMISED"]

NETWORK = "network"
HESSIAN = "fine Hessian"
JACOBIAN = "fine Jacobian J P"  # a residual loss's coarse Gauss-Newton: the residual's derivatives along P's columns
OPERATOR = "coarse operator A_c"
FACTORISATION = "factorisation"
SOLVES = "coarse solves"
GRADIENT = "loss gradient"
VCYCLE = "V-cycle"
SWEEPS = "sweeps"  # the Gauss-Seidel sweeps after the coarse correction (model.sweeps)
POLISH = "polish"  # the family's classical iterations that finish the product (model.polish)
LINE_SEARCH = "line search"  # a nonlinear energy's coarse Newton: the energy at the trial steps
# The coarse correction's parts (its seconds in a run's banner and reports are their sum).
CORRECTION_PARTS = (HESSIAN, JACOBIAN, OPERATOR, FACTORISATION, SOLVES, GRADIENT, LINE_SEARCH, SWEEPS)
# Tallies: a nonlinear energy's coarse Newton iterations, and the instances they minimised (their mean is the ratio).
NEWTON_STEPS = "coarse Newton iterations"
MINIMISED = "coarse minimisations"


class PartClock:
    """Seconds per named part, accumulated over passes (:meth:`part`); :meth:`total` sums some of them. ``counts``:
    named tallies beside them (:meth:`count`: a nonlinear coarse correction's Newton iterations)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def count(self, name: str, n: int) -> None:
        self.counts[name] = self.counts.get(name, 0) + int(n)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    @contextlib.contextmanager
    def part(self, name: str, device: object = None) -> Iterator[None]:
        """Time the block as the part ``name`` (a CUDA ``device``, a torch.device or its name, is synchronised at
        both ends). Imports nothing heavy: the configuration holds a clock before torch is loaded."""
        cuda = device is not None and str(device).startswith("cuda")
        if cuda:
            import torch

            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if cuda:
                torch.cuda.synchronize(device)
            self.add(name, time.perf_counter() - t0)

    def newton_steps(self) -> float | None:
        """A nonlinear coarse correction's Newton iterations per instance minimised (None where none ran)."""
        done = self.counts.get(MINIMISED, 0)
        return self.counts.get(NEWTON_STEPS, 0) / done if done else None

    def newton_text(self) -> str:
        """'; coarse Newton 2.9 iterations per instance' where a nonlinear coarse correction ran, else ''."""
        steps = self.newton_steps()
        return "" if steps is None else f"; coarse Newton {steps:.3g} iterations per instance"

    def total(self, names: tuple[str, ...] | None = None) -> float:
        """The seconds of ``names`` (default: every part)."""
        return total(self.seconds, names)

    def reset(self) -> None:
        self.seconds.clear()
        self.counts.clear()

    def per(self, count: int) -> dict[str, float]:
        """Each part's seconds divided by ``count`` (per instance), largest first."""
        return {k: v / count for k, v in sorted(self.seconds.items(), key=lambda kv: -kv[1])}


def total(parts: dict[str, float], names: tuple[str, ...] | None = None) -> float:
    """The sum of the seconds in ``parts`` (a clock's, or :meth:`PartClock.per`'s) of ``names`` (default: all)."""
    return sum(v for k, v in parts.items() if names is None or k in names)


def part_text(parts: dict[str, float]) -> str:
    """Seconds per part as one phrase, largest first: ``network 4.1 ms (60 %), coarse solves 1.2 ms (18 %), ...``."""
    whole = total(parts) or 1.0
    return ", ".join(f"{name} {seconds * 1e3:.3g} ms ({seconds / whole:.0%})"
                     for name, seconds in sorted(parts.items(), key=lambda kv: -kv[1]))
