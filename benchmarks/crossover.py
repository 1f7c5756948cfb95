"""Where a trained network and the classical solver of equal accuracy cross as the grid grows.

Reads two or more ``deepfusion compare --out`` reports of the same family on different grids
(e.g. 3-D Poisson at 32^3 and 64^3), and for each product (DiffNet, DiffNet + k cycles) and
thread count in all of them fits a power of the unknowns to the network's batched time per
instance and to the time of its cheapest classical match, t = a N^p (the last two grids), then
projects the speed-up classical / network to larger grids: r(N) = r_last (N / N_last)^(p_classical
- p_network). ``crossover_unknowns`` is where r(N) = 1 (None when the two exponents differ by
less than ``SAME`` : the two times grow alike and the ratio stays where it is); ``advantage``
says which way the ratio moves as the grid grows.

    python benchmarks/crossover.py compare32.json compare64.json [--project 128 256]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

SAME = 0.05  # exponents closer than this: equal growth within what two grids resolve


def _rows(report: dict) -> dict:
    return {(r["product"], r["threads"]): r for r in report["rows"]}


def project(reports: list[dict], sides: list[int]) -> dict:
    """The fitted exponents, measured ratios and projected ratios per (product, threads)."""
    reports = sorted(reports, key=lambda r: math.prod(r["resolution"]))
    unknowns = [math.prod(r["resolution"]) for r in reports]
    rows = [_rows(r) for r in reports]
    out = {}
    for key in sorted(set.intersection(*(set(r) for r in rows))):
        a, b = rows[-2][key], rows[-1][key]
        span = math.log(unknowns[-1] / unknowns[-2])
        p_net = math.log(b["diffnet_s_batched"] / a["diffnet_s_batched"]) / span
        p_cl = math.log(b["classical_s"] / a["classical_s"]) / span
        ratio = b["classical_s"] / b["diffnet_s_batched"]
        gap = p_cl - p_net
        cross = None if abs(gap) < SAME else unknowns[-1] * (1.0 / ratio) ** (1.0 / gap)
        dims = len(reports[-1]["resolution"])
        out[f"{key[0]}, {key[1]} thread{'s' if key[1] > 1 else ''}"] = {
            "measured": [{"grid": r["resolution"], "unknowns": n, "diffnet_s_batched": rw[key]["diffnet_s_batched"],
                          "classical_s": rw[key]["classical_s"], "classical_match": f"{rw[key]['classical_method']} "
                          f"on {rw[key]['classical_grid_equal_accuracy']}", "ratio": rw[key]["ratio_equal_accuracy"],
                          "diffnet_error": rw[key]["diffnet_error"], "ratio_to_floor": rw[key]["ratio_to_floor"]}
                         for r, n, rw in zip(reports, unknowns, rows)],
            "exponent_network": round(p_net, 3), "exponent_classical": round(p_cl, 3),
            "advantage": ("both grow alike: the ratio stays" if abs(gap) < SAME else
                          "network gains as the grid grows" if gap > 0 else "classical gains as the grid grows"),
            "crossover_unknowns": None if cross is None or cross < 1 else round(cross),
            "crossover_side": None if cross is None or cross < 1 else round(cross ** (1.0 / dims), 1),
            "projected_ratio": {f"{n}^{dims}": round(ratio * (n ** dims / unknowns[-1]) ** gap, 3) for n in sides},
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path, help="deepfusion compare --out files, two grids or more")
    parser.add_argument("--project", type=int, nargs="*", default=[128, 256], metavar="N",
                        help="nodes per side to project the ratio to (default 128 256)")
    args = parser.parse_args()
    reports = [json.loads(p.read_text()) for p in args.reports]
    if len(reports) < 2 or len({tuple(r["resolution"]) for r in reports}) < 2:
        raise SystemExit("crossover.py: give compare reports on at least two different grids")
    if len({r["problem"] for r in reports}) != 1:
        raise SystemExit("crossover.py: the reports are of different families")
    print(json.dumps({"benchmark": "crossover", "family": reports[0]["problem"],
                      "rows": project(reports, args.project)}, indent=1))


if __name__ == "__main__":
    main()
