"""The Navier–Stokes families' product designs side by side on the same held-out instances, one thread, one run:
each finish of the trained network's field against the truth and the floor (each unknown, the derived fields, the
quantities: Ghia's extrema for the lid-driven cavity, drag, lift and pressure drop for the cylinder), its ms per
instance (batched); for the cavity its distance from Ghia, Ghia & Shin (1982) at Re = 100, 400, 1000 beside the
floor's own; and the classical side beside them.

The arms (the network is the run's as trained; only what finishes its field changes):

- ``network``: the network's field alone;
- ``+ k Newton``: k Newton steps, each a sparse LU (``model.polish``): the design whose finishing steps are the
  classical side's own;
- ``+ coarse N, s sweeps x c``: the residual's coarse Gauss-Newton correction on N^2 and s sweeps on J^T J, c times
  (``model.coarse_correction``, ``sweeps``, ``cycles``): the design whose finish costs a stencil's work;
- ``lift: ...``: the same finish from the boundary data alone (the network's output replaced by zero);
- ``classical``: the classical solve of ``deepfusion compare`` on the run's grid (the cavity's Newton from the nearest
  rung of its continuation ladder, the cylinder's from the inflow profile), its Newton steps counted.

    python benchmarks/navier_stokes.py RUN_DIR [--polish 1 2 3] [--coarse 17] [--sweeps 2 4] [--cycles 1 3]
                                       [--samples 4] [--out FILE.json]

``--coarse`` with no grid leaves out the stencil-cost arms (the cylinder's cut cells have no coarse space here).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def ghia_row(family, instances, fields) -> dict:
    """The cavity's tabulated Re among ``instances``: the fields' largest distance from Ghia et al.'s centreline
    tables (none for another family)."""
    from diffnet.solvers.ghia import U, centreline_deviation

    if family.name != "navier_stokes":
        return {}
    return {f"Re {int(r)}": centreline_deviation(f, int(r)) for r, f in zip(instances, fields) if float(r) in U}


def quantity_row(family, instances, fields) -> dict:
    """Each quantity of the family (the cylinder's drag, lift, pressure drop): its mean relative distance from the
    truth's, over ``instances``."""
    if not family.has("quantities") or family.name == "navier_stokes":  # the cavity's: its Ghia rows
        return {}
    values, truth = family.quantities(instances, fields), family.truth_quantities(instances)
    return {k: float(np.mean(np.abs(v / truth[k] - 1.0))) for k, v in values.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--polish", type=int, nargs="*", default=[1, 2, 3], help="Newton steps after the network")
    parser.add_argument("--coarse", type=int, nargs="*", default=[17], help="coarse grids of the stencil-cost finish")
    parser.add_argument("--sweeps", type=int, nargs="*", default=[2, 8])
    parser.add_argument("--cycles", type=int, nargs="*", default=[1, 3])
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    from deepfusion.parallel.runtime import apply_threads

    apply_threads(1)
    from deepfusion.training.rundir import trained_model
    from diffnet.product.product import Finish, Product
    from sweeps import arm, lift

    run, model, path = trained_model(args.run_dir)
    family = run.family
    instances = run.heldout_first(args.samples)
    print(f"{args.run_dir} ({family.name}, {'x'.join(map(str, family.resolution))}), {path.name}: "
          f"{len(instances)} held-out instances, one thread", flush=True)
    finishes = [("network", Finish())] + [(f"+ {k} Newton", Finish(polish=k)) for k in args.polish]
    stencil = [(f"+ coarse {n}, {s} sweeps" + (f" x {c}" if c > 1 else ""), Finish(coarse=n, sweeps=s, cycles=c))
               for n in args.coarse for s in args.sweeps for c in args.cycles]
    finishes += stencil + [(label + " + 1 Newton", dataclasses.replace(f, polish=1)) for label, f in stencil[-1:]]
    arms = [(label, model, finish) for label, finish in finishes]
    arms += [("lift: " + label.lstrip("+ "), lift(model, run, instances), finish) for label, finish in stencil]
    from deepfusion.analysis.inference import relative_l2

    rows, truth = [], None
    from deepfusion.analysis.inference import on_domain

    floor = on_domain(family, instances, family.reference(instances))  # a cut domain's: zero outside, as reported

    def by_unknown(fields) -> dict:  # each unknown's error over its floor's, against the same truth
        return {name: float(relative_l2(fields[:, c], truth[:, c]).mean() / relative_l2(floor[:, c], truth[:, c]).mean())
                for c, name in enumerate(family.unknowns)}

    if family.name == "navier_stokes":
        print(f"  {'floor':34s} Ghia {ghia_row(family, instances, floor)}", flush=True)
    for label, network, finish in arms:
        product = Product(family, network, finish)
        ratios, ms, truth = arm(run, product, instances, len(instances), truth)
        fields = product.fields(instances, len(instances))
        ratios |= by_unknown(fields)
        ghia = ghia_row(family, instances, fields)
        quantities = quantity_row(family, instances, fields)
        rows.append({"arm": label, "chain": product.chain(), "ms_per_instance": ms, "ratios_to_floor": ratios,
                     "ghia": ghia, "quantities": quantities})
        print(f"  {label:34s} {ms:8.1f} ms  " + ", ".join(
            f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v[0]:.2%}/{v[1]:.2%}"
            for k, v in ratios.items() if k not in ("error", "floor")) + (f"  Ghia {ghia}" if ghia else "")
              + (f"  {quantities}" if quantities else ""), flush=True)
    floor_quantities = quantity_row(family, instances, floor)
    print(f"  {'floor':34s} {floor_quantities}", flush=True)
    # The classical side: Newton from the nearest solved instance on the run's grid (solved before, untimed).
    solver = family.classical_solver("newton-lu", family.resolution[0])
    for r in instances:
        solver(r)
    seconds, steps = [], []
    for r in instances:
        t0 = time.perf_counter()
        solver(r)
        seconds.append(time.perf_counter() - t0)
        steps.append(solver.last.newton_steps)
    classical = {"arm": "classical: Newton-LU", "ms_per_instance": 1e3 * float(np.mean(seconds)),
                 "newton_steps": float(np.mean(steps)), "ghia": ghia_row(family, instances, floor)}
    print(f"  {classical['arm']:34s} {classical['ms_per_instance']:8.1f} ms  {classical['newton_steps']:.1f} Newton "
          f"steps ({family.lu})", flush=True)
    report = {"run_dir": str(args.run_dir), "checkpoint": str(path), "instances": instances.tolist(),
              "floor_ghia": ghia_row(family, instances, floor), "floor_quantities": floor_quantities, "rows": rows,
              "classical": classical}
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
