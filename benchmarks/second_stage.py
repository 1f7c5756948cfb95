"""A second stage against one longer stage, at equal wall time, on the preconditioned loss.

One stage: configs/poisson.toml at ``--resolution`` with ``train.loss = "preconditioned"``, trained for
the whole budget (its epochs per level from a probe, as in accuracy_ablation.py). Two stages: the
same config with ``train.second_stage_epochs`` (diffnet/generators/two_stage.py): the first stage for
``--first-share`` of the budget, then a second U-Net v on u = u1 + eps v (multi-stage networks,
Wang & Lai, J. Comput. Phys. 2024) for the rest, the epochs of each from the probe's step times.
Both are evaluated by `deepfusion train` on the same held-out instances: error against the reference,
the grid's floor, their ratio, the error against the grid's own solution, and the two-stage run's
first stage alone; and each again after one polish V-cycle (`Surrogate(..., polish=1)`), the
cheaper way to the same accuracy the second stage must beat. Prints one JSON object.

    python benchmarks/second_stage.py [--resolution 64] [--budget-s 600] [--ranks 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from accuracy_ablation import CASES, _base, _levels, step_seconds  # noqa: E402
from launch import train_run  # noqa: E402

ARM = "preconditioned_target"


def _epochs(args, levels, per_step: list[float], budget: float) -> list[int]:
    """Epochs per level that fill ``budget`` seconds, in the case's split."""
    case = CASES["loss"]
    per_epoch = [(args.n_train // args.batch) * t for t in per_step]
    scale = budget / sum(case.split[n] * e for n, e in zip(levels, per_epoch))
    return [max(1, round(scale * case.split[n])) for n in levels]


def _polished_ratio(run: Path, cycles: int = 1) -> float:
    """The run's held-out fields after ``cycles`` polish V-cycles, over the floor (its own reference fields)."""
    import h5py
    import numpy as np

    from deepfusion import Surrogate
    from deepfusion.analysis.inference import relative_l2

    with h5py.File(run / "test_reference.h5") as f:
        truth, params = f["u"][...], f["a"][...]
    fields = Surrogate.load(run).fields(params, polish=cycles)
    report = json.loads((run / "eval.json").read_text())
    return float(np.mean(relative_l2(fields, truth)) / report["mean_floor"])


def _row(run: Path) -> dict:
    report = json.loads((run / "eval.json").read_text())
    row = {"train_seconds": round(report["train_seconds"], 1), "mean_rel_l2": report["mean_rel_l2"],
           "mean_floor": report["mean_floor"], "ratio_to_floor": report["ratio_to_floor"],
           "mean_grid_rel_l2": sum(report["grid_rel_l2"]) / len(report["grid_rel_l2"]),
           "ratio_with_one_polish_v_cycle": _polished_ratio(run)}
    if "first_stage_ratio_to_floor" in report:
        row["first_stage_ratio_to_floor"] = report["first_stage_ratio_to_floor"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-s", type=float, default=600.0, help="training seconds per arm")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--resolution", type=int, default=64)
    parser.add_argument("--n-train", type=int, default=1024)
    parser.add_argument("--n-test", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--probe-steps", type=int, default=4)
    parser.add_argument("--first-share", type=float, default=0.5, help="the first stage's share of the budget")
    parser.add_argument("--lr2", type=float, default=1e-3, help="the second stage's peak learning rate")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--reuse", action="store_true",
                        help="take the one-stage run already in --workdir instead of training it again")
    args = parser.parse_args()
    args.case = "loss"
    if not (args.budget_s > 0 and args.n_train >= args.batch >= 1 and 0 < args.first_share < 1):
        raise SystemExit("second_stage.py: need --budget-s > 0, --n-train >= --batch >= 1 and 0 < --first-share < 1")
    levels = _levels(args.resolution)
    config = ROOT / "configs" / CASES["loss"].config
    result = {"resolution": args.resolution, "budget_s": args.budget_s, "n_train": args.n_train, "batch": args.batch,
              "first_share": args.first_share}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        second = (f"train.second_stage_lr={args.lr2}",)
        *per_step, per_step2 = step_seconds(args, levels, ARM, workdir, second + ("train.second_stage_epochs=1",))
        if not (args.reuse and (workdir / "one_stage" / "eval.json").is_file()):
            train_run(config, workdir / "one_stage", args.ranks,
                      _base(args, levels, ARM) + [f"multigrid.epochs={_epochs(args, levels, per_step, args.budget_s)}"])
        one = _row(workdir / "one_stage")
        # Equal wall time with the one-stage run as it went (its probe-planned budget is only a plan).
        first = _epochs(args, levels, per_step, args.first_share * one["train_seconds"])
        rest = (1 - args.first_share) * one["train_seconds"]
        epochs2 = max(1, round(rest / ((args.n_train // args.batch) * per_step2)))
        train_run(config, workdir / "two_stages", args.ranks,
                  _base(args, levels, ARM) + [f"multigrid.epochs={first}", f"train.second_stage_epochs={epochs2}", *second])
        result["one_stage"], result["two_stages"] = one, _row(workdir / "two_stages") | {"second_stage_epochs": epochs2}
        result["step_seconds"] = {"first_stage_finest": per_step[-1], "second_stage": per_step2}
    result["ratio_one_stage"] = round(result["one_stage"]["ratio_to_floor"], 3)
    result["ratio_two_stages"] = round(result["two_stages"]["ratio_to_floor"], 3)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
