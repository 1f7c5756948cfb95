"""``deepfusion reference``: classical solutions of given instances (Godunov for Burgers, Q1 FEM otherwise)."""

from __future__ import annotations

import argparse
import math
import time
import warnings

from deepfusion.inputs import (InputError, ParameterRangeWarning, check_output_file, check_resolution,
                               instance_parameters, load_array, positive_finite)

__all__ = ["burgers", "elliptic"]


def _progress(k: int, n: int) -> None:
    print(f"  solved {k}/{n}", flush=True)


def burgers(args: argparse.Namespace, comm) -> int:
    """Converged Godunov solutions on the nodal grid."""
    from deepfusion.config import load_config
    from deepfusion.fields import write_fields
    from deepfusion.wiring import build_problem

    check_output_file(args.out)
    c = positive_finite("--c", args.c)
    check_resolution(args.resolution)
    if not (math.isfinite(args.viscosity) and args.viscosity >= 0):
        raise InputError(f"--viscosity: must be finite and >= 0, got {args.viscosity}")
    if not (math.isfinite(args.t_final) and args.t_final > 0):
        raise InputError(f"--t-final: must be finite and > 0, got {args.t_final}")
    problem = build_problem(load_config(None, [f"problem.resolution={list(args.resolution)}",
                                               f"problem.viscosity={args.viscosity!r}", f"problem.t_final={args.t_final!r}"]))
    t0 = time.perf_counter()
    u = problem.reference(c, progress=_progress)
    seconds = time.perf_counter() - t0
    attrs = {"problem": "burgers", "source": "godunov", "viscosity": args.viscosity, "t_final": args.t_final}
    out = write_fields(args.out, u, problem.coordinates(), {"c": c}, attrs)
    print(f"wrote {out} and {out.with_suffix('.xdmf')}: {len(c)} Godunov solution{'s' if len(c) != 1 else ''} "
          f"in {seconds:.2f} s")
    return 0


def elliptic(args: argparse.Namespace, comm) -> int:
    """``reference poisson`` / ``reference reaction_diffusion``: Q1 FEM solves of given instances."""
    from deepfusion.config import load_config
    from deepfusion.fields import write_fields
    from deepfusion.wiring import build_problem, field_attrs

    check_output_file(args.out)
    resolution = args.resolution * 2 if len(args.resolution) == 1 else args.resolution
    if len(resolution) != 2:
        raise InputError(f"--resolution: give N or NY NX, got {args.resolution}")
    check_resolution(resolution)
    sets = [f"problem.name={args.problem}", f"problem.resolution={list(resolution)}",
            f"problem.kl_terms={args.kl_terms}", f"problem.kl_eta={args.kl_eta}"]
    if args.problem == "reaction_diffusion":
        sets += [f"problem.kappa={args.kappa}", f"problem.source={args.source}"]
    cfg = load_config(None, sets + ["data.sampling=random", "data.n_train=1", "train.batch_size=1"])
    coeffs = load_array(args.coeffs, "coefficients", (1, 2)) if args.coeffs else None
    nu = load_array(args.nu, "diffusivity", (2, 3)) if args.nu else None
    with warnings.catch_warnings():  # a FEM solve has no training range
        warnings.simplefilter("ignore", ParameterRangeWarning)
        params = instance_parameters(cfg.problem, coeffs=coeffs, nu=nu,
                                     names={"coeffs": str(args.coeffs), "nu": str(args.nu)})
    problem = build_problem(cfg)
    t0 = time.perf_counter()
    u = problem.reference(params, progress=_progress, method=args.method)
    seconds = time.perf_counter() - t0
    name = "nu" if params.ndim == 3 else "a"
    attrs = field_attrs(cfg, "fem") | {"solver": args.method}
    out = write_fields(args.out, u, problem.coordinates(), {name: params}, attrs)
    n = len(params)
    print(f"wrote {out} and {out.with_suffix('.xdmf')}: {n} Q1 FEM solution{'s' if n != 1 else ''} ({args.method}) "
          f"in {seconds:.2f} s")
    return 0
