"""DiffNet against the tools a user would pick instead, on the same family, the same held-out instances and truth,
the same machine and the same wall clock: DeepXDE's parametric PINN, DeepXDE on one instance with the whole budget,
and a Fourier neural operator (``neuraloperator``) trained on the classical solver's fields, the solves counted.

The budget is the DiffNet run's own training time (``--budget`` to set another); every arm trains in one process on
``--threads`` threads (the cores the run trained on). For each arm: its held-out error against the truth, the floor
(the same-grid FEM: the best any field on this grid gets), their ratio, the derived fields' (flux, stress) ratios to
their floors, its training seconds and inference per instance; its error against its training seconds (evaluations
off the clock); and DiffNet's, read off the run's checkpoints (``benchmarks/curves.py``), so that each peer is read
twice: DiffNet's error at the peer's budget over the peer's, and the seconds DiffNet took to reach the peer's best.

    mpiexec -n 2 deepfusion train configs/poisson.toml --out runs/poisson --set train.checkpoint_every=64
    python benchmarks/peers.py runs/poisson [--arms pinn pinn-one fno] [--budget S] [--samples 16]
                               [--threads 2] [--out FILE.json] [--figure FILE.png]

Needs the ``peers`` extra: ``pip install -e ".[peers]"`` (DeepXDE on its pytorch backend, neuraloperator). The peers'
setups: ``benchmarks/peer_arms`` and docs/results.md ("The peers").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

ARMS = ("pinn", "pinn-one", "fno")
NAMES = {"diffnet": "DiffNet (shipped config)", "finish": "its finish alone (no network)",
         "pinn": "DeepXDE PINN, parametric", "pinn-one": "DeepXDE PINN, one instance", "fno": "FNO on solver data",
         "fno+finish": "FNO + DiffNet's finish"}


def diffnet_arm(run: Path, test: np.ndarray, truth: np.ndarray) -> dict:
    """The trained run: its product's held-out fields (timed warm, one query's set-up each), its training seconds
    and its error curve over its checkpoints; and the same finish from the lift alone, no network."""
    from curves import checkpoint_curve
    from deepfusion.configuration.config import load_config
    from deepfusion.configuration.run import Run
    from deepfusion.files.checkpoint import latest_checkpoint, load_checkpoint
    from sweeps import lift

    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    made = Run.from_config(load_config(run / "config.toml"))
    model = made.build_model()
    load_checkpoint(latest_checkpoint(run / "checkpoints")).restore(model)
    model.eval()
    product = made.product(model)
    pred, infer = _timed(product, test)
    # What the network adds: the same finish (coarse correction, sweeps) from the boundary data's lift alone.
    alone, alone_infer = _timed(made.product(lift(model, made, test)), test)
    # The first instance's alone beside the mean: the one-instance PINN is read against DiffNet on its instance.
    curve = checkpoint_curve(run, {"error": (test, truth), "error_first": (test[:1], truth[:1])}, quiet=True)
    return {"fields": pred, "train_seconds": float(records[-1]["elapsed_s"]), "inference_per_instance_s": infer,
            "curve": curve}, {"fields": alone, "train_seconds": 0.0, "inference_per_instance_s": alone_infer, "curve": []}


def _timed(product, test: np.ndarray) -> tuple[np.ndarray, float]:
    """The product's held-out fields and its seconds per instance, warm, each paying its own set-up."""
    import torch

    with torch.no_grad():
        product.fields(test)
        product.clear_caches()
        t0 = time.perf_counter()
        pred = product.fields(test)
    return pred, (time.perf_counter() - t0) / len(test)


