"""The cheapest classical solve that is as accurate as a DiffNet: a refinement search, timed.

McGreivy & Hakim (Nature Machine Intelligence, 2024) ask two things of a claim that a
network beats a numerical method: compare at equal accuracy, and against a strong
method. Here the network's mean error against the independent reference is the target;
every classical configuration (grid, method) of a family's ``classical_configurations()``
is solved coarse to fine on the same instances, carried onto the network's nodes and
measured against the same reference, until it meets the target. The cheapest
configuration that meets it is the one a speed comparison must time.

What an engineer reads counts too: a family's derived fields (stress, flux) have targets of their own, the
network's mean error in each, and a configuration matches only when it ties every one of them and the field's.
The target a match is hardest to meet for is the one that **binds**: the match's grid is set by it.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

__all__ = ["TIE", "Point", "search", "ties", "meets", "cheapest", "binding", "break_even", "best_time"]


@dataclass(frozen=True)
class Point:
    """One classical configuration on the instances: mean relative L2 error against the reference
    on the network's nodes, and median over the instances of each solve's best time (:func:`best_time`)
    on its own grid."""

    method: str
    grid: int
    error: float
    seconds: float
    newton_steps: float | None = None  # a nonlinear solve's mean Newton steps per instance (all load steps')
    derived: dict | None = None  # derived field -> its mean relative L2 error against the truth's (stress, flux)

    def as_dict(self) -> dict:
        return asdict(self)


# Past the first grid that meets the target the search still measures grids at most this much
# larger: a grid one node wider can be much cheaper (the network's 128^2 grid against 129^2,
# whose hierarchy nests: 15 against 5.6 ms per solve).
SAME_SIZE = 1.05

# A tie: a classical configuration within this factor of the network's error counts as equally accurate. The
# reading that favours the classical side: without it a network 2.6 % under FMG's error on its own grid pushed the
# match to a grid 1.5x finer at 3.2x the time (Poisson 128² + 1 V-cycle, issue 65), a win no user would see.
TIE = 1.05


def search(configurations: dict[str, list[int]], solve_on: Callable[[str, int], tuple[np.ndarray, list[float]]],
          error_of: Callable[[np.ndarray], np.ndarray], target: float, say=print,
          derived_of: Callable[[np.ndarray], dict] | None = None, derived_targets: dict | None = None) -> list[Point]:
    """Walk each method's grids coarse to fine until one meets ``target``; every point measured.

    Parameters
    ----------
    configurations : dict
        Method -> grids, coarse to fine.
    solve_on : callable
        (method, grid) -> (the instances' fields on the network's nodes, seconds of each solve).
    error_of : callable
        Fields -> per-instance relative L2 error against the reference.
    target : float
        The error to reach (the network's mean error).
    derived_of : callable, optional
        Fields -> derived field name -> mean relative error against the truth's (stress, flux).
    derived_targets : dict, optional
        Derived field name -> the error to reach in it (the network's).

    Returns
    -------
    list of Point
        Every configuration tried, in the order tried; a method stops at the first of its
        grids that ties ``target`` and every derived target (mean errors at most :data:`TIE` times them) and the
        grids within 5 % of its size (or at its finest grid).
    """
    points = []
    derived_targets = derived_targets or {}
    for method, grids in configurations.items():
        met = None
        for grid in grids:
            if met is not None and grid > SAME_SIZE * met:
                break
            fields, seconds = solve_on(method, grid)
            derived = {k: float(v) for k, v in derived_of(fields).items()} if derived_of and derived_targets else None
            point = Point(method, grid, float(np.mean(error_of(fields))), statistics.median(seconds),
                          getattr(seconds, "newton_steps", None), derived)
            points.append(point)
            ok = meets(point, target, derived_targets)
            say(f"    {method:9s} grid {grid:5d}: error {point.error:.4f}"
                + "".join(f", {k} {v:.4f}" for k, v in (derived or {}).items() if k in derived_targets)
                + f", {point.seconds * 1e3:8.2f} ms per instance"
                + ("" if point.newton_steps is None else f" ({point.newton_steps:.3g} Newton steps)")
                + ("  <- meets the targets" if ok else ""))
            if ok and met is None:
                met = grid
    return points


def ties(error: float, target: float) -> bool:
    """Whether a classical error counts as equal to the network's ``target``: at most :data:`TIE` times it."""
    return error <= TIE * target


def meets(point: Point, target: float, derived_targets: dict | None = None) -> bool:
    """Whether ``point`` ties the field's ``target`` and every one of ``derived_targets`` (:func:`ties`)."""
    return ties(point.error, target) and all(ties((point.derived or {}).get(k, np.inf), v)
                                             for k, v in (derived_targets or {}).items())


def cheapest(points: list[Point], target: float, derived_targets: dict | None = None) -> Point | None:
    """The fastest point that ties ``target`` and every derived target (:func:`meets`); None when no configuration
    reaches them."""
    meeting = [p for p in points if meets(p, target, derived_targets)]
    return min(meeting, key=lambda p: p.seconds) if meeting else None


def binding(points: list[Point], target: float, derived_targets: dict | None = None, field: str = "field") -> str:
    """Which target sets the match: the one (``field``, or a derived field's name) whose own cheapest tie costs the
    most; ``field`` where no derived target is given or none is met alone."""
    costs = {field: cheapest(points, target)}
    for name, value in (derived_targets or {}).items():
        alone = [p for p in points if ties((p.derived or {}).get(name, np.inf), value)]
        costs[name] = min(alone, key=lambda p: p.seconds) if alone else None
    met = {k: p.seconds for k, p in costs.items() if p is not None}
    if len(met) < len(costs):  # a target no configuration meets binds
        return next(k for k, p in costs.items() if p is None)
    return max(met, key=met.get)


def break_even(train_seconds: float | None, classical_s: float, diffnet_s: float) -> float | None:
    """Queries N* after which training plus N inferences cost less than N classical solves:
    train / (classical - DiffNet) per instance; None ("never") when the network is not faster
    per instance, or the training time is unknown."""
    if train_seconds is None or classical_s <= diffnet_s:
        return None
    return train_seconds / (classical_s - diffnet_s)


def timed(fn: Callable, *args) -> tuple[object, float]:
    """``fn(*args)`` and its wall-clock seconds."""
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def best_time(fn: Callable, *args, budget_s: float = 0.2, most: int = 25,
              before: Callable[[], None] | None = None) -> tuple[object, float]:
    """``fn(*args)`` and its best wall-clock seconds over repeats: at least one call, more while
    their total stays under ``budget_s`` (at most ``most``); ``before``, untimed, before each call
    (a family's ``clear_caches``: every repeat builds its own per-instance set-up).

    The best of repeats, as :mod:`timeit` advises: what a call costs when nothing else
    interferes. One timing per instance let the choice between two configurations a
    few milliseconds apart flip from run to run (FMG at 49^2 against FMG-1 at 64^2).
    """
    before = before or (lambda: None)
    before()
    out, best = timed(fn, *args)
    total, calls = best, 1
    while total < budget_s and calls < most:
        before()
        _, dt = timed(fn, *args)
        best, total, calls = min(best, dt), total + dt, calls + 1
    return out, best
