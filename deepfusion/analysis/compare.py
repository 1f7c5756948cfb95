"""A DiffNet against the cheapest classical solve of equal accuracy: timings, errors, break-even, the table.

The network's mean error on held-out instances (against the independent reference) is
the target; :mod:`deepfusion.analysis.equal_accuracy` finds the cheapest classical configuration
that reaches it; both are timed per instance, alone and (for the network) in a batch.
"""

from __future__ import annotations

import statistics
from typing import Callable

import numpy as np

from deepfusion.analysis.equal_accuracy import Point, best_time, binding, break_even, cheapest, search, timed
from diffnet.backend.clock import part_text
from diffnet.backend.clock import PartClock

__all__ = ["Timings", "time_inference", "measure_classical", "classical_search", "reference_row", "compare_row", "markdown_table"]


def time_inference(predict: Callable[[np.ndarray, int], np.ndarray], instances: np.ndarray, batch: int,
                   say=print, fresh: Callable[[], None] | None = None,
                   clock: PartClock | None = None) -> tuple[np.ndarray, dict]:
    """Time ``predict(instances, batch)``, DiffNet's whole solve from instance parameters to field.

    The first call (one instance: thread pools, kernel selection) is timed on its own;
    then every instance is solved alone (median reported), then all of them in batches of
    ``batch`` (total over the count reported per instance), after one untimed pass at that shape (the
    kernels a shape selects are a process's one-off, not an instance's). ``fresh``, untimed, before each
    timed call (the family's ``clear_caches``: the network pays its own per-instance set-up). ``clock``, the
    clock ``predict`` and its generator fill, gives the batched pass's seconds per instance by part.

    Returns
    -------
    fields : numpy.ndarray
        (S, ...) from the batched pass.
    timings : dict
        ``inference_first_s``, ``diffnet_s_single``, ``diffnet_s_batched``, ``inference_batch``.
    """
    fresh = fresh or (lambda: None)

    def cold(p: np.ndarray, b: int) -> float:
        fresh()
        return timed(predict, p, b)

    _, first = cold(instances[:1], 1)
    single = statistics.median(cold(instances[k : k + 1], 1)[1] for k in range(len(instances)))
    predict(instances, batch)  # untimed: oneDNN builds its kernels per input shape once a process (10-20 ms at 64²)
    if clock is not None:
        clock.reset()
    fields, total = cold(instances, batch)
    per_instance = total / len(instances)
    parts = {} if clock is None else clock.per(len(instances))
    steps = None if clock is None else clock.newton_steps()
    say(f"    DiffNet inference: first call {first:.3f} s, one instance {single * 1e3:.2f} ms, "
        f"{per_instance * 1e3:.2f} ms per instance in batches of {min(batch, len(instances))}"
        + (f"; by part: {part_text(parts)}" if parts else "") + ("" if clock is None else clock.newton_text()))
    return fields, {"inference_first_s": first, "diffnet_s_single": single, "diffnet_s_batched": per_instance,
                    "inference_batch": min(batch, len(instances)), "parts_per_instance_s": parts,
                    "coarse_newton_steps": steps}


class Timings(list):
    """Seconds per instance, and the mean Newton steps of a nonlinear family's classical solve (its solver's ``last``
    :class:`~diffnet.solvers.hyperelasticity.NewtonStats`; None for a linear one)."""

    newton_steps: float | None = None


def measure_classical(family, instances: np.ndarray, method: str, grid: int) -> tuple[np.ndarray, Timings]:
    """Every instance solved by (method, grid), timed on its own grid (the best of repeats, each building
    the instance's set-up afresh: the family's ``clear_caches``), then carried onto the network's nodes (inside
    each instance's domain, for a family with one: the nodes its errors are measured at). A solver with a ``last``
    record of its Newton steps has their mean in the timings."""
    from deepfusion.analysis.inference import on_domain

    solver = family.classical_solver(method, grid)
    fields, seconds, steps = [], Timings(), []
    for row in instances:
        native, dt = best_time(solver, row, before=family.clear_caches)
        seconds.append(dt)
        steps.append(getattr(getattr(solver, "last", None), "newton_steps", None))
        fields.append(family.classical_to_grid(method, native, row))
    seconds.newton_steps = None if None in steps else float(np.mean(steps))
    return on_domain(family, instances, np.stack(fields)), seconds


def classical_search(family, instances: np.ndarray, truth: np.ndarray, target: float, say=print,
                    derived=None) -> list[Point]:
    """The refinement search of the family's ``classical_configurations()`` on ``instances`` against ``truth``.

    Each method first solves one instance on its coarsest grid untimed: imports and JIT
    compilation are a one-off cost of the process, not of a solve. ``derived``: the network's
    :class:`~deepfusion.analysis.derived.Derived` measurement, whose derived fields' errors are targets too
    (each classical field's derived fields measured against the same truth's).
    """
    from deepfusion.analysis.derived import derived_fields
    from deepfusion.analysis.inference import relative_l2

    configs = family.classical_configurations()
    for method, grids in configs.items():
        measure_classical(family, instances[:1], method, grids[0])
    targets = derived_targets(derived)
    theirs = {} if derived is None else derived.truth_fields
    derived_of = lambda f: {name: float(np.mean(relative_l2(v, theirs[name])))  # noqa: E731
                            for name, v in derived_fields(family, instances, f).items() if name in targets}
    return search(configs, lambda m, g: measure_classical(family, instances, m, g), lambda f: relative_l2(f, truth),
                 target, say, derived_of, targets)


