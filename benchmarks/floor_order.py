"""The floor of the immersed families against their body-fitted truth, and its order in h.

For each family on a cut-out domain (``torsion``: -Δu = 1 on star shapes; ``plate``: KL Poisson on
a plate with a hole) and each grid, the same-grid immersed Q1 solution (the floor: the exact
minimiser of the trained energy) is compared with the body-fitted P1 FEM on a conforming
triangulation ``truth_refine`` times finer, on random held-out instances; the order between
consecutive grids is log2 of the floor's ratio (the method promises 2 in the L2 norm: Q1 and
Nitsche's terms consistent, the cut-cell quadrature O(h^2) on a curved boundary). Prints one JSON
object.

    python benchmarks/floor_order.py [--families torsion plate] [--grids 17 33 65 129] [--instances 3]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def floors(name: str, grids: list[int], instances: int, seed: int) -> list[dict]:
    """One row per grid: the floor's mean relative L2 error, per instance, its order and the solve times."""
    from deepfusion.configuration.registry import family_class

    cls = family_class(name)
    rows = []
    for n in grids:
        family = cls((n, n))
        params = family.draw(instances, "uniform", seed)
        t0 = time.perf_counter()
        truth = family.truth(params)
        t1 = time.perf_counter()
        floor = family.reference(params)
        t2 = time.perf_counter()
        err = np.linalg.norm(floor - truth, axis=(1, 2)) / np.linalg.norm(truth, axis=(1, 2))
        row = {"grid": n, "floor": float(err.mean()), "per_instance": [float(e) for e in err],
               "truth_seconds": round(t1 - t0, 2), "floor_seconds": round(t2 - t1, 2)}
        if rows:
            row["order"] = round(math.log2(rows[-1]["floor"] / row["floor"]) / math.log2((n - 1) / (rows[-1]["grid"] - 1)), 2)
        rows.append(row)
        print(f"{name} {n}^2: floor {row['floor']:.3e} order {row.get('order', '-')}", file=sys.stderr, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=["torsion", "plate"])
    parser.add_argument("--grids", type=int, nargs="+", default=[17, 33, 65, 129])
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    result = {"benchmark": "floor_order", "promised_order": 2, "instances": args.instances, "seed": args.seed,
              "families": {name: floors(name, args.grids, args.instances, args.seed) for name in args.families}}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
