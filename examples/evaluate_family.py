"""Evaluate a trained run on a family of new instances with the Python API: the network's fields, the
classical reference of the same instances, and the grid's floor, per instance.

    python examples/evaluate_family.py runs/burgers [--samples 8]
"""

import argparse

import numpy as np

from deepfusion import Surrogate
from deepfusion.analysis.inference import against_floor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="run directory (or checkpoint file)")
    parser.add_argument("--samples", type=int, default=8, help="instances drawn from the training range")
    args = parser.parse_args()

    surrogate = Surrogate.load(args.run)
    rng = np.random.default_rng(1)
    lo, hi = surrogate.parameter_range
    params = rng.uniform(lo, hi, (args.samples, *surrogate.family.parameters.shape))
    fields = surrogate.fields(surrogate.instances(**{surrogate.parameter_name: params}))
    # The independent reference (Godunov or a finer FEM) and the best field the grid allows.
    report = against_floor(surrogate.family, params, fields)
    print(f"{surrogate}\nreference: {report.truth_name}\nfloor: {report.floor_name}")
    print(" instance   rel. L2 error   floor    ratio")
    for k, (e, f) in enumerate(zip(report.error, report.floor)):
        print(f"{k:9d}   {e:.4f}          {f:.4f}   {e / f:5.2f}")
    print(f"     mean   {report.error.mean():.4f}          {report.floor.mean():.4f}   {report.ratio:5.2f}")


if __name__ == "__main__":
    main()
