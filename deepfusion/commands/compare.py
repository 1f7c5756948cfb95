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

__all__ = ["run"]


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


def run(args: argparse.Namespace, comm) -> int:
    """The network's error and inference time, the classical sweep to equal accuracy, the report."""
    run_dir = Path(args.run_dir)
    run_config(run_dir)  # "not a run directory" before anything else
    threads = _check(args)
    from deepfusion.parallel.runtime import apply_threads

    apply_threads(threads[0])  # before torch starts its thread pool
    import torch

    from deepfusion.analysis.compare import classical_sweep, compare_row, markdown_table, reference_row, time_inference
    from deepfusion.analysis.inference import against_floor, predict

    t0 = time.perf_counter()
    run, model, path = trained_model(run_dir, args.checkpoint, warn)
    load_s = time.perf_counter() - t0
    cfg, problem = run.cfg, run.problem
    params = run.heldout_first(args.samples)
    generator = run.generator()  # the network's fields, with its coarse correction if it has one
    product = _product(problem, generator)
    for capability in ("reference", "floor", "classical"):
        require(problem, capability, "compare")
    if args.polish and not problem.has("polish"):
        warn(f"no \"DiffNet + k cycles\" rows: the {problem.name} family (as configured) declares no polish step")
        args.polish = []
    grid = list(cfg.problem.resolution)
    train_seconds, ranks = training_time(run_dir)
    print(f"deepfusion compare: {run_dir} ({problem.name}, {'x'.join(map(str, grid))}), checkpoint {path}; "
          f"{len(params)} held-out instances; training took "
          + (f"{train_seconds:.0f} s on {ranks or '?'} rank(s)" if train_seconds else "an unknown time")
          + "; every timed solve, network or classical, builds its own per-instance set-up", flush=True)

    inference = {}
    pred = None
    for t in threads:
        apply_threads(t)
        print(f"  CPU, {t} thread{'s' if t > 1 else ''}:", flush=True)
        pred, inference[("cpu", t)] = time_inference(lambda p, b: predict(model, generator, p, b), params, args.batch,
                                                     fresh=problem.clear_caches)
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        print(f"  GPU ({name}, a different machine's figure):", flush=True)
        gpu_model = model.to("cuda")
        _, inference[(f"cuda: {name}", 1)] = time_inference(lambda p, b: predict(gpu_model, generator, p, b), params,
                                                           args.batch, fresh=problem.clear_caches)
    print(f"  reference: {problem.truth_name()}; floor: {problem.floor_name()} ...", flush=True)
    acc = against_floor(problem, params, pred)
    target = float(acc.error.mean())
    print(f"  DiffNet error {target:.4f} (floor {acc.floor.mean():.4f}, ratio {acc.ratio:.2f}); "
          f"classical sweep to that error, coarse to fine:", flush=True)
    points = classical_sweep(problem, params, acc.truth, target)
    from deepfusion.analysis.equal_accuracy import cheapest

    best = cheapest(points, target)
    baseline = None if best is None else reference_row(problem, params, acc.truth, best.grid)
    if baseline is not None:
        methods = dict(problem.classical_methods)
        print(f"    the family's baseline, {methods.get(problem.classical_baseline, problem.classical_baseline)}, on the "
              f"same grid: {baseline.seconds * 1e3:.2f} ms per instance, {baseline.seconds / best.seconds:.1f}x the time "
              f"of the cheapest match ({methods.get(best.method, best.method)})", flush=True)
    rows = [compare_row(device=device, threads=t, accuracy=acc, inference=timing, points=points, baseline=baseline,
                        train_seconds=train_seconds) | {"product": product} for (device, t), timing in inference.items()]
    for k in args.polish:
        rows += _polished_rows(problem, (model, generator), params, acc, k, threads, args.batch, train_seconds)
    report = {
        "run_dir": str(run_dir), "checkpoint": str(path), "problem": problem.name, "resolution": grid,
        "methods": dict(problem.classical_methods),
        "model": {"name": cfg.model.name, "channels": list(cfg.model.channels), "dtype": cfg.train.dtype},
        "samples": len(params), "instances": params.tolist(), "model_load_s": load_s,
        "reference": acc.truth_name, "floor_is": acc.floor_name, "train_ranks": ranks,
        "classical_threads": "the classical solvers here are serial (numba, scipy sparse, pyamg)",
        "rows": rows, "sweep": [p.as_dict() for p in points],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    table = args.out.with_suffix(".md")
    table.write_text(markdown_table(rows, grid))
    from deepfusion.files.plots import plot_pareto

    figure = plot_pareto(report, args.out.with_suffix(".png"))
    print(f"\n{markdown_table(rows, grid)}\nwrote {args.out}, {table}, {figure}")
    return 0


def _product(problem, generator) -> str:
    """What the network product is called in the rows: the network, with its coarse solve if it has one."""
    return "DiffNet" if generator is problem else f"DiffNet + coarse solve ({generator.coarse_text()})"


def _polished_rows(problem, network: tuple, params, acc, cycles: int, threads: list[int], batch: int,
                   train_seconds) -> list[dict]:
    """"DiffNet + k cycles": the network's fields (``network`` = (model, generator): the generator's field,
    with its coarse correction) then ``cycles`` classical iterations, timed together, measured against the
    same truth and floor, and matched to its own cheapest classical solve."""
    model, generator = network
    from deepfusion.analysis.compare import classical_sweep, compare_row, time_inference
    from deepfusion.analysis.inference import against_floor, predict
    from deepfusion.parallel.runtime import apply_threads

    label = f"{_product(problem, generator)} + {cycles} {problem.polish_step}{'s' if cycles != 1 else ''}"
    problem.polish(params[:1], predict(model, generator, params[:1]), cycles)
    timings = {}
    for t in threads:
        apply_threads(t)
        print(f"  {label}, CPU, {t} thread{'s' if t > 1 else ''}:", flush=True)
        fields, timings[t] = time_inference(lambda p, b: problem.polish(p, predict(model, generator, p, b), cycles),
                                            params, batch, fresh=problem.clear_caches)
    polished = against_floor(problem, params, fields, truth=acc.truth)
    target = float(polished.error.mean())
    print(f"  {label}: error {target:.4f} (floor {polished.floor.mean():.4f}, ratio {polished.ratio:.2f}); "
          f"classical sweep to that error:", flush=True)
    points = classical_sweep(problem, params, acc.truth, target)
    return [compare_row(device="cpu", threads=t, accuracy=polished, inference=timing, points=points, baseline=None,
                        train_seconds=train_seconds) | {"product": label} for t, timing in timings.items()]