def derived_targets(derived) -> dict[str, float]:
    """The network's mean error in each derived field (a :class:`~deepfusion.analysis.derived.Derived`), the targets a
    classical match must tie beside the field's; none without derived fields."""
    return {} if derived is None else {name: row["mean_rel_l2"] for name, row in derived.errors.items()}


def reference_row(family, instances: np.ndarray, truth: np.ndarray, grid: int) -> Point | None:
    """The family's ``classical_baseline`` method (e.g. pyamg's default smoothed aggregation + CG for the
    Q1 families) on the equal-accuracy grid, the baseline its best classical solver is measured against;
    None where the family names none."""
    from deepfusion.analysis.inference import relative_l2

    method = family.classical_baseline
    if method is None:
        return None
    measure_classical(family, instances[:1], method, grid)
    fields, seconds = measure_classical(family, instances, method, grid)
    return Point(method, grid, float(np.mean(relative_l2(fields, truth))), statistics.median(seconds),
                 seconds.newton_steps)


def compare_row(*, device: str, threads: int, accuracy, inference: dict, points: list[Point],
                baseline: Point | None, train_seconds: float | None, derived=None) -> dict:
    """One report row: the network's error (and its derived fields' errors, ``derived``) and times, the cheapest
    classical solve that matches them all, which target binds the match, their ratio (classical seconds / DiffNet
    seconds per instance, batched) and N*."""
    target = float(accuracy.error.mean())
    targets = derived_targets(derived)
    best = cheapest(points, target, targets)
    classical_s = None if best is None else best.seconds
    return {
        "product": "DiffNet",
        "device": device,
        "threads": threads,
        "diffnet_error": target,
        "diffnet_error_max": float(accuracy.error.max()),
        "floor": float(accuracy.floor.mean()),
        "ratio_to_floor": accuracy.ratio,
        "classical_method": None if best is None else best.method,
        "classical_grid_equal_accuracy": None if best is None else best.grid,
        "classical_error": None if best is None else best.error,
        "derived_targets": targets,
        "classical_derived_errors": None if best is None else best.derived,
        "binds": binding(points, target, targets, "u"),
        "classical_s": classical_s,
        "classical_newton_steps": None if best is None else best.newton_steps,
        **inference,
        "ratio_equal_accuracy": None if best is None else classical_s / inference["diffnet_s_batched"],
        "ratio_equal_accuracy_single": None if best is None else classical_s / inference["diffnet_s_single"],
        "break_even_queries": None if best is None else break_even(train_seconds, classical_s,
                                                                   inference["diffnet_s_batched"]),
        "train_seconds": train_seconds,
        "pyamg_default": None if baseline is None else baseline.as_dict(),
    }


def _cell(value, digits: int = 3) -> str:
    if value is None:
        return "—"
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.3g}"


def markdown_table(rows: list[dict], grid: list[int]) -> str:
    """The report as a Markdown table, one line per device and thread count."""
    head = ["grid", "device, threads", "DiffNet error (floor, ratio)", "classical at equal accuracy",
            "its error", "classical ms", "DiffNet ms one / batched", "ratio one / batched", "N*"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        binds = f"; {r['binds']} binds" if r.get("derived_targets") else ""
        matched = f"none in the search{binds}" if r["classical_method"] is None else \
            f"{r['classical_method']}, {r['classical_grid_equal_accuracy']}{binds}" + (
                "" if r.get("classical_newton_steps") is None else f" ({r['classical_newton_steps']:.3g} Newton steps)")
        ratio = "—" if r["ratio_equal_accuracy"] is None else \
            f"{r['ratio_equal_accuracy_single']:.2g}× / {r['ratio_equal_accuracy']:.2g}×"
        n_star = ("—" if r["train_seconds"] is None or r["classical_s"] is None else "never"
                  if r["break_even_queries"] is None else f"{r['break_even_queries']:.3g}")
        lines.append("| " + " | ".join([
            "×".join(map(str, grid)), f"{r['device']}, {r['threads']}" + (
                "" if r.get("product", "DiffNet") == "DiffNet" else f" — **{r['product']}**"),
            f"{r['diffnet_error']:.4f} ({r['floor']:.4f}, {r['ratio_to_floor']:.2f})", matched,
            _cell(r["classical_error"], 4), _ms(r["classical_s"]),
            f"{_ms(r['diffnet_s_single'])} / {_ms(r['diffnet_s_batched'])}", ratio, n_star]) + " |")
    return "\n".join(lines) + "\n"
