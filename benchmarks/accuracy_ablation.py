"""The output basis, the coarse levels' loss and the residual's weighting, at equal wall time.

``--case poisson`` (the default): Poisson 128^2 trained four ways, ``model.output`` nodal or
multilevel x ``multigrid.coarse_loss`` rediscretised or galerkin, otherwise the same
multigrid run (configs/poisson.toml at 128^2, levels 32, 64, 128, deepened).
``--case loss``: Poisson (configs/poisson.toml: multilevel output, deepened levels) trained on the
Q1 energy or on the multigrid-preconditioned residual (``train.loss = "preconditioned"``, target and
loss forms; diffnet/multigrid/preconditioned.py); each row also gives the error against the grid's own
solution beside its data-free estimate |B g| / |u - B g|, and the time per step relative to the
energy's.
``--case coarse``: Poisson (the same config) on the Q1 energy, on issue 43's best (the preconditioned loss
with a second stage), and each again with the generator's exact coarse-space correction
(``model.coarse_correction = --coarse``, diffnet/multigrid/coarse.py); each row also gives the time per step and
per inference against the first arm's. A two-stage arm gives its first stage ``--first-share`` of the
budget and its second stage the rest, from its probe's step times (as benchmarks/second_stage.py).
``--case burgers``: viscous Burgers (configs/burgers_256.toml, levels 32 ... 256) with the
multilevel output and Galerkin coarse levels, the conservative residual plain or weighted by
``burgers.preconditioner = "implicit_diffusion"``.

Equal wall time: each arm first trains a few steps per level to time them (the probe), then
its epochs per level are the case's split scaled so that the predicted training time is the
budget. Each arm's error against the case's reference, the grid's floor, their ratio, the
error's share in the lowest modes and its cosine with the coarse imprint come from the run's
own eval.json. Prints one JSON object with ``ratio_<arm>`` and ``best_arm``.

    python benchmarks/accuracy_ablation.py [--case poisson|loss|coarse|burgers] [--budget-s 600] [--ranks 2] [--resolution 128]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launch import train_run  # noqa: E402  (benchmarks/launch.py, beside this script)


SECOND_STAGE = "train.second_stage_epochs=auto"  # an arm's marker: a second stage sized to the budget's rest


@dataclass(frozen=True)
class Case:
    """One ablation: its config, its arms (name -> ``--set`` overrides) and its schedule."""

    config: str
    arms: dict[str, tuple[str, ...]]
    split: dict[int, int]  # relative epochs per level
    lr: dict[int, float]  # peak rate per level
    n_train: int
    batch: int


CASES = {
    # The split is that of the 128^2 run in docs/results.md, row (e).
    "poisson": Case("poisson.toml", {
        "nodal_rediscretised": ("model.output=nodal", "multigrid.coarse_loss=rediscretised"),
        "nodal_galerkin": ("model.output=nodal", "multigrid.coarse_loss=galerkin"),
        "multilevel_rediscretised": ("model.output=multilevel", "multigrid.coarse_loss=rediscretised"),
        "multilevel_galerkin": ("model.output=multilevel", "multigrid.coarse_loss=galerkin"),
    }, {32: 38, 64: 19, 128: 10, 256: 6}, {32: 2e-3, 64: 1e-3, 128: 1e-3, 256: 1e-3}, 4096, 32),
    "loss": Case("poisson.toml", {
        "energy": ("train.loss=family",),
        "preconditioned_target": ("train.loss=preconditioned", "train.precondition_form=target"),
        "preconditioned_loss": ("train.loss=preconditioned", "train.precondition_form=loss"),
    }, {32: 38, 64: 19, 128: 10, 256: 6}, {32: 2e-3, 64: 1e-3, 128: 1e-3, 256: 1e-3}, 4096, 32),
    "coarse": Case("poisson.toml", {
        "energy": ("train.loss=family",),
        "preconditioned_two_stages": ("train.loss=preconditioned", "train.precondition_form=target", SECOND_STAGE),
        "coarse_energy": ("train.loss=family", "model.coarse_correction={coarse}"),
        "coarse_preconditioned_two_stages": ("train.loss=preconditioned", "train.precondition_form=target",
                                             "model.coarse_correction={coarse}", SECOND_STAGE),
    }, {32: 38, 64: 19, 128: 10, 256: 6}, {32: 2e-3, 64: 1e-3, 128: 1e-3, 256: 1e-3}, 1024, 32),
    # The split is configs/burgers_256.toml's own.
    "burgers": Case("burgers_256.toml", {
        "plain": ("model.output=multilevel", "multigrid.coarse_loss=galerkin", "burgers.preconditioner=none"),
        "preconditioned": ("model.output=multilevel", "multigrid.coarse_loss=galerkin",
                           "burgers.preconditioner=implicit_diffusion"),
    }, {32: 600, 64: 300, 128: 150, 256: 75}, {32: 2e-3, 64: 1e-3, 128: 1e-3, 256: 1e-3}, 64, 16),
}


def _levels(resolution: int) -> list[int]:
    levels = [n for n in (32, 64, 128, 256) if n <= resolution]
    if levels[-1] != resolution:
        raise SystemExit(f"accuracy_ablation.py: --resolution must be one of 64, 128, 256, got {resolution}")
    return levels


def _overrides(args, arm: str) -> list[str]:
    """The arm's own ``--set`` values (the second-stage marker left out: sized by main)."""
    return [o.format(coarse=getattr(args, "coarse", 17)) for o in CASES[args.case].arms[arm] if o != SECOND_STAGE]


