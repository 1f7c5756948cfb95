"""The strongest Poisson solver we run against pyamg's default, and DiffNet against it at equal accuracy.

1. **Solver race** at 257^2, 513^2 and 1025^2 nodes (``--grids``), and at 65^3 and 129^3
   (``--grids3d``, the poisson3d family), KL instances, one thread: the geometric multigrid (FMG to discretisation
   accuracy, :mod:`diffnet.solvers.gmg`, compiled stencil kernels, one for 2-D and 3-D) against pyamg's smoothed
   aggregation with its default settings, CG-accelerated. Equal accuracy: pyamg's
   tolerance is swept (1e-3 .. 1e-10) and the cheapest tolerance whose solution is as
   close to the exact discrete solution (a tight solve of the same system) as a tenth of
   the grid's discretisation error -- the multigrid's stopping rule -- is timed. Both
   include their setup. The whole pipeline is timed too: our assembly (stencil) + multigrid
   against the same assembly with its CSR matrix + pyamg. Keys:
   ``gmg_vs_pyamg_default_<grid>`` (solve only; goal >= 3) and
   ``pipeline_vs_pyamg_default_<grid>`` (assembly + solve; goal >= 10 at 1025^2); in 3-D
   ``gmg3d_vs_pyamg_default_<cells>`` (goal >= 3 at 128^3) and ``pipeline3d_vs_pyamg_default_<cells>``.
2. **Time per unknown** of the whole multigrid pipeline from 33^2 to 1025^2 (``--scaling``),
   the best of repeats per instance: ``scaling``.
3. **DiffNet at equal accuracy** for each trained run in ``--runs``: ``deepfusion compare``
   (the refinement search of the classical solver to the network's error), under the keys
   ``equal_accuracy.<run name>.ratio_equal_accuracy`` and ``...break_even_queries``.

Prints one JSON object.

    python benchmarks/fem_vs_inference.py [--grids 257 513 1025] [--grids3d 65 129] [--scaling 33 65 ...] [--runs RUN_DIR ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launch import thread_env  # noqa: E402  (benchmarks/launch.py, beside this script)

TOLERANCES = (1e-3, 3e-4, 1e-4, 3e-5, 1e-5, 3e-6, 1e-6, 1e-7, 1e-8, 1e-10)


def fmg_solve(system):
    """Hierarchy and FMG to discretisation accuracy for one assembled system: (field, stats)."""
    stats: dict = {}
    return system.multigrid().fmg(cycles=1, to_discretisation=True, stats=stats), stats


def pipeline(problem, a):
    """Assembly, hierarchy and FMG to discretisation accuracy for one instance: the classical solve as a user runs it."""
    return fmg_solve(problem.fem_system(a))


def _exact(system):
    """The discrete solution to the last digits (nodal, Dirichlet values included): multigrid-preconditioned CG."""
    return system.multigrid().solve(1e-12)


def _pyamg_default(system, tol: float, residuals: list):
    """pyamg's smoothed aggregation with its defaults, CG-accelerated to ``tol``: the nodal field."""
    import pyamg

    ml = pyamg.smoothed_aggregation_solver(system.A)
    x = ml.solve(system.rhs, tol=tol, accel="cg", maxiter=1000, residuals=residuals)
    x[system.fixed] = system.values[system.fixed]
    return x.reshape(system.shape)


def race(grid: int, a, say, dims: int = 2) -> dict:
    """Multigrid vs pyamg default on one instance at ``grid``^dims: seconds and algebraic errors at equal accuracy."""
    import numpy as np

    from deepfusion.analysis.equal_accuracy import best_time
    from diffnet.families.poisson import PoissonFamily
    from diffnet.families.poisson3d import Poisson3DFamily

    problem = PoissonFamily((grid, grid)) if dims == 2 else Poisson3DFamily((grid,) * 3)
    system, assembly = best_time(problem.fem_system, a)
    csr = best_time(lambda: problem.fem_system(a).A)[1]  # assembly with the CSR matrix pyamg needs
    exact = _exact(system).ravel()

    def error(u):
        return float(np.linalg.norm(u.ravel() - exact) / np.linalg.norm(exact))

    (u, stats), gmg_s = best_time(fmg_solve, system)
    (_, _), whole_s = best_time(pipeline, problem, a)
    gmg_error = error(u)
    say(f"  {grid}^{dims}: assembly {assembly:.3f} s (with CSR {csr:.3f} s); multigrid {gmg_s:.3f} s "
        f"({stats['finest_cycles']} cycles on the finest level), whole pipeline {whole_s:.3f} s; algebraic error "
        f"{gmg_error:.2e} (discretisation error about {stats['discretisation_estimate']:.1e})")
    # Equal accuracy for both: an algebraic error at most a tenth of the grid's discretisation
    # error (the multigrid's own estimate, ||u_h - I u_2h|| / 3), where a solve is complete.
    target = 0.1 * stats["discretisation_estimate"]
    sweep = []
    for tol in TOLERANCES:
        residuals: list[float] = []

        def default(tol=tol, residuals=residuals):
            residuals.clear()
            return _pyamg_default(system, tol, residuals)

        x, seconds = best_time(default)  # the best of repeats, as for the multigrid
        sweep.append({"tol": tol, "seconds": seconds, "iterations": len(residuals) - 1, "error": error(x)})
        say(f"    pyamg default, tol {tol:.0e}: {seconds:.3f} s, {len(residuals) - 1} CG iterations, "
            f"algebraic error {sweep[-1]['error']:.2e}")
        if sweep[-1]["error"] <= target:
            break
    matched = next((s for s in sweep if s["error"] <= target), None)
    pyamg_s = None if matched is None else matched["seconds"]
    return {"grid": grid, "dims": dims, "unknowns": int((~system.fixed).sum()),
            "assembly_s": assembly, "assembly_with_csr_s": csr,
            "gmg_s": gmg_s, "pipeline_s": whole_s,
            "gmg_finest_cycles": stats["finest_cycles"], "gmg_error": gmg_error, "target_error": target,
            "gmg_meets_target": gmg_error <= target,
            "discretisation_estimate": stats["discretisation_estimate"], "pyamg_default_sweep": sweep,
            "pyamg_default_s": pyamg_s,
            "pyamg_default_tol": None if matched is None else matched["tol"],
            "pyamg_over_gmg": None if matched is None else pyamg_s / gmg_s,
            "pyamg_pipeline_over_pipeline": None if matched is None else (csr + pyamg_s) / whole_s}


