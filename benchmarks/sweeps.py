"""What an engineer reads against its floor, for a trained run's product with k Gauss-Seidel sweeps after its coarse
correction (``model.sweeps``) and with a finer coarse grid, side by side on the same held-out instances: the
field's, each derived field's (stress, flux) and the energy norm's error over its floor, and the inference's ms per
instance (batched, one thread), all in one run.

The network is the run's as trained; only the product around it changes (``--sweeps``, ``--coarse``), so the arms
differ by what each design removes at inference. A run trained with sweeps is measured the same way (its own k is
one of the arms when listed). ``--cycles``: the correction and its sweeps repeated (``model.cycles``), each count with
every sweep count above 0; ``--polish``: the family's polish steps after them (``model.polish``: a nonlinear
solid's Newton steps), each count with every arm; ``--from-lift``: the same products with the network's output
replaced by zero (the field is then the boundary data's lift alone): the classical two-grid iteration the network's
field starts, at the cost of what it spares.

    python benchmarks/sweeps.py RUN_DIR [--sweeps 0 1 2 4] [--cycles 1 2 3] [--coarse 33] [--polish 0 1] [--from-lift]
                                   [--samples 16] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def arm(run, product, instances, batch: int, truth=None) -> tuple[dict, float, object]:
    """The product's ratios to the floor (field, the loss's norm, derived fields), its batched ms per instance, and
    the truth (``truth``: already solved, by an earlier arm)."""
    from deepfusion.analysis.derived import measure
    from deepfusion.analysis.inference import against_floor

    family = run.family
    product.fields(instances[:batch], batch)  # untimed: kernels built once per shape
    product.clear_caches()
    t0 = time.perf_counter()
    pred = product.fields(instances, batch)
    ms = (time.perf_counter() - t0) / len(instances) * 1e3
    acc = against_floor(family, instances, pred, truth=truth)
    derived = measure(family, instances, pred, acc.truth, acc.optimum)
    ratios = {"field": acc.ratio, "error": float(acc.error.mean()), "floor": float(acc.floor.mean())}
    if derived.energy:
        ratios[derived.energy["name"]] = derived.energy["ratio_to_floor"]
    ratios |= {name: row["ratio_to_floor"] for name, row in derived.errors.items()}
    for name, row in derived.quantities.items():
        ratios[f"{name} mean / max error"] = [row["mean_rel_error"], row["max_rel_error"]]
    return ratios, ms, acc.truth


def lift(model, run, instances):
    """In place of the network: a module with a zero output of the network's shape (its channels read off one forward
    pass), in its dtype, so the product's field starts from the boundary data's lift alone."""
    import torch

    weight = next(model.parameters())
    with torch.no_grad():
        channels = model(run.family.inputs(torch.as_tensor(instances[:1], dtype=weight.dtype))).shape[1]

    class Lift(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.dtype_of = torch.nn.Parameter(torch.zeros((), dtype=weight.dtype), requires_grad=False)

        def forward(self, x):
            return x.new_zeros(x.shape[0], channels, *x.shape[2:])

    return Lift()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--sweeps", type=int, nargs="+", default=[0, 1, 2, 4])
    parser.add_argument("--coarse", type=int, nargs="*", default=[],
                        help="coarse grids to try beside the run's, each with every --sweeps "
                             "(0: none, the network's field alone)")
    parser.add_argument("--cycles", type=int, nargs="+", default=[1],
                        help="times the correction and its sweeps run (model.cycles), with every --sweeps above 0")
    parser.add_argument("--polish", type=int, nargs="+", default=[0],
                        help="the family's polish steps after each arm (model.polish), each count with every arm")
    parser.add_argument("--from-lift", action="store_true",
                        help="also every arm with the network's output replaced by zero (the boundary data's lift)")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    from deepfusion.parallel.runtime import apply_threads

    apply_threads(1)
    from deepfusion.training.rundir import trained_model

    from diffnet.product.product import Product

    run, model, path = trained_model(args.run_dir)
    base = run.finish()
    if not base.coarse:
        raise SystemExit(f"{args.run_dir}: the run's product has no coarse correction (model.coarse_correction)")
    instances = run.heldout_first(args.samples)
    print(f"{args.run_dir} ({run.family.name}, {'x'.join(map(str, run.family.resolution))}), {path.name}: "
          f"{len(instances)} held-out instances, one thread", flush=True)
    # Every coarse grid with every sweep count, and each count above 0 with every number of cycles.
    designs = [(n, k, c, q) for n in (base.coarse, *args.coarse) for k in args.sweeps for c in args.cycles
               for q in args.polish if (k or c == 1) and (n or not k)]  # --coarse 0: the network alone (polished)
    arms = [((f"coarse {n}, {k} sweeps" if n else "network") + (f" x {c}" if c > 1 else "")
             + (f", polish {q}" if q else ""), dataclasses.replace(base, coarse=n, sweeps=k, cycles=c, polish=q))
            for n, k, c, q in designs]
    starts = [("", model)] + ([("lift: ", lift(model, run, instances))] if args.from_lift else [])
    rows, truth = [], None
    for (start, network), (label, finish) in itertools.product(starts, arms):
        label = start + label
        ratios, ms, truth = arm(run, Product(run.family, network, finish), instances, args.batch, truth)
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
