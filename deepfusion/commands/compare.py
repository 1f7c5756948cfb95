"""``deepfusion compare``: a trained DiffNet against the cheapest classical solve of equal accuracy."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from deepfusion.commands import warn
from deepfusion.training.rundir import run_config, trained_model, training_time
from deepfusion.configuration.inputs import InputError, check_output_file, require

__all__ = ["command"]


def _check(args: argparse.Namespace) -> list[int]:
    check_output_file(args.out, (".json",), "the report is JSON")
    if not 1 <= args.samples <= 1000:
        raise InputError(f"--samples: must be in 1..1000, got {args.samples}")
    threads = args.threads or sorted({1, os.cpu_count() or 1})
    for t in threads:
        if not 1 <= t <= 4096:
            raise InputError(f"--threads: must be in 1..4096, got {t}")
    if not 1 <= args.batch <= 1024:
        raise InputError(f"--batch: must be in 1..1024, got {args.batch}")
    for k in args.polish:
        if not 1 <= k <= 100:
            raise InputError(f"--polish: must be in 1..100, got {k}")
    return threads


def command(args: argparse.Namespace, comm) -> int:
    """The network's error and inference time, the classical search to equal accuracy, the report."""
    run_dir = Path(args.run_dir)
    run_config(run_dir)  # "not a run directory" before anything else
    threads = _check(args)
    from deepfusion.parallel.runtime import apply_threads

    apply_threads(threads[0])  # before torch starts its thread pool
    import torch

    from diffnet.backend.clock import PartClock
    from deepfusion.analysis.compare import (classical_search, compare_row, derived_targets, markdown_table,
                                             reference_row, time_inference)
    from deepfusion.analysis.derived import measure
    from deepfusion.analysis.equal_accuracy import TIE, cheapest
    from deepfusion.analysis.inference import against_floor

    t0 = time.perf_counter()
    run, model, path = trained_model(run_dir, args.checkpoint, warn)
    load_s = time.perf_counter() - t0
    cfg, family = run.cfg, run.family
    instances = run.heldout_first(args.samples)
    clock = PartClock()  # where the product's time goes, part by part
    product = run.product(model, clock)  # the network's fields, finished as the run's config says
    for capability in ("reference", "floor", "classical"):
        require(family, capability, "compare")
    if args.polish and not family.has("polish"):
        warn(f"no \"DiffNet + k cycles\" rows: the {family.name} family (as configured) declares no polish step")
        args.polish = []
    grid = list(cfg.problem.resolution)
    train_seconds, ranks = training_time(run_dir)
    print(f"deepfusion compare: {run_dir} ({family.name}, {'x'.join(map(str, grid))}), checkpoint {path}; "
          f"{len(instances)} held-out instances; training took "
          + (f"{train_seconds:.0f} s on {ranks or '?'} rank(s)" if train_seconds else "an unknown time")
          + "; every timed solve, network or classical, builds its own per-instance set-up", flush=True)
    print(f"  product: {product.chain()}", flush=True)

    # The product, and for a two-stage generator its first stage alone: one network fewer, no V-cycle.
    first = product.first_stage()
    products = [(product.name(), product)] + ([] if first is None else [(f"{product.name()}, first stage alone", first)])
    rows, points_all, baseline = [], [], None
    for label, arm in products:
        inference = {}
        pred = None
        for t in threads:
            apply_threads(t)
            print(f"  {label}, CPU, {t} thread{'s' if t > 1 else ''}:", flush=True)
            pred, inference[("cpu", t)] = time_inference(arm.fields, instances, args.batch, fresh=arm.clear_caches,
                                                         clock=clock)
        if torch.cuda.is_available():
            name = torch.cuda.get_device_name(0)
            print(f"  {label}, GPU ({name}, a different machine's figure):", flush=True)
            arm.model.to("cuda")
            _, inference[(f"cuda: {name}", 1)] = time_inference(arm.fields, instances, args.batch,
                                                                fresh=arm.clear_caches, clock=clock)
            arm.model.to("cpu")
        print(f"  reference: {family.truth_name()}; floor: {family.floor_name()} ...", flush=True)
        acc = against_floor(family, instances, pred)
        derived = measure(family, instances, pred, acc.truth, acc.optimum)
        target, targets = float(acc.error.mean()), derived_targets(derived)
        print(f"  {label}: error {target:.4f} (floor {acc.floor.mean():.4f}, ratio {acc.ratio:.2f})"
              + "".join(f", {name} {row['mean_rel_l2']:.4f} ({row['ratio_to_floor']:.2f}x its floor)"
                        for name, row in derived.errors.items())
              + f"; classical search to {'those errors' if targets else 'that error'} (within {TIE - 1:.0%}), "
              "coarse to fine:", flush=True)
        points = classical_search(family, instances, acc.truth, target, derived=derived)
        points_all += points
        best = cheapest(points, target, targets)
        if baseline is None and best is not None:  # the family's baseline on the first product's matched grid
            baseline = reference_row(family, instances, acc.truth, best.grid)
        if baseline is not None and arm is product:
            methods = dict(family.classical_methods)
            print(f"    the family's baseline, {methods.get(family.classical_baseline, family.classical_baseline)}, on "
                  f"the same grid: {baseline.seconds * 1e3:.2f} ms per instance, {baseline.seconds / best.seconds:.1f}x "
                  f"the time of the cheapest match ({methods.get(best.method, best.method)})", flush=True)
        rows += [compare_row(device=device, threads=t, accuracy=acc, inference=timing, points=points, baseline=baseline,
                             train_seconds=train_seconds, derived=derived) | {"product": label, "chain": arm.chain()}
                 for (device, t), timing in inference.items()]
        for k in args.polish:
            rows += _polished_rows(family, arm, instances, acc, k, (threads, args.batch), (label, train_seconds))
    points = list({(p.method, p.grid): p for p in reversed(points_all)}.values())[::-1]  # each configuration once
    report = {
        "run_dir": str(run_dir), "checkpoint": str(path), "problem": family.name, "resolution": grid,
        "product": product.chain(),
        "methods": dict(family.classical_methods),
        "model": {"name": cfg.model.name, "channels": list(cfg.model.channels), "dtype": cfg.train.dtype},
        "samples": len(instances), "instances": instances.tolist(), "model_load_s": load_s,
        "reference": acc.truth_name, "floor_is": acc.floor_name, "train_ranks": ranks,
        "classical_threads": "the classical solvers here are serial (numba, scipy sparse, pyamg)",
        "rows": rows, "search": [p.as_dict() for p in points],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    table = args.out.with_suffix(".md")
    table.write_text(markdown_table(rows, grid))
    from deepfusion.files.plots import plot_pareto

    figure = plot_pareto(report, args.out.with_suffix(".png"))
    print(f"\n{markdown_table(rows, grid)}\nwrote {args.out}, {table}, {figure}")
    return 0


def _polished_rows(family, product, instances, acc, steps: int, timing: tuple[list[int], int],
                   named: tuple[str, float | None]) -> list[dict]:
    """"``product`` + k polish steps": the product's fields then ``steps`` of the family's polish, timed together
    (``timing``: the thread counts and the batch), measured against the same truth and floor, and matched to its own
    cheapest classical solve (``named``: the product's name and the training seconds)."""
    threads, batch = timing
    name, train_seconds = named
    from deepfusion.analysis.compare import classical_search, compare_row, time_inference
    from deepfusion.analysis.derived import measure
    from deepfusion.analysis.inference import against_floor
    from deepfusion.parallel.runtime import apply_threads

    label = f"{name} + {steps} {family.polish_step}{'s' if steps != 1 else ''}"
    family.polish(instances[:1], product.fields(instances[:1]), steps)
    timings = {}
    for t in threads:
        apply_threads(t)
        print(f"  {label}, CPU, {t} thread{'s' if t > 1 else ''}:", flush=True)
        fields, timings[t] = time_inference(lambda p, b: family.polish(p, product.fields(p, b), steps),
                                            instances, batch, fresh=product.clear_caches)
    polished = against_floor(family, instances, fields, truth=acc.truth)
    derived = measure(family, instances, fields, acc.truth, polished.optimum)
    target = float(polished.error.mean())
    print(f"  {label}: error {target:.4f} (floor {polished.floor.mean():.4f}, ratio {polished.ratio:.2f})"
          + "".join(f", {name} {row['mean_rel_l2']:.4f}" for name, row in derived.errors.items())
          + "; classical search to those errors:", flush=True)
    points = classical_search(family, instances, acc.truth, target, derived=derived)
    return [compare_row(device="cpu", threads=t, accuracy=polished, inference=timing, points=points, baseline=None,
                        train_seconds=train_seconds, derived=derived) | {"product": label,
                                                                         "chain": f"{product.chain()} -> {label[len(name) + 3:]}"}
            for t, timing in timings.items()]
