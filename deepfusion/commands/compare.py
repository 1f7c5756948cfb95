"""``deepfusion compare``: a classical solve (Q1 FEM + AMG, or Godunov) timed against DiffNet inference."""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from deepfusion.commands import warn
from deepfusion.config import Config
from deepfusion.inputs import InputError, check_output_file, check_resolution
from deepfusion.rundir import run_config, trained_model
from deepfusion.wiring import build_problem, sample_parameters

__all__ = ["run"]


def _compare_instances(cfg: Config, samples: int) -> np.ndarray:
    """The first ``samples`` held-out instances of the run (never training ones)."""
    if cfg.problem.name == "burgers" and cfg.problem.test_c:
        if samples > len(cfg.problem.test_c):
            n = len(cfg.problem.test_c)
            raise InputError(f"--samples: this run holds out {n} value{'s' if n != 1 else ''} of c (problem.test_c); "
                             f"got {samples}")
        return np.asarray(cfg.problem.test_c[:samples], dtype=np.float64)
    return sample_parameters(cfg, samples, "random", cfg.data.seed + 7919)  # the held-out stream, see heldout_parameters


def run(args: argparse.Namespace, comm) -> int:
    """Classical solve (Q1 FEM + AMG, or Godunov) against DiffNet inference, per resolution."""
    import dataclasses

    run_dir = Path(args.run_dir)
    cfg = run_config(run_dir)
    check_output_file(args.out, (".json",), "the report is JSON")
    if not 1 <= args.samples <= 1000:
        raise InputError(f"--samples: must be in 1..1000, got {args.samples}")
    if not 1 <= args.threads <= 4096:
        raise InputError(f"--threads: must be in 1..4096, got {args.threads}")
    if not 1 <= args.batch <= 1024:
        raise InputError(f"--batch: must be in 1..1024, got {args.batch}")
    if not (math.isfinite(args.tol) and 0 < args.tol <= 1e-2):
        raise InputError(f"--tol: must be in (0, 1e-2], got {args.tol}")
    trained = tuple(cfg.problem.resolution)
    grids = [(n, n) for n in args.resolution] if args.resolution else [trained]
    for grid in grids:
        check_resolution(grid)
    params = _compare_instances(cfg, args.samples)
    from deepfusion.runtime import apply_threads

    apply_threads(args.threads)  # before torch starts its thread pool
    from deepfusion.compare import compare_row, markdown_table, time_inference, time_reference
    from deepfusion.evaluate import against_floor, predict

    t0 = time.perf_counter()
    _, model, path = trained_model(run_dir, args.checkpoint, warn)
    load_s = time.perf_counter() - t0
    print(f"deepfusion compare: {run_dir} ({cfg.problem.name}, trained at {list(trained)}), checkpoint {path} "
          f"loaded in {load_s:.3f} s; {len(params)} held-out instances; "
          f"{args.threads} thread{'s' if args.threads > 1 else ''} for both solvers",
          flush=True)
    rows = []
    for grid in grids:
        problem = build_problem(cfg.replace(problem=dataclasses.replace(cfg.problem, resolution=grid)))
        print(f"  {grid[0]}x{grid[1]}:", flush=True)
        ref, reference = time_reference(problem, params, args.tol, direct=not args.no_direct)
        pred, inference = time_inference(lambda p, b: predict(model, problem, p, b), params, args.batch)
        # The error needs a model trained at this grid; elsewhere only the timings mean something.
        acc = against_floor(problem, params, pred, ref if cfg.problem.name == "burgers" else None) \
            if grid == trained else None
        rows.append(compare_row(grid, args.threads, reference, inference, acc))
        row = rows[-1]
        print(f"    speed-up {row['speedup_single']:.1f}x (one instance), {row['speedup_batched']:.1f}x (batched)"
              + (f"; rel. L2 vs {acc.truth_name} mean {row['rel_l2']:.4f}, max {row['rel_l2_max']:.4f}, floor "
                 f"{row['floor']:.4f}, ratio {row['ratio_to_floor']:.2f}" if acc is not None
                 else "; no model trained at this grid, error not measured"), flush=True)
    report = {
        "run_dir": str(run_dir),
        "checkpoint": str(path),
        "problem": cfg.problem.name,
        "trained_resolution": list(trained),
        "model": {"name": cfg.model.name, "channels": list(cfg.model.channels), "dtype": cfg.train.dtype},
        "samples": len(params),
        "instances": params.tolist(),
        "threads": args.threads,
        "amg_tol": args.tol,
        "model_load_s": load_s,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    table = args.out.with_suffix(".md")
    table.write_text(markdown_table(rows))
    from deepfusion.plots import plot_compare

    figure = plot_compare(rows, args.out.with_suffix(".png"))
    print(f"\n{markdown_table(rows)}\nwrote {args.out}, {table}, {figure}")
    return 0
