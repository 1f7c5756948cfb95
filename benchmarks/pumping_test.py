"""The user guide's pumping test at full size, timed: a groundwater aquifer (conductivity and well rates) recovered
from heads at nine observation wells and four beside the pumping wells and fluxes at three, the truth solved on 129²
as the tutorial's (finer than the run's: no inverse crime), through the trained surrogate and through the classical
solve with its adjoint, the same starts and prior for both. Prints JSON: each side's MAP, seconds, forward
evaluations, its Laplace standard deviations, the surrogate's MAP judged by the classical objective, and the two
MAPs' difference in classical standard deviations.

    python benchmarks/pumping_test.py RUN_DIR [--starts 4] [--seed 0] [--out FILE.json]
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

TRUTH = [1.2, -0.8, 0.5, 0.3, -1.0, 0.6, -0.7, 0.4, 0.1, -0.3]  # the tutorial's aquifer: a_1..a_6, q_1..q_4


def observations_of(family, truth: np.ndarray, seed: int):
    """The tutorial's sixteen observations of ``truth``, solved on 129²."""
    from deepfusion.analysis.observations import Observations
    from diffnet.grid.points import values_at

    fine = dataclasses.replace(family, resolution=(129, 129))
    heads = fine.reference(truth)
    flux_x = fine.derived(truth, heads)["flux_x"]
    wells = [(x, y) for x in (0.15, 0.5, 0.85) for y in (0.15, 0.5, 0.85)]
    wells += [(0.36, 0.3), (0.76, 0.3), (0.36, 0.7), (0.76, 0.7)]  # beside the pumping wells: their drawdown
    exact = np.concatenate([values_at(heads, fine.resolution, wells)[0],
                            values_at(flux_x, fine.resolution, wells[3:6])[0]])
    sigma = np.array([0.01] * 13 + [0.05] * 3)
    noisy = exact + sigma * np.random.default_rng(seed).standard_normal(len(exact))
    return Observations(np.array(wells + wells[3:6]), ("u",) * 13 + ("flux_x",) * 3, noisy, sigma), fine.resolution


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--starts", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--csv", type=Path, help="also write the observations as invert's CSV (for inverse_race.py)")
    args = parser.parse_args()

    import torch

    from deepfusion import Surrogate
    from deepfusion.analysis.inverse import classical_forward, laplace, map_estimate, objective, prior_of, surrogate_forward

    torch.set_num_threads(1)
    surrogate = Surrogate.load(args.run_dir)
    family = surrogate.family
    truth = np.array([TRUTH])
    observations, truth_grid = observations_of(family, truth, args.seed)
    if args.csv:
        args.csv.write_text("x,y,output,value,sigma\n" + "".join(
            f"{float(x)!r},{float(y)!r},{name},{float(value)!r},{float(sigma)!r}\n" for (x, y), name, value, sigma in
            zip(observations.points, observations.names, observations.values, observations.sigma)))
    prior = prior_of(family, "uniform")
    starts = prior.draw(args.starts, args.seed)
    counter = [0, 0]
    sides = {"surrogate": surrogate_forward(surrogate, observations),
             "classical": classical_forward(family, observations, counter)}
    out = {"run_dir": str(args.run_dir), "truth": TRUTH, "truth_grid": list(truth_grid), "starts": args.starts}
    for name, forward in sides.items():
        t0 = time.perf_counter()
        result = map_estimate(forward, observations, prior, starts)
        seconds = time.perf_counter() - t0
        post = laplace(forward, observations, prior, result.map, copies=name == "surrogate")
        out[name] = {"map": result.map.tolist(), "objective": result.objective, "misfit_rms": result.misfit_rms,
                     "seconds": seconds, "evaluations": result.evaluations, "iterations": result.iterations,
                     "laplace_std": post["std"].tolist(),
                     "rate_error": (result.map[6:] - truth[0, 6:]).tolist()}
        print(f"{name}: MAP in {seconds:.1f} s ({result.evaluations} evaluations), objective {result.objective:.4g}, "
              f"rates {np.round(result.map[6:], 3).tolist()} (truth {truth[0, 6:].tolist()})", file=sys.stderr, flush=True)
    with torch.no_grad():
        judged = float(objective(sides["classical"], observations, prior,
                                 torch.as_tensor(np.array(out["surrogate"]["map"])[None]))[0])
    difference = np.abs(np.array(out["surrogate"]["map"]) - np.array(out["classical"]["map"]))
    out["classical_objective_at_surrogate_map"] = judged
    out["relative_to_classical_map"] = judged / out["classical"]["objective"] - 1.0
    out["map_difference_in_classical_std"] = float(np.max(difference / np.array(out["classical"]["laplace_std"])))
    out["surrogate_over_classical_seconds"] = out["surrogate"]["seconds"] / out["classical"]["seconds"]
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