def _base(args, levels: list[int], arm: str) -> list[str]:
    case = CASES[args.case]
    return [f"problem.resolution=[{args.resolution},{args.resolution}]", f"multigrid.levels={levels}",
            f"multigrid.lr={[case.lr[n] for n in levels]}", *_overrides(args, arm),
            f"data.n_train={args.n_train}", f"data.n_test={args.n_test}", f"train.batch_size={args.batch}",
            "multigrid.batch_size=[]", "output.plots=false", "train.checkpoint_every=0"]


def step_seconds(args, levels: list[int], arm: str, workdir: Path, extra: tuple[str, ...] = ()) -> list[float]:
    """Seconds per optimiser step on each level (and on a second stage's, with ``extra`` asking for one),
    from a probe of ``args.probe_steps`` steps per level."""
    run = workdir / f"probe-{arm}"
    n = args.batch * args.probe_steps
    train_run(ROOT / "configs" / CASES[args.case].config, run, args.ranks,
              _base(args, levels, arm) + [f"data.n_train={n}", "data.n_test=1", f"multigrid.epochs={[1] * len(levels)}",
                                          "train.log_every=1", *extra], quiet=True)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    out = []
    # Each level's steps, coarse to fine, then the second stage's (its own kind, on the finest level).
    for key in sorted({(r.get("kind") == "second", r["level"]) for r in records}):
        rates = [r["samples_per_s"] for r in records
                 if (r.get("kind") == "second", r["level"]) == key][1:]  # the first carries the warm-up
        out.append(args.batch / statistics.median(rates))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-s", type=float, default=600.0, help="training seconds per arm")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--resolution", type=int, default=128)
    parser.add_argument("--case", choices=list(CASES), default="poisson")
    parser.add_argument("--n-train", type=int, default=None, help="training instances (default: the case's)")
    parser.add_argument("--n-test", type=int, default=8)
    parser.add_argument("--batch", type=int, default=None, help="batch size (default: the case's)")
    parser.add_argument("--probe-steps", type=int, default=6)
    parser.add_argument("--arms", nargs="+", default=None,
                        help="a subset of the case's arms (" + "; ".join(f"{name}: " + ", ".join(case.arms)
                                                                            for name, case in CASES.items()) + ")")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--coarse", type=int, default=17, help="coarse nodes per side of the coarse-correction arms")
    parser.add_argument("--first-share", type=float, default=0.5, help="a two-stage arm's first stage's share of the budget")
    parser.add_argument("--lr2", type=float, default=1e-3, help="a two-stage arm's second stage's peak learning rate")
    args = parser.parse_args()
    case = CASES[args.case]
    args.n_train = case.n_train if args.n_train is None else args.n_train
    args.batch = case.batch if args.batch is None else args.batch
    args.arms = list(case.arms) if args.arms is None else args.arms
    unknown = [a for a in args.arms if a not in case.arms]
    if unknown:
        raise SystemExit(f"accuracy_ablation.py: --arms {unknown[0]!r} is not an arm of --case {args.case} "
                         f"(one of {', '.join(case.arms)})")
    if not (args.budget_s > 0 and args.ranks >= 1 and args.probe_steps >= 2 and args.n_train >= args.batch >= 1):
        raise SystemExit("accuracy_ablation.py: need --budget-s > 0, --ranks >= 1, --probe-steps >= 2, "
                         "--n-train >= --batch >= 1")
    levels = _levels(args.resolution)
    steps_per_epoch = args.n_train // args.batch
    result = {"case": args.case, "resolution": args.resolution, "levels": levels, "budget_s": args.budget_s, "ranks": args.ranks,
              "n_train": args.n_train, "batch": args.batch, "arms": {}}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        for arm in args.arms:
            staged = SECOND_STAGE in case.arms[arm]
            second = (f"train.second_stage_lr={args.lr2}",) if staged else ()
            per_step = step_seconds(args, levels, arm, workdir, second + (("train.second_stage_epochs=1",) if staged else ()))
            per_step2 = per_step.pop() if staged else None
            first_budget = args.budget_s * (args.first_share if staged else 1.0)
            per_epoch = [steps_per_epoch * t for t in per_step]
            scale = first_budget / sum(case.split[n] * e for n, e in zip(levels, per_epoch))
            epochs = [max(1, round(scale * case.split[n])) for n in levels]
            sets = [f"multigrid.epochs={epochs}", *second]
            if staged:
                epochs2 = max(1, round((args.budget_s - first_budget) / (steps_per_epoch * per_step2)))
                sets.append(f"train.second_stage_epochs={epochs2}")
            run = workdir / arm
            train_run(ROOT / "configs" / CASES[args.case].config, run, args.ranks, _base(args, levels, arm) + sets)
            report = json.loads((run / "eval.json").read_text())
            row = {"epochs": epochs, "step_seconds": [round(t, 4) for t in per_step],
                   "inference_seconds": report["inference_seconds"],
                   "train_seconds": round(report["train_seconds"], 1),
                   "mean_rel_l2": report["mean_rel_l2"], "mean_floor": report["mean_floor"],
                   "ratio_to_floor": report["ratio_to_floor"], "mean_low_mode_share": report["mean_low_mode_share"],
                   "mean_imprint_cosine": report.get("mean_imprint_cosine")}
            if staged:
                row |= {"second_stage_epochs": epochs2, "second_stage_step_seconds": round(per_step2, 4),
                        "first_stage_ratio_to_floor": report["first_stage_ratio_to_floor"]}
            if "grid_rel_l2" in report:  # the family can precondition: the error on its own grid and its estimate
                row["mean_grid_rel_l2"] = statistics.mean(report["grid_rel_l2"])
                row["mean_estimated_grid_rel_l2"] = statistics.mean(report["estimated_grid_rel_l2"])
            result["arms"][arm] = row
            result[f"ratio_{arm}"] = round(report["ratio_to_floor"], 3)
            print(f"{arm}: {json.dumps(row)}", file=sys.stderr, flush=True)
    first = result["arms"][args.arms[0]]
    for row in result["arms"].values():  # the finest level's step time and the inference against the first arm's
        row["step_time_vs_first_arm"] = round(row["step_seconds"][-1] / first["step_seconds"][-1], 3)
        row["inference_time_vs_first_arm"] = round(row["inference_seconds"] / first["inference_seconds"], 3)
    result["best_arm"] = min(result["arms"], key=lambda a: result["arms"][a]["ratio_to_floor"])
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
