"""The check a family passes before training (deepfusion/analysis/selfcheck.py), measured: the loss's gradient at
the family's own same-grid solution over its gradient at the zero field, against the same ratio, in the same run,
at two fields that solve other problems: the family's solution 10 % off (its part the network gives scaled by
1.1: about 0.1 for a linear family) and another training instance's solution on this instance's held values.
And the check's seconds.

The tolerance the check refuses above (``GRADIENT_TOLERANCE``) must lie between the first ratio (a solver's
tolerance) and the second (a solution 10 % off) for every family.

    python benchmarks/family_check.py [CONFIG ...] [--set KEY=VALUE ...]

    python benchmarks/family_check.py                       # every shipped config and the example plugins
    python benchmarks/family_check.py configs/poisson.toml --set problem.resolution=[33,33]
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

EXAMPLES = [(ROOT / "examples" / "families" / name, f"{name}:{cls}", ROOT / "examples" / "families" / name / f"{name}.toml")
            for name, cls in (("two_species", "TwoSpecies"), ("cubic_reaction", "CubicReaction"),
                              ("advection_diffusion", "AdvectionDiffusion"))]


def measure(config: Path, overrides: list[str]) -> dict:
    """One config's check: its ratio at its own solution, 10 % off it and at another instance's, and the seconds."""
    from deepfusion.analysis.selfcheck import GRADIENT_TOLERANCE, check_family, check_grid, stationarity
    from deepfusion.configuration.config import load_config
    from deepfusion.configuration.run import Run

    t0 = time.perf_counter()
    cfg = load_config(config, overrides)
    t1 = time.perf_counter()
    run = Run.from_config(cfg)
    small = run.on_grid(check_grid(tuple(cfg.problem.resolution), tuple(cfg.multigrid.levels)))
    params = run.training[:2]
    t2 = time.perf_counter()
    found = check_family(small, params[:1])
    t3 = time.perf_counter()
    off = other = None
    if small.has("reference"):
        solve = small.discrete_optimum if small.has("floor") else small.reference
        own, theirs = (np.asarray(_first(solve(params[k : k + 1]))) for k in (0, 1))
        held = [_held(small, params[k : k + 1]) for k in (0, 1)]
        off = stationarity(small, params[:1], held[0] + 1.1 * (own - held[0]))
        other = stationarity(small, params[:1], held[0] + (theirs - held[1]))
    return {"config": str(config.relative_to(ROOT)) if config.is_relative_to(ROOT) else str(config),
            "family": small.name, "grid": list(small.resolution), "instance": found.instance,
            "solution": found.solution, "ratio_own_solution": found.ratio, "ratio_ten_percent_off": off,
            "ratio_other_instance": other, "tolerance": GRADIENT_TOLERANCE,
            "separated": None if found.ratio is None or off is None else bool(found.ratio < GRADIENT_TOLERANCE < off),
            "members": list(found.members), "check_seconds": round(t3 - t2, 3), "config_seconds": round(t1 - t0, 3)}


def _first(solved):
    """A floor's fields (it returns them with their root flags) or a reference's."""
    return solved[0] if isinstance(solved, tuple) else solved


def _held(family, params) -> np.ndarray:
    """The field of a zero network output: the instance's held values (its boundary and initial data)."""
    import torch

    p = torch.as_tensor(params, dtype=torch.float64)
    zero = torch.zeros(len(p), len(family.unknowns), *family.resolution, dtype=torch.float64)
    return family.field(zero, p).detach().numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="*", type=Path, help="configs (default: every shipped one and the examples)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override for every config")
    args = parser.parse_args()
    cases = [(None, None, c) for c in args.configs] or \
        [(None, None, c) for c in sorted((ROOT / "configs").glob("*.toml"))] + EXAMPLES
    rows = []
    for folder, family, config in cases:
        overrides = list(args.set) + ([f'problem.family="{family}"'] if family else [])
        if folder is not None:
            sys.path.insert(0, str(folder))
        try:
            rows.append(measure(config.resolve(), overrides))
        finally:
            if folder is not None:
                sys.path.remove(str(folder))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"benchmark": "family_check", "rows": rows,
                      "all_separated": all(r["separated"] is not False for r in rows)}, indent=2))


if __name__ == "__main__":
    main()
