"""What an engineer reads against its floor, for a trained run's product with k Gauss-Seidel sweeps after its coarse
correction (``model.smoothing``) and with a finer coarse grid, side by side on the same held-out instances: the
field's, each derived field's (stress, flux) and the energy norm's error over its floor, and the inference's ms per
instance (batched, one thread), all in one run.

The network is the run's as trained; only the product around it changes (``--sweeps``, ``--coarse``), so the arms
differ by what each design removes at inference. A run trained with sweeps is measured the same way (its own k is
one of the arms when listed).

    python benchmarks/smoothing.py RUN_DIR [--sweeps 0 1 2 4] [--coarse 33] [--samples 16] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def arm(run, model, generator, instances, batch: int, truth=None) -> tuple[dict, float, object]:
    """The product's ratios to the floor (field, energy norm, derived fields), its batched ms per instance, and the
    truth (``truth``: already solved, by an earlier arm)."""
    from deepfusion.analysis.derived import measure
    from deepfusion.analysis.inference import against_floor, predict

    family = run.family
    predict(model, generator, instances[:batch], batch)  # untimed: kernels built once per shape
    generator.clear_caches()
    t0 = time.perf_counter()
    pred = predict(model, generator, instances, batch)
    ms = (time.perf_counter() - t0) / len(instances) * 1e3
    acc = against_floor(family, instances, pred, truth=truth)
    derived = measure(family, instances, pred, acc.truth, acc.optimum)
    ratios = {"field": acc.ratio, "error": float(acc.error.mean()), "floor": float(acc.floor.mean())}
    if derived.energy:
        ratios["energy norm"] = derived.energy["ratio_to_floor"]
    ratios |= {name: row["ratio_to_floor"] for name, row in derived.errors.items()}
    for name, row in derived.quantities.items():
        ratios[f"{name} mean / max error"] = [row["mean_rel_error"], row["max_rel_error"]]
    return ratios, ms, acc.truth


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--sweeps", type=int, nargs="+", default=[0, 1, 2, 4])
    parser.add_argument("--coarse", type=int, nargs="*", default=[],
                        help="coarse grids to try beside the run's, each with every --sweeps")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    from deepfusion.parallel.runtime import apply_threads

    apply_threads(1)
    from deepfusion.training.rundir import trained_model

    run, model, path = trained_model(args.run_dir)
    base = run.product()
    if base is run.family:
        raise SystemExit(f"{args.run_dir}: the run's generator has no coarse correction (model.coarse_correction)")
    instances = run.heldout_first(args.samples)
    print(f"{args.run_dir} ({run.family.name}, {'x'.join(map(str, run.family.resolution))}), {path.name}: "
          f"{len(instances)} held-out instances, one thread", flush=True)
    arms = [(f"coarse {base.nodes}, {k} sweeps", dataclasses.replace(base, smoothing=k)) for k in args.sweeps]
    arms += [(f"coarse {n}, {k} sweeps", dataclasses.replace(base, nodes=n, smoothing=k))
             for n in args.coarse for k in args.sweeps]
    rows, truth = [], None
    for label, generator in arms:
        ratios, ms, truth = arm(run, model, generator, instances, args.batch, truth)
        rows.append({"arm": label, "ms_per_instance": ms, "ratios_to_floor": ratios})
        print(f"  {label:24s} {ms:7.2f} ms  " + ", ".join(
            f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v[0]:.2%}/{v[1]:.2%}"
            for k, v in ratios.items() if k not in ("error", "floor")), flush=True)
    report = {"run_dir": str(args.run_dir), "checkpoint": str(path), "family": run.family.name,
              "samples": len(instances), "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
