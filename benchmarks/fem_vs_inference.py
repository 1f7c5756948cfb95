"""The strongest Poisson solver we run against pyamg's default, and DiffNet against it at equal accuracy.

1. **Solver race** at 256^2, 512^2 and 1024^2 nodes (``--grids``), KL instances of the
   Poisson family, one thread: the geometric multigrid (FMG to discretisation accuracy,
   :mod:`diffnet.solvers.gmg`) against pyamg's smoothed aggregation with its default
   settings, CG-accelerated. Equal accuracy: pyamg's tolerance is swept (1e-3 .. 1e-10)
   and the cheapest tolerance whose solution is as close to the exact discrete solution
   (a tight solve of the same system) as a tenth of the grid's discretisation error --
   the multigrid's stopping rule -- is timed. Both include their
   setup; the shared structured assembly is timed apart. Key: ``gmg_vs_pyamg_default_1024``
   (pyamg seconds / multigrid seconds; goal >= 3).
2. **DiffNet at equal accuracy** for each trained run in ``--runs``: ``deepfusion compare``
   (the refinement sweep of the classical solver to the network's error), under the keys
   ``equal_accuracy.<run name>.ratio_equal_accuracy`` and ``...break_even_queries``.

Prints one JSON object.

    python benchmarks/fem_vs_inference.py [--grids 256 512 1024] [--runs RUN_DIR ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launch import thread_env  # noqa: E402  (benchmarks/launch.py, beside this script)

TOLERANCES = (1e-3, 3e-4, 1e-4, 3e-5, 1e-5, 3e-6, 1e-6, 1e-7, 1e-8, 1e-10)


def race(grid: int, a, say) -> dict:
    """Multigrid vs pyamg default on one instance at ``grid``^2: seconds and algebraic errors at equal accuracy."""
    import numpy as np
    import pyamg

    from diffnet.problems.poisson import PoissonProblem
    from diffnet.solvers.gmg import GMGSolver

    problem = PoissonProblem((grid, grid))
    t0 = time.perf_counter()
    system = problem.fem_system(a)
    assembly = time.perf_counter() - t0
    free = ~system.fixed
    exact = GMGSolver.build(system).solve(1e-12).ravel()  # the discrete solution, to the last digits

    def error(u):
        return float(np.linalg.norm(u.ravel() - exact) / np.linalg.norm(exact))

    t0 = time.perf_counter()
    stats: dict = {}
    u = GMGSolver.build(system).fmg(cycles=1, to_discretisation=True, stats=stats)
    gmg_s = time.perf_counter() - t0
    gmg_error = error(u)
    say(f"  {grid}^2: assembly {assembly:.3f} s; multigrid {gmg_s:.3f} s ({stats['finest_cycles']} cycles on the "
        f"finest level), algebraic error {gmg_error:.2e} (discretisation error about "
        f"{stats['discretisation_estimate']:.1e})")
    # Equal accuracy for both: an algebraic error at most a tenth of the grid's discretisation
    # error (the multigrid's own estimate, ||u_h - I u_2h|| / 3), where a solve is complete.
    target = 0.1 * stats["discretisation_estimate"]
    sweep = []
    for tol in TOLERANCES:
        t0 = time.perf_counter()
        ml = pyamg.smoothed_aggregation_solver(system.A)
        residuals: list[float] = []
        x = ml.solve(system.rhs, tol=tol, accel="cg", maxiter=1000, residuals=residuals)
        seconds = time.perf_counter() - t0
        x[system.fixed] = system.values[system.fixed]
        sweep.append({"tol": tol, "seconds": seconds, "iterations": len(residuals) - 1, "error": error(x)})
        say(f"    pyamg default, tol {tol:.0e}: {seconds:.3f} s, {len(residuals) - 1} CG iterations, "
            f"algebraic error {sweep[-1]['error']:.2e}")
        if sweep[-1]["error"] <= target:
            break
    matched = next((s for s in sweep if s["error"] <= target), None)
    return {"grid": grid, "unknowns": int(free.sum()), "assembly_s": assembly, "gmg_s": gmg_s,
            "gmg_finest_cycles": stats["finest_cycles"], "gmg_error": gmg_error, "target_error": target,
            "gmg_meets_target": gmg_error <= target,
            "discretisation_estimate": stats["discretisation_estimate"], "pyamg_default_sweep": sweep,
            "pyamg_default_s": None if matched is None else matched["seconds"],
            "pyamg_default_tol": None if matched is None else matched["tol"],
            "pyamg_over_gmg": None if matched is None else matched["seconds"] / gmg_s}


def compare_run(run_dir: Path, out: Path, samples: int, env: dict) -> dict:
    report = out / f"compare_{run_dir.name}.json"
    cmd = [sys.executable, "-m", "deepfusion", "compare", str(run_dir), "--samples", str(samples), "--out", str(report)]
    print(f"$ {' '.join(cmd)}", file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, stdout=sys.stderr, env=env)
    return json.loads(report.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grids", type=int, nargs="+", default=[256, 512, 1024], help="nodes per side of the race")
    parser.add_argument("--instances", type=int, default=3, help="KL instances per grid in the race")
    parser.add_argument("--runs", type=Path, nargs="*", default=[], help="trained run directories to compare")
    parser.add_argument("--samples", type=int, default=4, help="held-out instances per run")
    parser.add_argument("--out", type=Path, help="where the compare reports go (default: a temporary directory)")
    args = parser.parse_args()
    inherited = thread_env()  # for `deepfusion compare`, which sets its own threads
    # The race on one thread, as the sparse kernels of both solvers use: set before numpy starts.
    os.environ.update({k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
    import numpy as np

    from diffnet.problems.poisson import sample_coefficients

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    coeffs = sample_coefficients((-3.0, 3.0), 6, args.instances, "random", 2024)
    races = {}
    for grid in args.grids:
        rows = [race(grid, a, say) for a in coeffs]
        ratios = [r["pyamg_over_gmg"] for r in rows if r["pyamg_over_gmg"] is not None]
        races[str(grid)] = {"instances": rows, "median_pyamg_over_gmg": statistics.median(ratios) if ratios else None}
    equal = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        for run_dir in args.runs:
            report = compare_run(run_dir, out, args.samples, inherited)
            row = report["rows"][0]  # one CPU thread
            equal[run_dir.name] = {k: row[k] for k in (
                "threads", "diffnet_error", "floor", "ratio_to_floor", "classical_method",
                "classical_grid_equal_accuracy", "classical_error", "classical_s", "diffnet_s_single",
                "diffnet_s_batched", "ratio_equal_accuracy", "ratio_equal_accuracy_single", "break_even_queries")}
            equal[run_dir.name]["problem"] = report["problem"]
            equal[run_dir.name]["resolution"] = report["resolution"]
    top = races.get("1024", {}).get("median_pyamg_over_gmg")
    print(json.dumps({
        "benchmark": "fem_vs_inference",
        "race": races,
        "gmg_vs_pyamg_default_1024": None if top is None else round(top, 2),
        "goal_gmg_vs_pyamg_default_1024": 3.0,
        "equal_accuracy": equal,
        "numpy": np.__version__,
    }, indent=2))


if __name__ == "__main__":
    main()
