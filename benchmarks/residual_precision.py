"""What a float32 residual can see: the error estimate |B g| / |u - B g| from a float32 and a float64 residual.

Poisson at ``--resolution`` (default 256^2): fields u = u_h (1 + delta s), u_h the grid's own Q1 FEM
solution and s a smooth mode, for several delta (the plateau's error lies in such modes). The
residual g of the Q1 energy is taken in float32 (the network's dtype) and in float64, then B (one
V-cycle, float64) turns each into an error estimate. Where the float32 residual's rounding exceeds
the residual of the error itself, its estimate stops following delta: that is why
diffnet/multigrid/preconditioned.py forms the residual in float64. Prints one JSON object.

    python benchmarks/residual_precision.py [--resolution 256] [--instances 4]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    import numpy as np
    import torch

    from diffnet.families.poisson import PoissonFamily
    from diffnet.multigrid.hessian import loss_gradient
    from diffnet.multigrid.vcycle import VCycle

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resolution", type=int, default=256)
    parser.add_argument("--instances", type=int, default=4)
    args = parser.parse_args()
    if args.resolution < 16 or args.instances < 1:
        raise SystemExit("residual_precision.py: need --resolution >= 16 and --instances >= 1")
    n = args.resolution
    family = PoissonFamily((n, n))
    params = torch.as_tensor(family.sample(args.instances, "random", 3))
    solution = torch.as_tensor(np.stack([family.fem_system(p).solve(tol=1e-13) for p in params.numpy()]))
    x = torch.linspace(0, 1, n, dtype=torch.float64)
    mode = torch.sin(torch.pi * x)[None, :] * torch.cos(torch.pi * x)[:, None]  # smooth, zero on the Dirichlet sides
    B = VCycle.build(family, solution, params)
    rows = []
    for delta in (1e-2, 1e-3, 1e-4, 1e-5):
        u = solution * (1 + delta * mode)
        true = ((u - solution).square().sum((1, 2)) / solution.square().sum((1, 2))).sqrt()
        row = {"delta": delta, "true_rel_error": float(true.mean())}
        for name, dtype in (("float64", torch.float64), ("float32", torch.float32)):
            g = loss_gradient(family, u.to(dtype), params.to(dtype)).double()
            d = B(g * B.free)
            row[f"estimate_{name}"] = float(((d.square().sum((1, 2)) / (u - d).square().sum((1, 2))).sqrt()).mean())
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    print(json.dumps({"resolution": n, "instances": args.instances, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
