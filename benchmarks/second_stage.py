"""A second stage against one longer stage, at equal wall time, on the preconditioned loss.

One stage: configs/poisson.toml at ``--resolution`` with ``train.loss = "preconditioned"``, trained for
the whole budget (its epochs per level from a probe, as in accuracy_ablation.py). Two stages: the
same run for half the budget, then a second U-Net v trained for the other half on
u = u1 + eps v (multi-stage networks, Wang & Lai, J. Comput. Phys. 2024): u1 the first stage's
field, eps per sample the first stage's estimated error |B g1| (RMS), v fed the first stage's inputs
and the scaled correction B g1 / eps, trained on the same loss of u (diffnet/preconditioned.py).
Both are evaluated on the same held-out instances: error against the reference, the grid's floor,
their ratio, and the error against the grid's own solution. Prints one JSON object.

    python benchmarks/second_stage.py [--resolution 64] [--budget-s 600] [--ranks 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from accuracy_ablation import CASES, _base, _levels, step_seconds  # noqa: E402
from launch import train_run  # noqa: E402


def _stage_one(args, levels, budget: float, run: Path, workdir: Path) -> None:
    case = CASES["loss"]
    per_step = step_seconds(args, levels, "preconditioned_target", workdir)
    per_epoch = [(args.n_train // args.batch) * t for t in per_step]
    scale = budget / sum(case.split[n] * e for n, e in zip(levels, per_epoch))
    epochs = [max(1, round(scale * case.split[n])) for n in levels]
    train_run(ROOT / "configs" / case.config, run, args.ranks,
              _base(args, levels, "preconditioned_target") + [f"multigrid.epochs={epochs}"])


class _Second:
    """The second stage's data: the first stage's field, its estimated error and correction per instance."""

    def __init__(self, problem, surrogate, params):
        import torch

        from diffnet.vcycle import VCycle, loss_gradient
        
        p = torch.as_tensor(params, dtype=torch.float64)
        self.u1 = torch.as_tensor(surrogate.fields(params), dtype=torch.float64)
        B = VCycle.build(problem, self.u1, p)
        d = B(loss_gradient(problem, self.u1, p) * B.levels[0].free)
        self.eps = d.square().mean(dim=tuple(range(1, d.ndim))).sqrt().clamp_min(1e-12)
        self.channel = (d / self.eps.reshape(-1, *([1] * (d.ndim - 1)))).float()  # the correction the stage must make


def _second_inputs(problem, params, data: _Second, index):
    import torch

    x = problem.inputs(torch.as_tensor(params[index], dtype=torch.float32))
    return torch.cat([x, data.channel[index, None]], dim=1)


def _second_field(problem, raw, params, data: _Second, index):
    import torch

    p = torch.as_tensor(params[index], dtype=torch.float64)
    zero = problem.field(torch.zeros_like(raw), p.float())
    correction = (problem.field(raw, p.float()) - zero).double()  # the homogeneous boundary conditions
    return data.u1[index] + data.eps[index].reshape(-1, *([1] * (raw.ndim - 2))) * correction


def _stage_two(args, run: Path, budget: float) -> tuple[dict, float]:
    import numpy as np
    import torch

    from deepfusion.config import load_config
    from deepfusion.evaluate import against_floor, relative_l2
    from deepfusion.surrogate import Surrogate
    from deepfusion.wiring import build_problem, heldout_parameters, training_parameters
    from diffnet.networks import UNet
    from diffnet.preconditioned import PreconditionedLoss

    cfg = load_config(run / "config.toml")
    problem = build_problem(cfg)
    surrogate = Surrogate.load(run)
    train, test = training_parameters(cfg), heldout_parameters(cfg)
    t0 = time.perf_counter()
    data_train, data_test = _Second(problem, surrogate, train), _Second(problem, surrogate, test)
    setup = time.perf_counter() - t0  # the first stage's fields and corrections: part of the budget
    model = UNet(problem.in_channels + 1, 1, tuple(cfg.model.channels), output="multilevel")
    loss = PreconditionedLoss(problem)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr2)
    rng = np.random.default_rng(0)
    steps, timed, total = 0, None, None
    while total is None or steps < total:
        index = rng.choice(len(train), args.batch, replace=False)
        if total is not None:  # cosine decay over the steps the budget allows
            for group in opt.param_groups:
                group["lr"] = args.lr2 * 0.5 * (1 + np.cos(np.pi * steps / total))
        raw = model(_second_inputs(problem, train, data_train, index))
        u = _second_field(problem, raw, train, data_train, index)
        value = loss.loss_terms(u, torch.as_tensor(train[index], dtype=torch.float64))["preconditioned"].mean()
        opt.zero_grad(set_to_none=True)
        value.backward()
        opt.step()
        steps += 1
        if steps == 1:
            t1 = time.perf_counter()
        if steps == 6:  # the steps the rest of the budget allows, timed on steps 2-6
            timed = (time.perf_counter() - t1) / 5
            total = max(10, int((budget - setup) / timed))
    seconds = time.perf_counter() - t0
    with torch.no_grad():
        raw = model(_second_inputs(problem, test, data_test, np.arange(len(test))))
        pred = _second_field(problem, raw, test, data_test, np.arange(len(test))).numpy()
    acc = against_floor(problem, test, pred)
    first = against_floor(problem, test, data_test.u1.numpy())
    return {"steps": steps, "train_seconds": round(seconds, 1), "setup_seconds": round(setup, 1),
            "mean_rel_l2": float(acc.error.mean()),
            "mean_floor": float(acc.floor.mean()), "ratio_to_floor": acc.ratio,
            "mean_grid_rel_l2": float(relative_l2(pred, acc.optimum).mean()),
            "first_stage_ratio_to_floor": first.ratio}, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-s", type=float, default=600.0, help="training seconds per arm")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--resolution", type=int, default=64)
    parser.add_argument("--n-train", type=int, default=1024)
    parser.add_argument("--n-test", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--probe-steps", type=int, default=4)
    parser.add_argument("--lr2", type=float, default=1e-3, help="the second stage's peak learning rate")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--reuse", action="store_true",
                        help="take the two CLI runs (one_stage, first) already in --workdir instead of training them")
    args = parser.parse_args()
    args.case = "loss"
    if not (args.budget_s > 0 and args.n_train >= args.batch >= 1):
        raise SystemExit("second_stage.py: need --budget-s > 0 and --n-train >= --batch >= 1")
    levels = _levels(args.resolution)
    result = {"resolution": args.resolution, "budget_s": args.budget_s, "n_train": args.n_train, "batch": args.batch}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        if not (args.reuse and (workdir / "one_stage" / "eval.json").is_file()):
            _stage_one(args, levels, args.budget_s, workdir / "one_stage", workdir)
        one = json.loads((workdir / "one_stage" / "eval.json").read_text())
        result["one_stage"] = {"train_seconds": round(one["train_seconds"], 1), "mean_rel_l2": one["mean_rel_l2"],
                               "mean_floor": one["mean_floor"], "ratio_to_floor": one["ratio_to_floor"],
                               "mean_grid_rel_l2": sum(one["grid_rel_l2"]) / len(one["grid_rel_l2"])}
        if not (args.reuse and (workdir / "first" / "eval.json").is_file()):
            _stage_one(args, levels, args.budget_s / 2, workdir / "first", workdir)
        first_seconds = json.loads((workdir / "first" / "eval.json").read_text())["train_seconds"]
        # Equal wall time with the one-stage run as it went (its probe-planned budget is only a plan).
        row, _ = _stage_two(args, workdir / "first", one["train_seconds"] - first_seconds)
        row["train_seconds"] = round(first_seconds + row["train_seconds"], 1)
        result["two_stages"] = row
    result["ratio_one_stage"] = round(result["one_stage"]["ratio_to_floor"], 3)
    result["ratio_two_stages"] = round(result["two_stages"]["ratio_to_floor"], 3)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
