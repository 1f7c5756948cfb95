"""Where one instance's inference goes, part by part, for a config's product (its networks with their coarse
correction and second stage), against the classical solve of the same grid timed in the same run.

The networks get random weights (a part's cost does not depend on what they learnt); the instances are the
run's first held-out ones. Each part's seconds per instance come from the product's own clock
(diffnet/backend/clock.py): the network(s), the fine Hessian, the coarse operator A_c, its factorisation, the
coarse solves, the loss's gradient, the second stage's V-cycle. One thread, batched (``--batch``) and one
instance at a time, each pass the first for its instances (per-instance set-up paid, as ``compare`` times it).

    python benchmarks/product_cost.py [CONFIG ...] [--set KEY=VALUE ...] [--batch B] [--samples S]

    python benchmarks/product_cost.py configs/poisson_128.toml configs/elasticity.toml
    python benchmarks/product_cost.py configs/poisson_256.toml --set model.coarse_correction=17 \\
        --set train.loss=preconditioned --set train.second_stage_epochs=8
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULTS = [("configs/poisson.toml", ["model.coarse_correction=17", "train.loss=preconditioned",
                                       "train.second_stage_epochs=8"]),
            ("configs/poisson_128.toml", []),
            ("configs/poisson_256.toml", ["model.coarse_correction=17", "train.loss=preconditioned",
                                           "train.second_stage_epochs=8"]),
            ("configs/elasticity.toml", []),
            ("configs/elasticity3d.toml", ["problem.resolution=[17,17,17]", "multigrid.levels=[9,17]",
                                           "model.coarse_correction=9", "train.loss=preconditioned"]),
            ("configs/poisson3d.toml", ["model.coarse_correction=9", "train.loss=preconditioned",
                                         "train.second_stage_epochs=6"]),
            ("configs/poisson3d_64.toml", ["model.coarse_correction=9", "train.loss=preconditioned",
                                            "train.second_stage_epochs=6", "model.checkpoint_activations=false"])]


def measure(config: Path, overrides: list[str], batch: int, samples: int) -> dict:
    import torch

    from deepfusion.analysis.inference import predict
    from deepfusion.configuration.config import load_config
    from deepfusion.configuration.run import Run
    from diffnet.backend.clock import CORRECTION_PARTS, PartClock

    run = Run.from_config(load_config(config, overrides))
    problem = run.problem
    torch.manual_seed(0)
    model = run.build_model()
    params = run.heldout_first(samples)
    clock = PartClock()
    generator = run.generator(clock)
    predict(model, generator, params[:1], 1)  # thread pools, kernel selection: a process's one-off
    generator.clear_caches()

    def timed(rows, b) -> tuple[float, dict]:
        generator.clear_caches()
        clock.reset()
        t0 = time.perf_counter()
        predict(model, generator, rows, b, clock=clock)
        return (time.perf_counter() - t0) / len(rows), clock.per(len(rows))

    predict(model, generator, params, batch)  # the batch's shape: oneDNN's kernels for it, a process's one-off
    batched, parts = timed(params, batch)
    single = statistics.median(timed(params[k : k + 1], 1)[0] for k in range(len(params)))
    row = {"config": str(config.relative_to(ROOT)) if config.is_relative_to(ROOT) else str(config),
           "overrides": overrides, "grid": list(problem.resolution), "unknowns": len(problem.unknowns),
           "coarse_correction": run.cfg.model.coarse_correction, "second_stage": run.cfg.train.second_stage_epochs > 0,
           "channels": list(run.cfg.model.channels),
           "product_ms_batched": 1e3 * batched, "product_ms_single": 1e3 * single, "batch": min(batch, len(params)),
           "parts_ms_per_instance": {k: 1e3 * v for k, v in parts.items()},
           "correction_share": sum(v for k, v in parts.items() if k in CORRECTION_PARTS) / max(batched, 1e-30)}
    if problem.has("classical"):  # the baseline: the family's first method (or its named baseline) on this grid
        from deepfusion.analysis.compare import measure_classical

        method = problem.classical_baseline or next(iter(problem.classical_methods))
        if "fmg" in problem.classical_methods:
            method = "fmg"
        grid = max(problem.resolution) + (1 - max(problem.resolution) % 2)  # the Q1 sweep's 2^k + 1 nodes
        measure_classical(problem, params[:1], method, grid)  # JIT and imports
        _, seconds = measure_classical(problem, params, method, grid)
        row.update({"classical_method": method, "classical_grid": grid,
                    "classical_ms": 1e3 * statistics.median(seconds),
                    "classical_over_product": statistics.median(seconds) / batched})
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="*", type=Path, help="configs (default: Poisson 64^2, 128^2, 256^2, 32^3, "
                                                                "64^3 with the correction and two stages; elasticity "
                                                                "64^2 and 17^3 with the correction, one stage)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override for every config")
    parser.add_argument("--batch", type=int, default=8, help="instances per forward pass (default 8)")
    parser.add_argument("--samples", type=int, default=8, help="held-out instances timed (default 8)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args()
    from deepfusion.parallel.runtime import apply_threads

    apply_threads(args.threads)
    cases = [(c, []) for c in args.configs] or [(ROOT / c, o) for c, o in DEFAULTS]
    rows = []
    for config, overrides in cases:
        rows.append(measure(config.resolve(), overrides + list(args.set), args.batch, args.samples))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"benchmark": "product_cost", "threads": args.threads, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
