"""Q1 FEM (assembly + AMG-CG) against DiffNet inference for Poisson at 256^2, 512^2 and 1024^2.

Runs ``deepfusion compare`` on a trained Poisson run at the three grids, once with one
thread on both sides (scipy's and pyamg's sparse kernels are single-threaded, so this is
the like-for-like row) and once with every core of the machine. The error needs a model
trained at the grid: ``--run`` takes a trained run directory, otherwise a 256^2 model is
trained here first (``--epochs``, ``--n-train``; mpiexec -n 2). The baseline in the same
run: pyamg's smoothed-aggregation solver with its default settings, CG-accelerated to the
same tolerance, on the same assembled system -- the shipped FEM solve must be within 2x of
it at 1024^2 (``fem_vs_pyamg_default_1024``). Prints one JSON object; the compare reports
(JSON, Markdown, PNG) go to ``--out``.

    python benchmarks/fem_vs_inference.py [--run RUN_DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launch import thread_env, train_run  # noqa: E402  (benchmarks/launch.py, beside this script)

GRIDS = (256, 512, 1024)


def train(out: Path, epochs: int, n_train: int) -> tuple[Path, float]:
    """Train configs/poisson.toml at 256^2 on two ranks (one without mpiexec), batch 16; (run directory, seconds)."""
    from deepfusion.runtime import find_mpiexec

    run_dir = out / "poisson256"
    t0 = time.perf_counter()
    train_run(ROOT / "configs" / "poisson.toml", run_dir, 2 if find_mpiexec() else 1,
              ["problem.resolution=[256,256]", "multigrid.levels=[]", f"train.epochs={epochs}",
               f"data.n_train={n_train}", "train.batch_size=16", "train.checkpoint_every=50"], threads=1)
    return run_dir, time.perf_counter() - t0


def compare(run_dir: Path, threads: int, samples: int, out: Path) -> dict:
    report = out / f"compare_t{threads}.json"
    cmd = [sys.executable, "-m", "deepfusion", "compare", str(run_dir), "--resolution", *map(str, GRIDS),
           "--samples", str(samples), "--threads", str(threads), "--out", str(report)]
    print(f"$ {' '.join(cmd)}", file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, stdout=sys.stderr, env=thread_env(threads))
    return json.loads(report.read_text())


def pyamg_default(grid: int, a, tol: float) -> dict:
    """Seconds of pyamg's default smoothed-aggregation solver + CG on the shipped assembly of the same system."""
    import numpy as np
    import pyamg

    from diffnet.problems.poisson import PoissonProblem

    system = PoissonProblem((grid, grid)).fem_system(a)
    t0 = time.perf_counter()
    ml = pyamg.smoothed_aggregation_solver(system.A)
    setup = time.perf_counter() - t0
    residuals: list[float] = []
    u = ml.solve(system.rhs, tol=tol, accel="cg", maxiter=500, residuals=residuals)
    total = time.perf_counter() - t0
    residual = float(np.linalg.norm(system.rhs - system.A @ u) / np.linalg.norm(system.rhs))
    return {"setup_s": setup, "solve_s": total, "iterations": len(residuals) - 1, "relative_residual": residual}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="a trained Poisson run directory (256^2 for the error)")
    parser.add_argument("--out", type=Path, help="where the compare reports go (default: a temporary directory)")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=6, help="training epochs when no --run is given")
    parser.add_argument("--n-train", type=int, default=256, help="training instances when no --run is given")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        trained = None
        run_dir = args.run
        if run_dir is None:
            run_dir, seconds = train(out, args.epochs, args.n_train)
            trained = {"resolution": [256, 256], "epochs": args.epochs, "n_train": args.n_train, "ranks": 2,
                       "train_seconds": round(seconds, 1)}
        reports = {t: compare(run_dir, t, args.samples, out) for t in sorted(set(args.threads))}
    first = reports[min(reports)]["instances"][0]
    # The baseline under the like-for-like thread count: one, as the sparse kernels use.
    os.environ.update({k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
    tol = reports[min(reports)]["amg_tol"]
    baseline = {g: pyamg_default(g, first, tol) for g in GRIDS}
    rows = []
    for t, report in reports.items():
        for r in report["rows"]:
            g = r["resolution"][0]
            fem = r["fem_assembly_s"] + r["fem_solve_s"]
            rows.append({
                "grid": g, "threads": t, "fem_assembly_s": round(r["fem_assembly_s"], 3),
                "fem_solve_s": round(r["fem_solve_s"], 3), "fem_cg_iterations": r["fem_cg_iterations"],
                "fem_direct_solve_s": round(r["fem_direct_solve_s"], 2),
                "pyamg_default_solve_s": round(baseline[g]["solve_s"], 3),
                "inference_single_s": round(r["inference_single_s"], 4),
                "inference_batched_per_instance_s": round(r["inference_batched_per_instance_s"], 4),
                "speedup_single": round(fem / r["inference_single_s"], 2),
                "speedup_batched": round(fem / r["inference_batched_per_instance_s"], 2),
                "rel_l2": None if r["rel_l2"] is None else round(r["rel_l2"], 4),
            })
    like = next(r for r in rows if r["grid"] == 1024 and r["threads"] == min(reports))
    result = {
        "benchmark": "fem_vs_inference",
        "run": str(args.run) if args.run else None,
        "trained_here": trained,
        "samples": args.samples,
        "amg_tol": tol,
        "model_load_s": round(reports[min(reports)]["model_load_s"], 3),
        "rows": rows,
        "pyamg_default": {str(g): {k: round(v, 4) if isinstance(v, float) else v for k, v in b.items()}
                          for g, b in baseline.items()},
        "fem_vs_pyamg_default_1024": round(like["fem_solve_s"] / baseline[1024]["solve_s"], 3),
        "strong_baseline": like["fem_solve_s"] <= 2 * baseline[1024]["solve_s"],
        "speedup_1024": {"threads": like["threads"], "single": like["speedup_single"], "batched": like["speedup_batched"]},
        "goal_10x_at_1024": like["speedup_batched"] >= 10,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
