"""Classical solve against DiffNet inference: timings and errors per resolution, and the report's table."""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable

import numpy as np

__all__ = ["time_reference", "time_inference", "compare_row", "markdown_table"]


def _clock(fn: Callable, *args, **kwargs) -> tuple[object, float]:
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def _warm_up(problem, params: np.ndarray) -> None:
    """One untimed solve on a 9 x 9 grid, so library imports and JIT compilation are not counted as solve time."""
    small = dataclasses.replace(problem, resolution=(9, 9))
    if hasattr(small, "fem_system"):
        system = small.fem_system(params[0])
        system.solve("amg", 1e-8)
        system.solve("direct")
    else:
        small.reference(params[:1])


def time_reference(problem, params: np.ndarray, tol: float, direct: bool = True, say=print) -> tuple[np.ndarray, dict]:
    """Solve each instance with the problem's classical solver, timing its parts.

    A problem with ``fem_system`` (Poisson, reaction-diffusion) is assembled (boundary
    conditions included), then solved by AMG-preconditioned CG to the relative residual
    ``tol`` (AMG setup counted in the solve: a new instance needs a new hierarchy); the
    first instance is also solved by sparse LU when ``direct``. Any other problem
    (Burgers) is timed through its ``reference`` solve (Godunov). A solve on a tiny grid
    comes first, untimed: imports and JIT compilation are a one-off cost of the process.

    Returns
    -------
    fields : numpy.ndarray
        (S, ...) the AMG (or Godunov) solutions.
    timings : dict
        Medians over the instances, in seconds per instance: ``fem_assembly_s``,
        ``fem_solve_s``, ``fem_amg_setup_s``, ``fem_cg_iterations``,
        ``fem_direct_solve_s`` (null without ``direct`` or FEM), ``fem_amg_vs_direct``
        (max relative difference, first instance); for Burgers ``reference_solve_s``.
    """
    _warm_up(problem, params)
    if not hasattr(problem, "fem_system"):
        fields, seconds = [], []
        for k in range(len(params)):
            u, dt = _clock(problem.reference, params[k : k + 1])
            fields.append(u[0])
            seconds.append(dt)
        solve = statistics.median(seconds)
        say(f"    Godunov reference {solve:.3f} s per instance")
        return np.stack(fields), {
            "reference": "godunov", "fem_assembly_s": None, "fem_solve_s": solve, "fem_amg_setup_s": None,
            "fem_cg_iterations": None, "fem_direct_solve_s": None, "fem_amg_vs_direct": None,
        }
    fields, assembly, solve, setup, iterations = [], [], [], [], []
    direct_s = difference = None
    for k in range(len(params)):
        system, dt = _clock(problem.fem_system, params[k])
        assembly.append(dt)
        stats: dict = {}
        u, dt = _clock(system.solve, "amg", tol, stats)
        solve.append(dt)
        setup.append(stats["amg_setup_s"])
        iterations.append(stats["iterations"])
        fields.append(u)
        if direct and k == 0:
            u_lu, direct_s = _clock(system.solve, "direct")
            difference = float(np.abs(u - u_lu).max() / np.abs(u_lu).max())
        say(f"    instance {k + 1}/{len(params)}: assembly {assembly[-1]:.3f} s, AMG-CG {solve[-1]:.3f} s "
            f"({stats['iterations']} iterations, setup {stats['amg_setup_s']:.3f} s)"
            + (f", direct LU {direct_s:.3f} s" if direct and k == 0 else ""))
    return np.stack(fields), {
        "reference": "fem",
        "fem_assembly_s": statistics.median(assembly),
        "fem_solve_s": statistics.median(solve),
        "fem_amg_setup_s": statistics.median(setup),
        "fem_cg_iterations": int(statistics.median(iterations)),
        "fem_direct_solve_s": direct_s,
        "fem_amg_vs_direct": difference,
    }


def time_inference(predict: Callable[[np.ndarray, int], np.ndarray], params: np.ndarray, batch: int,
                   say=print) -> tuple[np.ndarray, dict]:
    """Time ``predict(params, batch)``, DiffNet's whole solve from instance parameters to field.

    The first call (one instance: thread pools, kernel selection) is timed on its own;
    then every instance is solved alone (median reported), then all of them in batches of
    ``batch`` (total over the count reported per instance).

    Returns
    -------
    fields : numpy.ndarray
        (S, ...) from the batched pass.
    timings : dict
        ``inference_first_s``, ``inference_single_s``, ``inference_batched_per_instance_s``,
        ``inference_batch``.
    """
    _, first = _clock(predict, params[:1], 1)
    single = statistics.median(_clock(predict, params[k : k + 1], 1)[1] for k in range(len(params)))
    fields, total = _clock(predict, params, batch)
    per_instance = total / len(params)
    say(f"    DiffNet inference: first call {first:.3f} s, one instance {single:.4f} s, "
        f"{per_instance:.4f} s per instance in batches of {min(batch, len(params))}")
    return fields, {
        "inference_first_s": first,
        "inference_single_s": single,
        "inference_batched_per_instance_s": per_instance,
        "inference_batch": min(batch, len(params)),
    }


def compare_row(resolution: tuple[int, ...], threads: int, reference: dict, inference: dict, accuracy=None) -> dict:
    """One report row: the timings, speed-ups (classical seconds / inference seconds) and, where the
    model was trained at this grid, the error against the independent reference with the grid's
    floor (a :class:`deepfusion.evaluate.FloorReport`)."""
    classical = (reference["fem_assembly_s"] or 0.0) + reference["fem_solve_s"]
    rel_l2 = None if accuracy is None else accuracy.error
    return {
        "resolution": list(resolution),
        "threads": threads,
        **reference,
        **inference,
        "speedup_single": classical / inference["inference_single_s"],
        "speedup_batched": classical / inference["inference_batched_per_instance_s"],
        "rel_l2": None if rel_l2 is None else float(np.mean(rel_l2)),
        "rel_l2_max": None if rel_l2 is None else float(np.max(rel_l2)),
        "floor": None if accuracy is None else float(accuracy.floor.mean()),
        "ratio_to_floor": None if accuracy is None else accuracy.ratio,
    }


def _cell(value, digits: int = 3) -> str:
    if value is None:
        return "—"
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def markdown_table(rows: list[dict]) -> str:
    """The report as a Markdown table, one line per resolution."""
    fem = rows[0]["reference"] == "fem"
    head = (["grid", "threads", "FEM assembly s", "AMG-CG solve s (its)", "direct LU s"] if fem
            else ["grid", "threads", "Godunov s"])
    head += ["DiffNet one instance s", "DiffNet batched s/instance", "speed-up one / batched",
             "DiffNet rel. L2", "floor", "ratio"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        grid = "×".join(map(str, r["resolution"]))
        cells = ([grid, str(r["threads"]), _cell(r["fem_assembly_s"]), f"{_cell(r['fem_solve_s'])} ({r['fem_cg_iterations']})",
                  _cell(r["fem_direct_solve_s"])] if fem else [grid, str(r["threads"]), _cell(r["fem_solve_s"])])
        cells += [_cell(r["inference_single_s"]), _cell(r["inference_batched_per_instance_s"]),
                  f"{r['speedup_single']:.1f}× / {r['speedup_batched']:.1f}×", _cell(r["rel_l2"]), _cell(r["floor"]),
                  _cell(r["ratio_to_floor"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