def rows(family, test: np.ndarray, arms: dict, acc) -> dict:
    """Each arm's error, floor, ratio and derived ratios on the instances it answers (the one-instance PINN: the
    first), beside DiffNet's on the same instances."""
    from curves import time_to, value_at
    from deepfusion.analysis.derived import measure
    from deepfusion.analysis.inference import relative_l2

    out = {}
    diffnet = arms["diffnet"]
    for name, arm in arms.items():
        which = slice(0, 1) if name == "pinn-one" else slice(None)
        pred, truth, optimum = arm["fields"], acc.truth[which], acc.optimum[which]
        error, floor = relative_l2(pred, truth), acc.floor[which]
        derived = measure(family, test[which], pred, truth, optimum)
        row = {"arm": NAMES[name], "instances": int(len(pred)), "error": float(error.mean()),
               "floor": float(floor.mean()), "ratio": float(error.mean() / floor.mean()),
               "derived": {k: v["ratio_to_floor"] for k, v in derived.errors.items()},
               **({"energy_norm_ratio": derived.energy["ratio_to_floor"]} if derived.energy else {}),
               "train_seconds": arm["train_seconds"], "inference_per_instance_s": arm["inference_per_instance_s"],
               "curve": arm["curve"], **{k: v for k, v in arm.items() if k not in ("fields", "curve", "module")}}
        if name not in ("diffnet", "finish"):
            own = float(relative_l2(diffnet["fields"][which], truth).mean())
            best = min(arm["curve"], key=lambda p: p["error"])
            diffnet_curve = diffnet["curve"] if name != "pinn-one" else \
                [dict(p, error=p["error_first"]) for p in diffnet["curve"]]
            reach = time_to(diffnet_curve, best["error"])
            equal_clock = value_at(diffnet_curve, arm["train_seconds"])
            row |= {"diffnet_error_same_instances": own,
                    "diffnet_error_at_equal_clock": equal_clock,
                    "error_over_diffnet": float(error.mean()) / equal_clock,
                    "best_error": best["error"], "best_seconds": best["seconds"],
                    "diffnet_seconds_to_best": reach,
                    # DiffNet's first checkpoint already below: its time to the peer's best is at most that.
                    "diffnet_seconds_is_bound": reach is not None and reach == diffnet_curve[0]["seconds"],
                    "time_over_diffnet": None if reach is None else best["seconds"] / reach}
            row["tenfold"] = bool(row["error_over_diffnet"] >= 10 or (reach is not None and row["time_over_diffnet"] >= 10))
        out[name] = row
    return out


