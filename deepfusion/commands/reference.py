"""``deepfusion reference``: the family's classical solutions of given instances (Godunov for Burgers, the Q1
FEM for the diffusivity families, a plugin's own solver), written as an HDF5 field file."""

from __future__ import annotations

import argparse
import time
import warnings

from deepfusion.inputs import (InputError, ParameterRangeWarning, check_output_file, check_resolution,
                               dataset_name, instance_parameters, load_array, require)

__all__ = ["run"]


def _progress(k: int, n: int) -> None:
    print(f"  solved {k}/{n}", flush=True)


def run(args: argparse.Namespace, comm) -> int:
    from deepfusion.config import family_table, load_config, parse_override
    from deepfusion.fields import write_fields
    from deepfusion.registry import FamilyError, family_class
    from deepfusion.wiring import build_problem, field_attrs

    check_output_file(args.out)
    try:
        dims = family_class(args.family).dims
    except FamilyError as e:
        raise InputError(str(e)) from None
    resolution = args.resolution * dims if len(args.resolution) == 1 else args.resolution
    check_resolution(resolution)
    # A reference solve has no training data; random sampling keeps the data section valid for any family.
    cfg = load_config(None, [f"problem.family={args.family}", f"problem.resolution={list(resolution)}",
                             "data.sampling=random", "data.n_train=1", "train.batch_size=1", *args.set])
    table = family_table(cfg)
    for text in args.set:
        if parse_override(text)[0] != table:
            raise InputError(f"--set {text}: reference takes the family's own keys only ({table}.KEY=VALUE)")
    problem = build_problem(cfg)
    require(problem, "reference", "reference")
    coeffs = load_array(args.coeffs, "coefficients", (1, 2, 3, 4)) if args.coeffs else None
    nu = load_array(args.nu, "fields", (len(resolution), len(resolution) + 1)) if args.nu else None
    with warnings.catch_warnings():  # a classical solve has no training range
        warnings.simplefilter("ignore", ParameterRangeWarning)
        params = instance_parameters(problem, c=args.c, coeffs=coeffs, nu=nu,
                                     names={"c": "--c", "coeffs": str(args.coeffs or "--coeffs FILE.npy"),
                                            "nu": str(args.nu or "--nu FILE.npy")})
    t0 = time.perf_counter()
    u = problem.reference(params, progress=_progress)
    seconds = time.perf_counter() - t0
    attrs = field_attrs(cfg, "reference") | {"reference": problem.reference_name()}
    out = write_fields(args.out, u, problem.coordinates(), {dataset_name(problem, params): params}, attrs)
    n = len(params)
    print(f"wrote {out} and {out.with_suffix('.xdmf')}: {n} solution{'s' if n != 1 else ''} of the {problem.name} "
          f"family ({problem.reference_name()}) in {seconds:.2f} s")
    return 0
