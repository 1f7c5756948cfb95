"""Time to a stated loss on the Poisson family: Adam alone against Adam then L-BFGS, in one run.

Both variants train the same model from the same initialisation with the real trainer
(``deepfusion.trainer.train``), checkpointing every few steps. Afterwards every
checkpoint's loss on the whole training set (the full-batch objective, the same for
both) is evaluated outside the timed runs. The stated loss is the one Adam alone reaches
at the end of its budget; each variant's time to it is the elapsed training time of its
first checkpoint at or below it. Prints one JSON object with the curves, both times and
``speedup_time_to_loss`` (Adam alone / Adam then L-BFGS; the goal is >= 2).

    python benchmarks/lbfgs.py [--adam-epochs 300] [--switch-epochs 60] [--lbfgs-iterations 150]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def curve(run_dir: Path, cfg, problem, params) -> list[dict]:
    """(step, optimizer, elapsed seconds, full training-set loss) at every checkpoint."""
    import torch

    from deepfusion.checkpoint import load_checkpoint
    from deepfusion.stepper import loss_sum
    from deepfusion.wiring import build_model

    # Epochs as passes over the training set: an Adam step is batch / n of one; L-BFGS
    # counts every sample its evaluations touched (line-search trials included).
    per_step = cfg.train.batch_size / len(params)
    adam_steps = 0
    elapsed = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["optimizer"] == "adam":
            adam_steps = r["step"]
            epochs = r["step"] * per_step
        else:
            epochs = adam_steps * per_step + r["samples_evaluated"] / len(params)
        elapsed[r["step"]] = (r["elapsed_s"], r["optimizer"], epochs)
    model = build_model(cfg, problem)
    p = torch.as_tensor(params, dtype=getattr(torch, cfg.train.dtype))
    points = []
    for path in sorted((run_dir / "checkpoints").glob("step-*.h5")):
        ckpt = load_checkpoint(path)
        ckpt.restore(model)
        with torch.no_grad():
            loss = float(loss_sum(model, problem, p)[0]) / len(p)
        seconds, optimizer, epochs = elapsed[ckpt.step]
        points.append({"step": ckpt.step, "optimizer": optimizer, "seconds": round(seconds, 3),
                       "epochs": round(epochs, 2), "loss": loss})
    return points


def run_variant(name: str, overrides: list[str], workdir: Path) -> tuple[list[dict], float]:
    import torch

    from deepfusion.wiring import build_model, build_problem, training_parameters
    from deepfusion.comm import SerialCommunicator
    from deepfusion.config import load_config, to_toml
    from deepfusion.trainer import train

    cfg = load_config(ROOT / "configs" / "poisson.toml", overrides)
    torch.manual_seed(cfg.data.seed)
    problem = build_problem(cfg)
    model = build_model(cfg, problem)
    params = training_parameters(cfg)
    run_dir = workdir / name
    run_dir.mkdir()
    print(f"--- {name}: {' '.join(overrides)}", file=sys.stderr, flush=True)
    result = train(model, problem, params, cfg.train, seed=cfg.data.seed, comm=SerialCommunicator(),
                   parallel=cfg.parallel, run_dir=run_dir, config_text=to_toml(cfg), threads=torch.get_num_threads(),
                   log=lambda line: print(line, file=sys.stderr, flush=True))
    return curve(run_dir, cfg, problem, params), result.seconds


def first_at(points: list[dict], target: float) -> dict | None:
    """The first curve point at or below ``target``."""
    return next((p for p in points if p["loss"] <= target), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolution", type=int, default=32)
    parser.add_argument("--adam-epochs", type=int, default=300)
    parser.add_argument("--switch-epochs", type=int, default=60, help="Adam epochs before L-BFGS")
    parser.add_argument("--lbfgs-iterations", type=int, default=150)
    parser.add_argument("--lbfgs-mode", choices=["full", "multibatch"], default="full")
    parser.add_argument("--lbfgs-batch", type=int, default=0, help="0: all 64 (full) or 16 (multibatch)")
    parser.add_argument("--lbfgs-history", type=int, default=20)
    parser.add_argument("--every", type=int, default=20, help="steps between checkpoints (curve points)")
    args = parser.parse_args()
    import torch

    from deepfusion.runtime import available_cores

    torch.set_num_threads(available_cores())
    common = [
        f"problem.resolution=[{args.resolution},{args.resolution}]",
        "multigrid.levels=[]",
        "model.channels=[8,16,32]",
        "data.n_train=64",
        "train.batch_size=16",
        "train.dtype=float64",  # L-BFGS's line search and curvature pairs need the precision
        f"train.log_every={args.every}",
        f"train.checkpoint_every={args.every}",
        "output.plots=false",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        adam, adam_s = run_variant("adam", common + ["train.optimizer=adam", f"train.epochs={args.adam_epochs}"],
                                   Path(tmp))
        hybrid, hybrid_s = run_variant(
            "adam+lbfgs",
            common + ["train.optimizer=adam+lbfgs", f"train.epochs={args.switch_epochs}",
                      f"train.lbfgs_iterations={args.lbfgs_iterations}", f"train.lbfgs_history={args.lbfgs_history}",
                      f"train.lbfgs_mode={args.lbfgs_mode}", f"train.lbfgs_batch={args.lbfgs_batch}",
                      "train.lbfgs_overlap=8",
                      "train.log_every=1", "train.checkpoint_every=5"],
            Path(tmp),
        )
    target = adam[-1]["loss"]
    hit_adam, hit_hybrid = first_at(adam, target), first_at(hybrid, target)
    t_adam = hit_adam["seconds"] if hit_adam else None
    t_hybrid = hit_hybrid["seconds"] if hit_hybrid else None
    out = {
        "benchmark": "lbfgs",
        "problem": f"poisson {args.resolution}^2, 64 training instances, U-Net [8,16,32], float64, 1 rank",
        "threads": torch.get_num_threads(),
        "target_loss": target,
        "target_is": f"the full-batch training loss Adam alone reaches after {args.adam_epochs} epochs",
        "adam": {"seconds_to_target": t_adam, "epochs_to_target": hit_adam and hit_adam["epochs"], "train_seconds": round(adam_s, 1),
                 "final_loss": adam[-1]["loss"], "curve": adam},
        "adam_then_lbfgs": {"seconds_to_target": t_hybrid, "epochs_to_target": hit_hybrid and hit_hybrid["epochs"],
                            "adam_epochs": args.switch_epochs,
                            "lbfgs_iterations": args.lbfgs_iterations, "lbfgs_mode": args.lbfgs_mode,
                            "lbfgs_batch": args.lbfgs_batch or (64 if args.lbfgs_mode == "full" else 16), "train_seconds": round(hybrid_s, 1),
                            "final_loss": hybrid[-1]["loss"], "curve": hybrid},
        "speedup_time_to_loss": round(t_adam / t_hybrid, 2) if t_adam and t_hybrid else None,
        "goal": 2.0,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
