"""A residual loss's coarse correction, measured: what it does to a field's error, and what k Newton steps do instead.

Burgers' loss is a sum of squared residuals, with no energy: its coarse analogue of the exact coarse correction is
the least-squares minimiser over ũ + range(P) (Gauss–Newton, :mod:`diffnet.multigrid.gauss_newton`). Two
measurements, each printing JSON:

* ``--synthetic``: the scheme's own solution (the floor's field) with an error of a known kind added (smooth; rough,
  white noise; a shift of the whole field by one cell, which moves every shock), then corrected by the least-squares
  minimiser and by the Galerkin one (Pᵀ r(ũ + P c) = 0, Newton with the dense Jacobian: a check of the idea on
  small grids, not a product). The error against the scheme's solution before and after.
* ``RUN_DIR`` (a trained Burgers run): the network's fields on held-out instances, then corrected by the least
  squares on ``--coarse``, and polished by k Newton steps of the implicit scheme marching from them (the family's
  ``polish``), each against the floor, with its seconds beside the scheme's own solve (one thread); and the same
  marching without the network (each row's k Newton iterations start from the row before, as the scheme's own solve
  does), the arm a hybrid has to beat.

    python benchmarks/residual_correction.py --synthetic [--resolution 33] [--viscosity 0] [--coarse 9] [--out F]
    python benchmarks/residual_correction.py RUN_DIR [--coarse 33 | --coarse] [--steps 1 2] [--samples 5] [--out F]

(``--coarse`` with no value: no least-squares arm, which costs a scheme solve an instance.)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).flatten(1).norm(dim=1) / b.flatten(1).norm(dim=1)).mean())


def galerkin(family, u: torch.Tensor, c: torch.Tensor, nodes: int, iterations: int = 15) -> torch.Tensor:
    """The field u + P c with Pᵀ r(u + P c) = 0 (Newton with the dense Jacobian, one instance at a time)."""
    from diffnet.multigrid.coarse import coarse_grid
    from diffnet.multigrid.hessian import fixed_nodes
    from diffnet.multigrid.vcycle import dense_interpolation

    grid = tuple(u.shape[1:])
    coarse = coarse_grid(grid, nodes)
    t = [dense_interpolation(n, m, u) for n, m in zip(grid, coarse)]
    p = torch.einsum("ia,jb->ijab", t[0], t[1]).reshape(-1, coarse[0] * coarse[1])
    out = []
    for k in range(len(u)):
        free = ~fixed_nodes(family, c[k:k + 1], u.dtype)[0].flatten()
        coarse_free = ~fixed_nodes(family.at_resolution(coarse), c[k:k + 1], u.dtype)[0].flatten()
        pk = (p * free[:, None].double())[:, coarse_free]
        w = u[k].flatten().clone()
        residual = lambda v: family.residual(v.reshape(1, *grid), c[k:k + 1]).flatten()  # noqa: E731
        for _ in range(iterations):
            jp = torch.autograd.functional.jacobian(residual, w) @ pk
            w = w - pk @ torch.linalg.solve(pk.T @ jp, pk.T @ residual(w))
        out.append(w.reshape(grid))
    return torch.stack(out)


def synthetic(args) -> dict:
    from diffnet.families.burgers import BurgersFamily
    from diffnet.multigrid.gauss_newton import least_squares_minimiser

    n = args.resolution
    family = BurgersFamily(resolution=(n, n), viscosity=args.viscosity, stencil="conservative", c_range=(3.0, 16.0))
    c = torch.tensor([3.5, 6.0], dtype=torch.float64)
    solution = torch.as_tensor(family.scheme_solution(c.numpy()))
    x = torch.linspace(0.0, 1.0, n, dtype=torch.float64)
    generator = torch.Generator().manual_seed(0)
    errors = {"smooth": 0.05 * torch.sin(3 * x)[None, :, None] * torch.cos(2 * x)[None, None, :].expand(2, n, n),
              "rough": 0.01 * torch.randn(2, n, n, generator=generator, dtype=torch.float64),
              "shift by one cell": torch.roll(solution, 1, dims=2) - solution}
    rows = []
    for name, error in errors.items():
        error = error.clone()
        error[:, 0], error[:, :, 0] = 0.0, 0.0  # the initial row and the inflow column are the field's own
        u = solution + error
        t0 = time.perf_counter()
        w, iterations = least_squares_minimiser(family, u, c, args.coarse)
        seconds = time.perf_counter() - t0
        row = {"error": name, "before": _relative(u, solution), "least squares": _relative(w, solution),
               "Gauss-Newton iterations": iterations.tolist(), "least squares s": seconds}
        if n <= 33:  # the dense Jacobian
            row["Galerkin"] = _relative(galerkin(family, u, c, args.coarse), solution)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return {"case": "synthetic", "resolution": n, "viscosity": args.viscosity, "coarse": args.coarse, "rows": rows}


def trained(args) -> dict:
    from deepfusion.analysis.inference import against_floor
    from deepfusion.parallel.runtime import apply_threads
    from deepfusion.training.rundir import trained_model
    from diffnet.product.product import Finish, Product

    apply_threads(1)
    run, model, path = trained_model(args.run_dir)
    family = run.family
    if family.loss().kind != "residual":
        raise SystemExit(f"{args.run_dir}: the {family.name} family's loss (as configured) is not a residual")
    instances = run.heldout_first(args.samples)
    t0 = time.perf_counter()
    pred = Product(family, model).fields(instances, args.batch)
    network_s = time.perf_counter() - t0
    acc = against_floor(family, instances, pred)
    rows = [{"arm": "network", "ratio": acc.ratio, "error": float(acc.error.mean()), "s per instance":
             network_s / len(instances)}]
    print(f"{args.run_dir} ({family.name} {'x'.join(map(str, family.resolution))}, {path.name}), "
          f"{len(instances)} held-out; floor {float(acc.floor.mean()):.4f}", flush=True)
    optimum = torch.as_tensor(acc.optimum)
    rows[0]["vs the scheme's solution"] = _relative(torch.as_tensor(pred), optimum)
    for nodes in args.coarse:
        corrected = Product(family, model, Finish(coarse=nodes))
        t0 = time.perf_counter()
        fields = corrected.fields(instances, args.batch)
        seconds = time.perf_counter() - t0
        a = against_floor(family, instances, fields, truth=acc.truth)
        rows.append({"arm": corrected.steps()[1], "ratio": a.ratio, "error":
                     float(a.error.mean()), "vs the scheme's solution": _relative(torch.as_tensor(fields), optimum),
                     "s per instance": seconds / len(instances)})
    for k in args.steps:
        t0 = time.perf_counter()
        fields = family.polish(instances, pred, k)
        seconds = time.perf_counter() - t0
        a = against_floor(family, instances, fields, truth=acc.truth)
        rows.append({"arm": f"{k} Newton step{'s' if k != 1 else ''}", "ratio": a.ratio, "error":
                     float(a.error.mean()), "vs the scheme's solution": _relative(torch.as_tensor(fields), optimum),
                     "s per instance": (seconds + network_s) / len(instances)})
    for k in args.steps:  # the same iteration without the network: each row's Newton starts from the row before
        t0 = time.perf_counter()
        fields = family.scheme_solution(instances, iterations=k)
        seconds = time.perf_counter() - t0
        a = against_floor(family, instances, fields, truth=acc.truth)
        rows.append({"arm": f"no network: the scheme, {k} Newton iteration{'s' if k != 1 else ''} a row", "ratio":
                     a.ratio, "error": float(a.error.mean()), "vs the scheme's solution":
                     _relative(torch.as_tensor(fields), optimum), "s per instance": seconds / len(instances)})
    t0 = time.perf_counter()
    family.scheme_solution(instances)
    rows.append({"arm": "the scheme's own solve", "ratio": 1.0, "s per instance":
                 (time.perf_counter() - t0) / len(instances)})
    for row in rows:
        print(json.dumps(row), flush=True)
    return {"case": "trained", "run_dir": str(args.run_dir), "checkpoint": str(path), "samples": len(instances),
            "rows": rows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, nargs="?")
    parser.add_argument("--synthetic", action="store_true")
    parser.add_argument("--resolution", type=int, default=33)
    parser.add_argument("--viscosity", type=float, default=0.0)
    parser.add_argument("--coarse", type=int, nargs="*", default=[9])
    parser.add_argument("--steps", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--batch", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.synthetic == (args.run_dir is not None):
        parser.error("give a RUN_DIR or --synthetic")
    if args.synthetic:
        if len(args.coarse) != 1:
            parser.error("--synthetic: one --coarse grid")
        args.coarse = args.coarse[0]
        report = synthetic(args)
    else:
        report = trained(args)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
