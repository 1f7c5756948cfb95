"""Where one instance's inference goes, part by part, for a config's product (its networks with their coarse
correction and second stage), against the classical solve of the same grid timed in the same run.

The networks get random weights (a part's cost does not depend on what they learnt); the instances are the
run's first held-out ones. Each part's seconds per instance come from the product's own clock
(diffnet/backend/clock.py): the network(s), the fine Hessian, the coarse operator A_c, its factorisation, the
coarse solves, the loss's gradient, the second stage's V-cycle. One thread, batched (``--batch``) and one
instance at a time, each pass the first for its instances (per-instance set-up paid, as ``compare`` times it).

    python benchmarks/product_cost.py [CONFIG ...] [--set KEY=VALUE ...] [--batch B] [--samples S] [--against DIR]

    python benchmarks/product_cost.py configs/poisson_128.toml configs/elasticity.toml
    python benchmarks/product_cost.py configs/poisson_256.toml --set model.coarse_correction=17 \\
        --set train.loss=preconditioned --set train.second_stage_epochs=8

``--against DIR`` times the same configs' products with the checkout at DIR too (``git worktree add DIR REV``: the
commit before a change), in a process of its own, from DIR's own config files: totals only (an earlier tree may
have no part clock), batched and one at a time, beside this tree's, with the speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = Path(os.environ.get("PRODUCT_COST_TREE", ROOT))  # the checkout whose code is timed (--against's worker)
sys.path.insert(0, str(TREE))

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

    from deepfusion.configuration.config import load_config
    from deepfusion.configuration.run import Run
    from diffnet.backend.clock import CORRECTION_PARTS, PartClock, total

    run = Run.from_config(load_config(config, overrides))
    problem = run.family
    torch.manual_seed(0)
    clock = PartClock()
    product = run.product(run.build_model(), clock)
    params = run.heldout_first(samples)
    product.fields(params[:1], 1)  # thread pools, kernel selection: a process's one-off
    product.clear_caches()

    def timed(rows, b) -> tuple[float, dict]:
        product.clear_caches()
        clock.reset()
        t0 = time.perf_counter()
        product.fields(rows, b)
        return (time.perf_counter() - t0) / len(rows), clock.per(len(rows))

    product.fields(params, batch)  # the batch's shape: oneDNN's kernels for it, a process's one-off
    batched, parts = timed(params, batch)
    single = statistics.median(timed(params[k : k + 1], 1)[0] for k in range(len(params)))
    row = {"config": str(config.relative_to(ROOT)) if config.is_relative_to(ROOT) else str(config),
           "overrides": overrides, "product": product.chain(), "grid": list(problem.resolution), "unknowns": len(problem.unknowns),
           "coarse_correction": run.cfg.model.coarse_correction, "second_stage": run.cfg.train.second_stage_epochs > 0,
           "channels": list(run.cfg.model.channels),
           "product_ms_batched": 1e3 * batched, "product_ms_single": 1e3 * single, "batch": min(batch, len(params)),
           "parts_ms_per_instance": {k: 1e3 * v for k, v in parts.items()},
           "correction_share": total(parts, CORRECTION_PARTS) / max(batched, 1e-30)}
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


def product_seconds(config: Path, overrides: list[str], batch: int, samples: int) -> dict:
    """The product's seconds per instance, batched and one at a time, through whichever API the checkout has (an
    earlier one's too: no part clock): the product object (``Run.product(model)``), or before it ``predict`` of the
    network and the family ``Run.product()`` gave."""
    import torch

    from deepfusion.configuration.config import load_config
    from deepfusion.configuration.run import Run

    run = Run.from_config(load_config(config, overrides))
    torch.manual_seed(0)
    model = run.build_model()
    params = run.heldout_first(samples)
    try:
        product = run.product(model)
        fields, clear = product.fields, product.clear_caches
    except TypeError:  # a checkout from before the product object
        from deepfusion.analysis.inference import predict

        generator = run.product()
        fields = lambda rows, b: predict(model, generator, rows, b)  # noqa: E731
        clear = getattr(generator, "clear_caches", run.family.clear_caches)
    fields(params[:1], 1)
    fields(params, batch)

    def timed(rows, b) -> float:
        clear()
        t0 = time.perf_counter()
        fields(rows, b)
        return (time.perf_counter() - t0) / len(rows)

    return {"product_ms_batched": 1e3 * min(timed(params, batch) for _ in range(2)),
            "product_ms_single": 1e3 * statistics.median(timed(params[k : k + 1], 1) for k in range(len(params)))}


def _totals_at(tree: Path, cases: list[tuple[str, list[str]]], args) -> list[dict]:
    """:func:`product_seconds` of every case with the checkout ``tree``'s code and config files, in a process of its
    own."""
    worker = [sys.executable, __file__, "--worker", json.dumps(cases), "--batch", str(args.batch), "--samples",
              str(args.samples), "--threads", str(args.threads)]
    out = subprocess.run(worker, capture_output=True, text=True, cwd=tree, env={**os.environ, "PRODUCT_COST_TREE": str(tree)})
    if out.returncode != 0:
        raise SystemExit(f"product_cost: the checkout {tree} failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="*", type=Path, help="configs (default: Poisson 64^2, 128^2, 256^2, 32^3, "
                                                                "64^3 with the correction and two stages; elasticity "
                                                                "64^2 and 17^3 with the correction, one stage)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override for every config")
    parser.add_argument("--batch", type=int, default=8, help="instances per forward pass (default 8)")
    parser.add_argument("--samples", type=int, default=8, help="held-out instances timed (default 8)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--against", type=Path, metavar="DIR", help="also time the products with the checkout at DIR "
                                                                    "(totals only), from its own config files")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # JSON [[config, overrides], ...]: totals only, this tree
    args = parser.parse_args()
    from deepfusion.parallel.runtime import apply_threads

    apply_threads(args.threads)
    if args.worker:
        print(json.dumps([product_seconds(TREE / c, o, args.batch, args.samples) for c, o in json.loads(args.worker)]))
        return
    cases = [(str(c.resolve().relative_to(ROOT)) if c.resolve().is_relative_to(ROOT) else str(c.resolve()), [])
             for c in args.configs] or [(c, list(o)) for c, o in DEFAULTS]
    cases = [(c, o + list(args.set)) for c, o in cases]
    earlier = _totals_at(args.against.resolve(), cases, args) if args.against else None
    rows = []
    for k, (config, overrides) in enumerate(cases):
        rows.append(measure(ROOT / config, overrides, args.batch, args.samples))
        if earlier is not None:
            rows[-1].update({f"against_{key}": value for key, value in earlier[k].items()},
                            speed_up_batched=earlier[k]["product_ms_batched"] / rows[-1]["product_ms_batched"])
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"benchmark": "product_cost", "threads": args.threads,
                      "against": None if args.against is None else str(args.against), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