def scaling(grids: list[int], coeffs, say) -> list[dict]:
    """Seconds per unknown of the whole multigrid pipeline per grid: the median over instances of the best of repeats."""
    from deepfusion.analysis.equal_accuracy import best_time
    from diffnet.families.poisson import PoissonFamily

    rows = []
    for grid in grids:
        problem = PoissonFamily((grid, grid))
        pipeline(problem, coeffs[0])  # compilation and first-touch, once
        seconds = statistics.median(best_time(pipeline, problem, a, budget_s=1.0)[1] for a in coeffs)
        rows.append({"grid": grid, "seconds": seconds, "seconds_per_unknown": seconds / grid**2})
        say(f"  pipeline {grid}^2: {seconds * 1e3:.2f} ms, {seconds / grid**2 * 1e9:.1f} ns per unknown")
    return rows


def compare_run(run_dir: Path, out: Path, samples: int, env: dict) -> dict:
    report = out / f"compare_{run_dir.name}.json"
    cmd = [sys.executable, "-m", "deepfusion", "compare", str(run_dir), "--samples", str(samples), "--out", str(report)]
    print(f"$ {' '.join(cmd)}", file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, stdout=sys.stderr, env=env)
    return json.loads(report.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grids", type=int, nargs="*", default=[257, 513, 1025], help="nodes per side of the race")
    parser.add_argument("--grids3d", type=int, nargs="*", default=[65, 129],
                        help="nodes per side of the 3-D race (the poisson3d family)")
    parser.add_argument("--scaling", type=int, nargs="*", default=[33, 65, 129, 257, 513, 1025],
                        help="nodes per side of the time-per-unknown sweep")
    parser.add_argument("--instances", type=int, default=3, help="KL instances per grid in the race")
    parser.add_argument("--runs", type=Path, nargs="*", default=[], help="trained run directories to compare")
    parser.add_argument("--samples", type=int, default=4, help="held-out instances per run")
    parser.add_argument("--out", type=Path, help="where the compare reports go (default: a temporary directory)")
    args = parser.parse_args()
    inherited = thread_env()  # for `deepfusion compare`, which sets its own threads
    # The race on one thread, as the sparse kernels of both solvers use: set before numpy starts.
    os.environ.update({k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
    import numpy as np

    from diffnet.protocol.family import sample_box

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    coeffs = sample_box(-3.0, 3.0, (6,), args.instances, "random", 2024)
    say("time per unknown of the multigrid pipeline (assembly + hierarchy + FMG to discretisation accuracy):")
    per_unknown = scaling(args.scaling, coeffs, say)
    races = {}
    for dims, grids in ((2, args.grids), (3, args.grids3d)):
        for grid in grids:
            say(f"race at {grid}^{dims}:")
            rows = [race(grid, a, say, dims) for a in coeffs]
            solve = [r["pyamg_over_gmg"] for r in rows if r["pyamg_over_gmg"] is not None]
            whole = [r["pyamg_pipeline_over_pipeline"] for r in rows if r["pyamg_pipeline_over_pipeline"] is not None]
            races[str(grid) if dims == 2 else f"{grid}^3"] = {
                "instances": rows, "median_pyamg_over_gmg": statistics.median(solve) if solve else None,
                "median_pyamg_pipeline_over_pipeline": statistics.median(whole) if whole else None}
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
    keys = {}
    for grid, race_ in races.items():
        # 3-D keys name the cells per side (129^3 nodes: gmg3d_vs_pyamg_default_128).
        name = f"3d_vs_pyamg_default_{int(grid[:-2]) - 1}" if grid.endswith("^3") else f"_vs_pyamg_default_{grid}"
        for key, value in (("gmg", race_["median_pyamg_over_gmg"]),
                           ("pipeline", race_["median_pyamg_pipeline_over_pipeline"])):
            keys[key + name] = None if value is None else round(value, 2)
    print(json.dumps({
        "benchmark": "fem_vs_inference",
        "scaling": per_unknown,
        "race": races,
        **keys,
        "goal_gmg_vs_pyamg_default_1025": 3.0,
        "goal_pipeline_vs_pyamg_default_1025": 10.0,
        "goal_gmg3d_vs_pyamg_default_128": 3.0,
        "equal_accuracy": equal,
        "numpy": np.__version__,
    }, indent=2))


if __name__ == "__main__":
    main()
