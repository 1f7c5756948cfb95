"""Many-query statistics: the mean and standard deviation of the solution over the family's distribution.

What a trained surrogate exists for: N instances drawn from the parameter distribution,
solved in batches, reduced to mean and standard-deviation fields in one pass (the
moments are merged batch by batch, so N is bounded by time, not memory).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

__all__ = ["draw_parameters", "Moments", "run_study"]


def draw_parameters(problem, n: int, distribution: str, seed: int) -> np.ndarray:
    """N instances of the family from one of its laws (``problem.parameters.distributions``; uniform on
    the training range for every family, standard normal for the KL families' coefficients)."""
    spec = problem.parameters
    if distribution not in spec.distributions:
        raise ValueError(f"the {problem.name} family draws from {', '.join(spec.distributions)} "
                         f"(got {distribution!r})")
    return problem.draw(n, distribution, seed)


@dataclass
class Moments:
    """Running count, mean and sum of squared deviations of fields, merged batch by batch
    (Chan, Golub & LeVeque's pairwise update: no cancellation from summing squares)."""

    count: int = 0
    mean: np.ndarray | None = None
    m2: np.ndarray | None = None

    def add(self, batch: np.ndarray) -> None:
        """Merge a batch of fields (B, ...)."""
        batch = np.asarray(batch, dtype=np.float64)
        n_b = len(batch)
        mean_b = batch.mean(axis=0)
        m2_b = ((batch - mean_b) ** 2).sum(axis=0)
        if self.count == 0:
            self.count, self.mean, self.m2 = n_b, mean_b, m2_b
            return
        n = self.count + n_b
        delta = mean_b - self.mean
        self.mean = self.mean + delta * (n_b / n)
        self.m2 = self.m2 + m2_b + delta**2 * (self.count * n_b / n)
        self.count = n

    @property
    def std(self) -> np.ndarray:
        """The sample standard deviation (divisor N - 1; zero for a single sample)."""
        return np.sqrt(self.m2 / max(self.count - 1, 1))


@dataclass
class Study:
    """One method's statistics over the instances and its seconds."""

    moments: Moments = field(default_factory=Moments)
    seconds: float = 0.0
    kept: np.ndarray | None = None


def run_study(solve_batch: Callable[[np.ndarray], tuple[np.ndarray, float]], params: np.ndarray, batch: int,
              label: str, keep: int = 0, say=print) -> Study:
    """Solve ``params`` ``batch`` at a time and merge the moments, with a progress line every 5 s.

    ``solve_batch`` returns the batch's fields and the seconds its solves took (so that
    carrying a classical solution onto the network's grid is not counted); the first
    ``keep`` fields are kept in ``Study.kept`` for the Monte Carlo check.
    """
    study = Study()
    n = len(params)
    last = time.perf_counter()
    kept = []
    for start in range(0, n, batch):
        fields, seconds = solve_batch(params[start : start + batch])
        study.seconds += seconds
        study.moments.add(fields)
        if start < keep:
            kept.append(np.asarray(fields[: keep - start], dtype=np.float64))
        done = min(start + batch, n)
        if time.perf_counter() - last > 5.0 or done == n:
            rate = done / study.seconds if study.seconds > 0 else float("inf")
            eta = (n - done) / rate if rate > 0 else 0.0
            say(f"  {label}: {done}/{n} instances, {study.seconds:.1f} s, ETA {eta:.0f} s")
            last = time.perf_counter()
    study.kept = np.concatenate(kept) if kept else None
    return study

