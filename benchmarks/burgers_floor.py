"""Discretisation floor of the Burgers residuals against the converged Godunov reference.

For each viscosity, resolution and scheme order, the exact zero-residual field of the
implicit conservative scheme (``diffnet.solvers.conservative.solve_scheme``, Godunov
flux) is compared with the converged Godunov reference on the same nodes, on the
held-out c of the configs. A network trained on that residual cannot do better than
this. With ``--sobel`` the central Sobel residual's nodal optimum
(``BurgersFamily.discrete_optimum``: its root nearest the reference, or the
least-squares optimum where it has none) is measured too. Prints one JSON object.

    python benchmarks/burgers_floor.py [--resolutions 32 64 128] [--viscosities 0 0.01] [--sobel]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HELD_OUT = (3.3, 4.1, 4.77, 5.5, 5.9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolutions", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--viscosities", type=float, nargs="+", default=[0.0, 0.01])
    parser.add_argument("--orders", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--sobel", action="store_true", help="also the Sobel residual's nodal optimum")
    args = parser.parse_args()
    from diffnet.families.burgers import BurgersFamily

    c = np.array(HELD_OUT)
    rows = []
    for nu in args.viscosities:
        for n in args.resolutions:
            ref = BurgersFamily((n, n), viscosity=nu).reference(c)
            for order in args.orders:
                problem = BurgersFamily((n, n), viscosity=nu, stencil="conservative", scheme_order=order)
                t0 = time.perf_counter()
                u = problem.scheme_solution(c)
                seconds = time.perf_counter() - t0
                err = np.linalg.norm(u - ref, axis=(1, 2)) / np.linalg.norm(ref, axis=(1, 2))
                row = {"viscosity": nu, "resolution": n, "order": order, "mean_rel_l2": round(float(err.mean()), 4),
                       "rel_l2": [round(float(e), 4) for e in err], "solve_seconds": round(seconds, 1)}
                rows.append(row)
                print(f"nu={nu} {n}^2 order {order}: mean {row['mean_rel_l2']}", file=sys.stderr, flush=True)
            if args.sobel:
                t0 = time.perf_counter()
                u, roots = BurgersFamily((n, n), viscosity=nu, stencil="sobel").discrete_optimum(c, initial=ref)
                seconds = time.perf_counter() - t0
                err = np.linalg.norm(u - ref, axis=(1, 2)) / np.linalg.norm(ref, axis=(1, 2))
                rows.append({"viscosity": nu, "resolution": n, "residual": "sobel",
                             "mean_rel_l2": round(float(err.mean()), 4), "rel_l2": [round(float(e), 4) for e in err],
                             "is_root": roots.tolist(), "solve_seconds": round(seconds, 1)})
                print(f"nu={nu} {n}^2 sobel: mean {rows[-1]['mean_rel_l2']}", file=sys.stderr, flush=True)
    print(json.dumps({"benchmark": "burgers_floor", "flux": "godunov", "t_final": 1 / 3, "c": list(HELD_OUT),
                      "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
