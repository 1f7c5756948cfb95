"""Train the Burgers configs and measure accuracy against the Godunov reference.

Prints one JSON object: for each config, the mean and per-instance relative L2 error on
the held-out c, training time and samples/s, and -- the baseline measured in the same
run -- the Godunov reference solve time for the same instances against DiffNet's
inference time (``speedup_inference_vs_godunov``).

    python benchmarks/burgers_accuracy.py [--config configs/burgers.toml ...] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL = {"configs/burgers.toml": 0.10}


def run(config: str, overrides: list[str], workdir: Path) -> dict:
    run_dir = workdir / Path(config).stem
    cmd = [sys.executable, "-m", "deepfusion", "train", str(ROOT / config), "--out", str(run_dir)]
    for item in overrides:
        cmd += ["--set", item]
    print(f"$ {' '.join(cmd)}", file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, stdout=sys.stderr)
    report = json.loads((run_dir / "eval.json").read_text())
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steady = [m["samples_per_s"] for m in metrics[len(metrics) // 5 :]]  # after warm-up
    out = {
        "config": config,
        "overrides": overrides,
        "c": report["c"],
        "rel_l2": [round(e, 4) for e in report["rel_l2"]],
        "mean_rel_l2": round(report["mean_rel_l2"], 4),
        "train_seconds": round(report["train_seconds"], 1),
        "samples_per_s": round(sum(steady) / len(steady), 1),
        "ranks": metrics[-1]["ranks"],
        "threads": metrics[-1]["threads"],
        "godunov_seconds": round(report["reference_seconds"], 3),
        "inference_seconds": round(report["inference_seconds"], 4),
        "speedup_inference_vs_godunov": round(report["reference_seconds"] / report["inference_seconds"], 1),
    }
    if config in GOAL:
        out["goal_mean_rel_l2"] = GOAL[config]
        out["meets_goal"] = report["mean_rel_l2"] <= GOAL[config]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", action="append", help="config(s) relative to the repository root")
    parser.add_argument("--set", action="append", default=[], help="override passed to every run")
    args = parser.parse_args()
    configs = args.config or ["configs/burgers.toml", "configs/burgers_inviscid.toml"]
    with tempfile.TemporaryDirectory() as tmp:
        results = [run(c, args.set, Path(tmp)) for c in configs]
    print(json.dumps({"benchmark": "burgers_accuracy", "runs": results}, indent=2))


if __name__ == "__main__":
    main()
