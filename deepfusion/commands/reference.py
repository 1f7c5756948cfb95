"""``deepfusion reference``: the family's classical solutions of given instances (Godunov for Burgers, the Q1
FEM for the diffusivity families, a plugin's own solver), written as an HDF5 field file."""

from __future__ import annotations

import argparse
import time
import warnings

from deepfusion.inputs import (InputError, ParameterRangeWarning, check_output_file, check_resolution,
                               instance_parameters, load_array, require)

__all__ = ["run"]


def _progress(k: int, n: int) -> None:
    print(f"  solved {k}/{n}", flush=True)


def run(args: argparse.Namespace, comm) -> int:
    from deepfusion.config import load_config
    from deepfusion.fields import write_fields
    from deepfusion.wiring import build_problem, field_attrs

    check_output_file(args.out)
    resolution = args.resolution * 2 if len(args.resolution) == 1 else args.resolution
    check_resolution(resolution)
    for text in args.set:
        if text.split("=", 1)[0].strip().split(".")[0] in ("problem", "data", "model", "train", "multigrid",
                                                          "parallel", "output"):
            raise InputError(f"--set {text}: reference takes the family's own keys only (e.g. burgers.viscosity=0)")
    # A reference solve has no training data; random sampling keeps the data section valid for any family.
    cfg = load_config(None, [f"problem.family={args.family}", f"problem.resolution={list(resolution)}",
                             "data.sampling=random", "data.n_train=1", "train.batch_size=1", *args.set])
    problem = build_problem(cfg)
    require(problem, "reference", "reference")
    coeffs = load_array(args.coeffs, "coefficients", (1, 2, 3, 4)) if args.coeffs else None
    nu = load_array(args.nu, "fields", (len(resolution), len(resolution) + 1)) if args.nu else None
    with warnings.catch_warnings():  # a classical solve has no training range
        warnings.simplefilter("ignore", ParameterRangeWarning)
        params = instance_parameters(problem, c=args.c, coeffs=coeffs, nu=nu,
                                     names={"c": "--c", "coeffs": str(args.coeffs), "nu": str(args.nu)})
    t0 = time.perf_counter()
    u = problem.reference(params, progress=_progress)
    seconds = time.perf_counter() - t0
    spec = problem.parameters
    name = spec.field if params.ndim == len(resolution) + 1 and spec.field else spec.name
    attrs = field_attrs(cfg, "reference") | {"reference": problem.reference_name()}
    out = write_fields(args.out, u, problem.coordinates(), {name: params}, attrs)
    n = len(params)
    print(f"wrote {out} and {out.with_suffix('.xdmf')}: {n} solution{'s' if n != 1 else ''} of the {problem.name} "
          f"family ({problem.reference_name()}) in {seconds:.2f} s")
    return 0
