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

from diffnet.grid.nodal import over_unknowns

__all__ = ["draw_parameters", "Moments", "run_study", "summary"]


def draw_parameters(family, n: int, distribution: str, seed: int) -> np.ndarray:
    """N instances of the family from one of its laws (``problem.parameters.distributions``; uniform on
    the training range for every family, standard normal for the KL families' coefficients)."""
    spec = family.parameters
    if distribution not in spec.distributions:
        raise ValueError(f"the {family.name} family draws from {', '.join(spec.distributions)} "
                         f"(got {distribution!r})")
    return family.draw(n, distribution, seed)


@dataclass
class Moments:
    """Running count, mean and sum of squared deviations of fields, merged batch by batch
    (Chan, Golub & LeVeque's pairwise update: no cancellation from summing squares).

    On a family with a domain that moves with the instance, each node's statistics are over the
    samples whose domain holds it (``inside``): ``count`` is then per node, and a node that no
    sample's domain holds has no mean (NaN), rather than a mean pulled towards the zeros written
    outside."""

    count: np.ndarray | int = 0
    mean: np.ndarray | None = None
    m2: np.ndarray | None = None
    samples: int = 0

    def add(self, batch: np.ndarray, inside: np.ndarray | None = None) -> None:
        """Merge a batch of fields (B, *grid) or (B, C, *grid); ``inside`` (B, *grid) bool, the nodes each sample's
        domain holds (the same for each of its unknowns)."""
        batch = np.asarray(batch, dtype=np.float64)
        self.samples += len(batch)
        if inside is None:
            n_b = len(batch)
            mean_b = batch.mean(axis=0)
            m2_b = ((batch - mean_b) ** 2).sum(axis=0)
        else:
            w = over_unknowns(np.asarray(inside, dtype=np.float64), batch)
            n_b = w.sum(axis=0)
            mean_b = _ratio((w * batch).sum(axis=0), n_b)
            m2_b = (w * (batch - mean_b) ** 2).sum(axis=0)
        if self.mean is None:
            self.count, self.mean, self.m2 = n_b, mean_b, m2_b
            return
        n = self.count + n_b
        delta = mean_b - self.mean
        self.mean = self.mean + delta * _ratio(n_b, n)
        self.m2 = self.m2 + m2_b + delta**2 * _ratio(self.count * n_b, n)
        self.count = n

    @property
    def std(self) -> np.ndarray:
        """The sample standard deviation (divisor N - 1 at each node; zero for a single sample)."""
        std = np.sqrt(self.m2 / np.maximum(self.count - 1, 1))
        return np.where(np.asarray(self.count) > 0, std, np.nan)

    @property
    def mean_inside(self) -> np.ndarray:
        """The mean, NaN at the nodes no sample's domain holds."""
        return np.where(np.asarray(self.count) > 0, self.mean, np.nan)

    @property
    def inside_fraction(self) -> np.ndarray:
        """Per node, the fraction of the samples whose domain holds it (for fields of several unknowns, (C, *grid):
        the same for each)."""
        return np.broadcast_to(np.asarray(self.count, dtype=np.float64), self.mean.shape) / self.samples


def _ratio(a, b):
    """a / b where b > 0, else 0 (a node no sample has reached yet)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return np.divide(a, b, out=np.zeros(np.broadcast(a, b).shape), where=b > 0)


def summary(fields: dict[str, np.ndarray], coords: dict[str, np.ndarray]) -> dict:
    """Per statistics field: its range and mean over the nodes it has a value at, and where its maximum is."""
    out = {}
    for name, value in fields.items():
        known = np.isfinite(value)
        if not known.any():
            continue
        at = np.unravel_index(np.nanargmax(value), value.shape)
        out[name] = {"min": float(np.nanmin(value)), "max": float(np.nanmax(value)),
                     "mean": float(np.nanmean(value)), "nodes": int(known.sum()),
                     "argmax": {axis: float(coords[axis][i]) for axis, i in zip(coords, at)}}
    return out


@dataclass
class Study:
    """One method's statistics over the instances and its seconds."""

    moments: Moments = field(default_factory=Moments)
    seconds: float = 0.0
    kept: np.ndarray | None = None


def run_study(solve_batch: Callable[[np.ndarray], tuple[np.ndarray, float]], instances: np.ndarray, batch: int,
              label: str, keep: int = 0, say=print,
              inside: Callable[[np.ndarray], np.ndarray] | None = None) -> Study:
    """Solve ``instances`` ``batch`` at a time and merge the moments, with a progress line every 5 s.

    ``solve_batch`` returns the batch's fields and the seconds its solves took (so that
    carrying a classical solution onto the network's grid is not counted); the first
    ``keep`` fields are kept in ``Study.kept`` for the Monte Carlo check. ``inside``, for a family
    with a domain, gives the nodes each instance's domain holds (:class:`Moments`).
    """
    study = Study()
    n = len(instances)
    last = time.perf_counter()
    kept = []
    for start in range(0, n, batch):
        fields, seconds = solve_batch(instances[start : start + batch])
        study.seconds += seconds
        study.moments.add(fields, None if inside is None else inside(instances[start : start + batch]))
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