def figure(results: dict, path: Path) -> None:
    """Each family's error curves against training seconds, the floor dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from curves import save_figure

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.2), squeeze=False)
    for ax, (family, found) in zip(axes[0], results.items()):
        for name, row in found["arms"].items():
            pts = [(p["seconds"], p["error"]) for p in row["curve"] if p["seconds"] > 0]
            if pts:
                ax.loglog(*zip(*pts), marker="o", ms=3, label=f"{NAMES[name]}{' (its instance)' * (name == 'pinn-one')}: "
                                                           f"{row['error']:.2g}")
        ax.axhline(found["arms"]["finish"]["error"], color="0.5", ls=":", lw=1,
                   label=f"{NAMES['finish']}, untrained: {found['arms']['finish']['error']:.2g}")
        ax.axhline(found["floor"], color="k", ls="--", lw=1, label=f"floor {found['floor']:.2g}")
        ax.set(title=f"{family} ({found['grid']}, {found['instances']} held-out)", xlabel="training seconds",
               ylabel="mean relative L2 vs truth")
        ax.legend(fontsize=8)
    save_figure(fig, path)


def main(argv=None) -> int:
    from peer_arms.pinn import PinnSetup  # its defaults are the options' (DeepXDE itself is imported when a PINN trains)

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="trained DiffNet run directories (the shipped configs)")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--budget", type=float, help="training seconds per peer (default: the run's own)")
    parser.add_argument("--samples", type=int, default=16, help="held-out instances (the run's first)")
    parser.add_argument("--threads", type=int, default=2, help="threads of every arm (the cores the run trained on)")
    parser.add_argument("--pinn-adam-share", type=float, default=PinnSetup.adam_share,
                        help=f"the share of a PINN's budget Adam takes, L-BFGS the rest (default {PinnSetup.adam_share})")
    parser.add_argument("--pinn-one-adam-share", type=float, default=PinnSetup.one_adam_share,
                        help=f"the same for the one-instance PINN (default {PinnSetup.one_adam_share})")
    parser.add_argument("--pinn-bc-weight", type=float, default=PinnSetup.bc_weight,
                        help=f"a PINN's weight of each side's penalty (default {PinnSetup.bc_weight:g})")
    parser.add_argument("--pinn-points", type=int, default=PinnSetup.points,
                        help=f"a PINN's collocation points (default {PinnSetup.points})")
    parser.add_argument("--out", type=Path, default=Path("peers.json"))
    parser.add_argument("--figure", type=Path, help="the error curves (default: beside --out)")
    args = parser.parse_args(argv)
    for option in ("pinn_adam_share", "pinn_one_adam_share"):
        if not 0.0 <= getattr(args, option) <= 1.0:
            parser.error(f"--{option.replace('_', '-')}: a share of the budget in [0, 1], got {getattr(args, option):g}")
    if not args.pinn_bc_weight > 0:
        parser.error(f"--pinn-bc-weight: a positive weight, got {args.pinn_bc_weight:g}")
    if args.pinn_points < 1:
        parser.error(f"--pinn-points: at least 1, got {args.pinn_points}")
    for run in args.runs:
        if not (run / "metrics.jsonl").is_file():
            parser.error(f"{run}: not a finished run directory (no metrics.jsonl)")

    import torch

    from deepfusion.analysis import reference_cache
    from deepfusion.analysis.inference import against_floor, relative_l2
    from deepfusion.configuration.config import load_config
    from deepfusion.configuration.run import Run
    from peer_arms.fno import train_fno
    from peer_arms.pinn import train_pinn

    torch.set_num_threads(args.threads)
    pinn = PinnSetup(points=args.pinn_points, adam_share=args.pinn_adam_share, one_adam_share=args.pinn_one_adam_share,
                     bc_weight=args.pinn_bc_weight)
    results = {}
    for run in args.runs:
        made = Run.from_config(load_config(run / "config.toml"))
        family, test = made.family, made.heldout_first(args.samples)
        print(f"{run}: {family.name} on {'x'.join(map(str, family.resolution))}, {len(test)} held-out; truth and floor ...",
              file=sys.stderr, flush=True)
        # The truth once; the floor once (against_floor solves it, or reads the cache): its own error, of the truth
        # against itself, is not used (rows measures each arm).
        truth = reference_cache.truth(family, test)
        acc = against_floor(family, test, truth, truth=truth)
        truth = acc.truth  # on the family's domain, where it has one
        arms = dict(zip(("diffnet", "finish"), diffnet_arm(run, test, truth)))
        budget = args.budget or arms["diffnet"]["train_seconds"]
        print(f"  DiffNet: trained in {budget:.0f} s; each peer gets as long", file=sys.stderr, flush=True)

        def score(fields, which=slice(None)):
            return float(relative_l2(fields, truth[which]).mean())

        for name in args.arms:
            if name == "fno":
                arms[name] = train_fno(family, made.training, test, score, budget, label=f"{family.name} fno")
                # The peer given DiffNet's own finish (its coarse correction and sweeps) in its network's place: is
                # it the network or the finish that wins?
                pred, infer = _timed(made.product(arms[name]["module"]), test)
                arms["fno+finish"] = {"fields": pred, "train_seconds": arms[name]["train_seconds"],
                                      "inference_per_instance_s": infer,
                                      "curve": [{"seconds": arms[name]["train_seconds"], "error": score(pred)}]}
            elif name == "pinn":
                arms[name] = train_pinn(family, test, score, budget, pinn, label=f"{family.name} pinn")
            else:
                arms[name] = train_pinn(family, test[:1], lambda f: score(f, slice(0, 1)), budget, pinn, fixed=test[0],
                                        label=f"{family.name} pinn-one")
        found = rows(family, test, arms, acc)
        results[family.name] = {"run": str(run), "grid": "x".join(map(str, family.resolution)),
                                "instances": int(len(test)), "budget_s": budget, "threads": args.threads,
                                "floor": float(acc.floor.mean()), "truth": acc.truth_name, "arms": found}
        print_table(family.name, results[family.name])
    versions = peer_versions()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"versions": versions, "date": time.strftime("%Y-%m-%d"), "results": results},
                                   indent=2, default=float) + "\n")
    figure(results, args.figure or args.out.with_suffix(".png"))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def peer_versions() -> dict:
    from importlib.metadata import version

    return {p: version(p) for p in ("deepxde", "neuraloperator", "torch")}


def print_table(name: str, found: dict) -> None:
    print(f"\n{name} ({found['grid']}, {found['instances']} held-out, {found['budget_s']:.0f} s each, "
          f"{found['threads']} threads; floor {found['floor']:.4f})")
    print(f"{'arm':<30} {'error':>8} {'ratio':>7} {'derived':>16} {'train s':>8} {'ms/inst':>8} "
          f"{'err/DiffNet':>11} {'DiffNet s to best':>17}")
    for row in found["arms"].values():
        derived = ", ".join(f"{v:.3g}" for v in row["derived"].values())
        reach = row.get("diffnet_seconds_to_best")
        print(f"{row['arm']:<30} {row['error']:8.4f} {row['ratio']:7.2f} {derived:>16} {row['train_seconds']:8.0f} "
              f"{1e3 * row['inference_per_instance_s']:8.2f} "
              + ("" if "error_over_diffnet" not in row else
                 f"{row['error_over_diffnet']:11.1f} " + ("never" if reach is None else
                                                          ("<= " if row["diffnet_seconds_is_bound"] else "")
                                                          + f"{reach:.0f}").rjust(17)))


if __name__ == "__main__":
    sys.exit(main())
