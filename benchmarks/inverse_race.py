"""The inverse problem's race (issue 75): wall time for one MAP, a posterior of --samples MCMC samples and --datasets
MAPs, through a trained surrogate (training included) and through the family's classical solve with its adjoint,
with the break-even of each row and the two answers compared.

The data: OUTPUTS (a field's component or a derived field, as `deepfusion invert` reads them) at an n × n lattice of
interior points of one instance drawn from the prior, solved on the family's truth grid (finer than the run's: no
inverse crime), with Gaussian noise of --noise times each output's largest magnitude there. Both sides are one
`deepfusion invert --classical` (one process, one thread, the same starts and prior). The surrogate's chains are
--samples long; the classical ones --classical-samples, their time per kept sample scaled to --samples (each step is
one solve per chain, so the cost is linear in the samples; said so in the output). The datasets row repeats one
MAP + Laplace per dataset, timed on this one. Training is the run's own wall time (eval.json's train_seconds).

    python benchmarks/inverse_race.py RUN_DIR --outputs u_x u_y [--lattice 4] [--noise 0.01] [--samples 10000]
        [--classical-samples 1000] [--datasets 100] [--starts 4] [--seed 0] [--out FILE.json]
    python benchmarks/inverse_race.py RUN_DIR --observations OBS.csv ...   # observations of one's own
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ONE_THREAD = {k: "1" for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS")}


def write_observations(family, outputs: list[str], lattice: int, noise: float, seed: int, path: Path) -> dict:
    """The observations' CSV at ``path`` from one instance drawn from the prior, solved on the truth grid."""
    from deepfusion.analysis.inverse import prior_of
    from deepfusion.analysis.observations import observable_fields
    from diffnet.grid.points import values_at

    truth = prior_of(family, "uniform").draw(1, seed + 100)
    refine = getattr(family, "truth_refine", 2)
    fine = dataclasses.replace(family, resolution=tuple(refine * (n - 1) + 1 for n in family.resolution))
    fields = observable_fields(fine, truth, fine.reference(truth), outputs)
    axis = (np.arange(lattice) + 1.0) / (lattice + 1)
    points = np.stack([g.reshape(-1) for g in np.meshgrid(*(axis,) * len(family.resolution), indexing="ij")], 1)
    rng = np.random.default_rng(seed)
    rows = []
    for name in outputs:
        field = fields[name]
        sigma = noise * float(np.abs(field).max())
        exact = values_at(field, fine.resolution, [tuple(p) for p in points])[0]
        rows += [(p, name, v + sigma * rng.standard_normal(), sigma) for p, v in zip(points, exact)]
    coordinates = "xyz"[:len(family.resolution)]
    path.write_text(",".join(coordinates) + ",output,value,sigma\n" + "".join(
        ",".join(f"{c:.6f}" for c in p) + f",{name},{value:.10g},{sigma:.6g}\n" for p, name, value, sigma in rows))
    return {"truth": truth[0].tolist(), "truth_grid": list(fine.resolution), "observations": len(rows)}


def break_even(fixed_surrogate: float, fixed_classical: float, each_surrogate: float, each_classical: float) -> float | None:
    """The N from which fixed_s + N each_s < fixed_c + N each_c; None when the surrogate never catches up."""
    if each_classical <= each_surrogate:
        return None if fixed_surrogate > fixed_classical else 0.0
    return max(0.0, (fixed_surrogate - fixed_classical) / (each_classical - each_surrogate))


def race(report: dict, training: float, samples: int, datasets: int) -> dict:
    """The three rows from one invert report: seconds per side (the surrogate's with training), ratio, break-even."""
    s, c = report, report["classical"]
    per_s = s["mcmc"]["seconds"] / s["mcmc"]["samples"]
    per_c = c["mcmc"]["seconds"] / c["mcmc"]["samples"]
    rows = {
        "one MAP (+ Laplace)": (training + s["seconds"], c["seconds"], break_even(training, 0.0, s["seconds"], c["seconds"]),
                                "MAPs"),
        f"{samples} posterior samples (MAP + MCMC)": (training + s["seconds"] + samples * per_s, c["seconds"] + samples * per_c,
                                                      break_even(training + s["seconds"], c["seconds"], per_s, per_c),
                                                      "samples"),
        f"{datasets} datasets (a MAP + Laplace each)": (training + datasets * s["seconds"], datasets * c["seconds"],
                                                        break_even(training, 0.0, s["seconds"], c["seconds"]), "datasets"),
    }
    return {"training_seconds": training, "seconds_per_sample": {"surrogate": per_s, "classical": per_c},
            "map_seconds": {"surrogate": s["seconds"], "classical": c["seconds"]},
            "rows": {name: {"surrogate_with_training": a, "classical": b, "classical_over_surrogate": b / a,
                            "break_even": n, "break_even_unit": unit} for name, (a, b, n, unit) in rows.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--outputs", nargs="+", help="what to observe at the lattice (or --observations)")
    parser.add_argument("--observations", type=Path, help="a CSV of observations to use instead (invert's format)")
    parser.add_argument("--lattice", type=int, default=4)
    parser.add_argument("--noise", type=float, default=0.01)
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--classical-samples", type=int, default=1000)
    parser.add_argument("--datasets", type=int, default=100)
    parser.add_argument("--starts", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from deepfusion import Surrogate

    surrogate = Surrogate.load(args.run_dir)
    work = (args.out.parent if args.out else args.run_dir) / "inverse_race"
    work.mkdir(parents=True, exist_ok=True)
    if args.observations:
        shutil.copyfile(args.observations, work / "observations.csv")
        data = {"observations_file": str(args.observations)}
    else:
        if not args.outputs:
            parser.error("--outputs or --observations")
        data = write_observations(surrogate.family, args.outputs, args.lattice, args.noise, args.seed,
                                  work / "observations.csv")
        print(f"{data['observations']} observations of {', '.join(args.outputs)} from one instance solved on "
              f"{'x'.join(map(str, data['truth_grid']))}", file=sys.stderr, flush=True)
    command = [sys.executable, "-m", "deepfusion", "invert", str(args.run_dir), "--observations",
               str(work / "observations.csv"), "--out", str(work / "invert"), "--starts", str(args.starts),
               "--seed", str(args.seed), "--classical", "--samples", str(args.samples),
               "--classical-samples", str(args.classical_samples)]
    subprocess.run(command, check=True, env={**os.environ, **ONE_THREAD}, stdout=sys.stderr)
    report = json.loads((work / "invert" / "map.json").read_text())
    training = json.loads((args.run_dir / "eval.json").read_text())["train_seconds"]
    out = {"run_dir": str(args.run_dir), "family": report["family"], "outputs": args.outputs, **data,
           **race(report, training, args.samples, args.datasets),
           "classical_samples_measured": report["classical"]["mcmc"]["samples"],
           "map_difference": report["map_difference"]}
    names = report["parameters"]
    std = np.array([report["classical"]["mcmc"]["std"][n] for n in names])
    means = {side: np.array([r["mcmc"]["mean"][n] for n in names]) for side, r in (("surrogate", report),
                                                                                  ("classical", report["classical"]))}
    out["mcmc_means_in_classical_std"] = float(np.max(np.abs(means["surrogate"] - means["classical"]) / std))
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
