"""Train configs and measure accuracy on held-out instances against the independent reference solver
and the grid's discretisation floor.

Prints one JSON object: for each config, the mean, max and per-instance relative L2
error on the held-out instances against the independent reference (converged Godunov for
Burgers; for Poisson and reaction-diffusion the Q1 FEM on a grid ``poisson.truth_refine``
times finer), the floor of the same grid (the zero-residual field of the trained residual,
or the same-grid FEM, against that reference) and their ratio -- the baseline measured in
the same run -- with training time, samples/s, ranks and threads.

    python benchmarks/accuracy.py [--ranks P] [--set KEY=VALUE ...] CONFIG [CONFIG ...]

    python benchmarks/accuracy.py configs/burgers.toml configs/burgers_inviscid.toml
    python benchmarks/accuracy.py --ranks 2 configs/poisson.toml configs/reaction_diffusion.toml
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launch import train_run  # noqa: E402  (benchmarks/launch.py, beside this script)

# The goal for every config: the network within 1.5x of its grid's floor (DESIGN.md, section 6).
GOAL_RATIO = 1.5


def run(config: str, ranks: int, overrides: list[str], workdir: Path) -> dict:
    run_dir = workdir / Path(config).stem
    train_run(ROOT / config, run_dir, ranks, overrides)
    report = json.loads((run_dir / "eval.json").read_text())
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steady = [m["samples_per_s"] for m in metrics[len(metrics) // 5 :]]  # after warm-up
    params = report["parameter"]  # the family's instance name, e.g. "c" or "a"
    out = {
        "config": config,
        "overrides": overrides,
        params: report[params],
        "resolution": report["resolution"],
        "reference": report["truth"],
        "floor_field": report["floor_field"],
        "rel_l2": [round(e, 5) for e in report["rel_l2"]],
        "mean_rel_l2": round(report["mean_rel_l2"], 5),
        "max_rel_l2": round(max(report["rel_l2"]), 5),
        "floor": [round(e, 5) for e in report["floor_rel_l2"]],
        "mean_floor": round(report["mean_floor"], 5),
        "ratio_to_floor": round(report["ratio_to_floor"], 3),
        "train_seconds": round(report["train_seconds"], 1),
        "samples_per_s": round(sum(steady) / len(steady), 1),
        "ranks": metrics[-1]["ranks"],
        "threads": metrics[-1]["threads"],
        "reference_seconds": round(report["reference_seconds"], 3),
        "inference_seconds": round(report["inference_seconds"], 4),
        "goal_ratio_to_floor": GOAL_RATIO,
        "meets_goal": report["ratio_to_floor"] <= GOAL_RATIO,
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="+", help="config(s) relative to the repository root")
    parser.add_argument("--ranks", type=int, default=1, help="MPI ranks per training run (mpiexec -n)")
    parser.add_argument("--set", action="append", default=[], help="override passed to every run")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="parallel.device of every run")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep the run directories here, one per config (default: a temporary folder), "
                             "e.g. for deepfusion compare afterwards")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [*args.set, f"parallel.device={args.device}"]
        results = [run(c, args.ranks, overrides, args.workdir or Path(tmp)) for c in args.configs]
    print(json.dumps({"benchmark": "accuracy", "runs": results}, indent=2))


if __name__ == "__main__":
    main()
