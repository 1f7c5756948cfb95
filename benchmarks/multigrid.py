"""Multigrid against single-level training: time to the same held-out error, per resolution, in one run.

For each resolution R the config's multigrid schedule (its levels up to R) is trained
and its checkpoints evaluated on the held-out instances against the independent
reference (with the grid's floor); then the same config trained single-level at R (the
``[train]`` section's lr, batch and schedule, the epochs sized so that the run lasts
``--factor`` times the multigrid run) and evaluated the same way. ``time_to_error_speedup``
is the training time single-level needs to reach the multigrid run's final error over the
multigrid run's training time; when single-level never gets there within its budget the
figure is a lower bound (``"lower_bound": true``). Training times are the runs' own
(``metrics.jsonl``), evaluation excluded. Prints one JSON object and draws error against
training time (``--plot``).

    python benchmarks/multigrid.py [--config configs/burgers_256.toml] [--resolutions 128 256]
                                   [--ranks 2] [--factor 3] [--set KEY=VALUE ...] [--plot FILE.png]
                                   [--keep DIR]   (finished runs kept in DIR are reused)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from curves import checkpoint_curve, save_figure, time_to  # noqa: E402  (benchmarks/curves.py and launch.py, beside this script)
from launch import train_run  # noqa: E402


def train(config: Path, out: Path, ranks: int, sets: list[str]) -> None:
    if (out / "eval.json").is_file():  # a finished run kept by an earlier --keep invocation
        print(f"reusing the finished run {out}", file=sys.stderr, flush=True)
        return
    train_run(config, out, ranks, sets)


def curve(run: Path) -> dict:
    """Held-out error of every checkpoint of ``run`` at its grid, against its training time."""
    from deepfusion.configuration.config import load_config
    from deepfusion.configuration.run import Run
    from deepfusion.files.fields import read_fields

    cfg = load_config(run / "config.toml")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # Where the time goes: each visit's training seconds (its last record's clock minus the previous visit's).
    ends: dict[int, tuple[list, float]] = {}
    for r in records:
        ends[r.get("visit", r.get("stage"))] = (r.get("grid", list(cfg.problem.resolution)), r["elapsed_s"])
    visit_seconds, before = [], 0.0
    for visit in sorted(ends):
        grid, end = ends[visit]
        visit_seconds.append({"visit": visit, "grid": grid, "seconds": end - before})
        before = end
    # The run's own evaluation holds the floor and, in test_reference.h5, the reference fields.
    evaluation = json.loads((run / "eval.json").read_text())
    truth = read_fields(run / "test_reference.h5")["u"]
    points = checkpoint_curve(run, {"error": (Run.from_config(cfg).heldout, truth)})
    return {"train_seconds": evaluation["train_seconds"], "error": evaluation["mean_rel_l2"],
            "floor": evaluation["mean_floor"], "ratio_to_floor": evaluation["ratio_to_floor"],
            "visit_seconds": visit_seconds, "curve": points}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "burgers_256.toml")
    parser.add_argument("--resolutions", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--factor", type=float, default=3.0, help="single-level budget / multigrid time")
    parser.add_argument("--checkpoints", type=int, default=12, help="checkpoints per run (the curve's points)")
    parser.add_argument("--set", action="append", default=[], help="override passed to every run")
    parser.add_argument("--plot", type=Path, help="PNG of error against training time")
    parser.add_argument("--keep", type=Path, help="keep the run directories here; finished ones are reused")
    args = parser.parse_args()

    from deepfusion.configuration.config import load_config
    from deepfusion.configuration.schedule import build_schedule

    base = load_config(args.config, args.set)
    result = {"benchmark": "multigrid", "config": str(args.config), "ranks": args.ranks, "factor": args.factor,
              "overrides": args.set, "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        for res in args.resolutions:
            mg = base.multigrid
            keep = [k for k, n in enumerate(mg.levels) if n <= res]
            if not keep or mg.levels[keep[-1]] != res:
                sys.exit(f"multigrid.py: {res} is not one of the config's multigrid.levels {list(mg.levels)}")
            pick = lambda values: "[" + ",".join(str(values[k]) for k in keep) + "]" if values else "[]"  # noqa: E731
            level_sets = [f"problem.resolution=[{res},{res}]", f"multigrid.levels={pick(mg.levels)}",
                          f"multigrid.epochs={pick(mg.epochs)}", f"multigrid.lr={pick(mg.lr)}",
                          f"multigrid.batch_size={pick(mg.batch_size)}"]
            cfg = load_config(args.config, [*args.set, *level_sets])
            steps = build_schedule(cfg)[-1].end
            common = [*args.set, "train.keep_checkpoints=0", "output.plots=false"]
            train(args.config, work / f"multigrid_{res}", args.ranks,
                  [*common, *level_sets, f"train.checkpoint_every={max(1, steps // args.checkpoints)}"])
            multi = curve(work / f"multigrid_{res}")
            # Single level: size the epochs from a one-epoch run's steady throughput.
            single_sets = [f"problem.resolution=[{res},{res}]", "multigrid.levels=[]", "multigrid.epochs=[]",
                           "multigrid.lr=[]", "multigrid.batch_size=[]"]
            probe = work / f"probe_{res}"
            train(args.config, probe, args.ranks, [*common, *single_sets, "train.epochs=1",
                                                   "train.log_every=1", "train.checkpoint_every=0"])
            rates = [json.loads(line)["samples_per_s"] for line in (probe / "metrics.jsonl").read_text().splitlines()]
            rate = float(np.median(rates[len(rates) // 4:]))
            epochs = max(1, math.ceil(args.factor * multi["train_seconds"] * rate / cfg.data.n_train))
            per_epoch = cfg.data.n_train // cfg.train.batch_size
            train(args.config, work / f"single_{res}", args.ranks,
                  [*common, *single_sets, f"train.epochs={epochs}",
                   f"train.checkpoint_every={max(1, epochs * per_epoch // args.checkpoints)}"])
            single = curve(work / f"single_{res}")
            reached = time_to(single["curve"], multi["error"])
            budget = single["train_seconds"]
            row = {"resolution": res, "multigrid": multi, "single_level": single | {"epochs": epochs},
                   "single_level_time_to_multigrid_error": reached,
                   "time_to_error_speedup": (reached if reached is not None else budget) / multi["train_seconds"],
                   "lower_bound": reached is None}
            result["rows"].append(row)
            result[f"time_to_error_speedup_{res}"] = row["time_to_error_speedup"]
            print(f"{res}^2: multigrid {multi['error']:.5f} in {multi['train_seconds']:.0f} s; single level "
                  + (f"reaches it at {reached:.0f} s" if reached is not None else
                     f"never reaches it in {budget:.0f} s (final {single['error']:.5f})")
                  + f": speed-up {'>= ' if reached is None else ''}{row['time_to_error_speedup']:.2f}",
                  file=sys.stderr, flush=True)
    if args.plot:
        plot(result["rows"], args.plot)
        result["plot"] = str(args.plot)
    print(json.dumps(result, indent=2))


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(rows), figsize=(5.5 * len(rows), 4), squeeze=False)
    for ax, row in zip(axes[0], rows):
        for key, label, style in (("multigrid", "multigrid", "o-"), ("single_level", "single level", "s-")):
            pts = row[key]["curve"]
            ax.semilogy([p["seconds"] for p in pts], [p["error"] for p in pts], style, label=label, markersize=3)
        ax.axhline(row["multigrid"]["floor"], color="grey", linestyle=":", label="floor")
        ax.set_title(f"{row['resolution']}²: speed-up {'≥ ' if row['lower_bound'] else ''}"
                     f"{row['time_to_error_speedup']:.1f}×", fontsize=10)
        ax.set_xlabel("training time, s")
        ax.set_ylabel("held-out rel. L2 error")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    save_figure(fig, out)


if __name__ == "__main__":
    main()
