"""``deepfusion infer``: new instances through a trained run, written as an HDF5 field file (via :class:`Surrogate`)."""

from __future__ import annotations

import argparse
import math
import time
import warnings
from pathlib import Path

from deepfusion.commands import warn
from deepfusion.inputs import InputError, check_output_file, dataset_name, load_array

__all__ = ["run"]


def run(args: argparse.Namespace, comm) -> int:
    from deepfusion.fields import write_fields
    from deepfusion.rundir import run_config
    from deepfusion.surrogate import Surrogate
    from deepfusion.wiring import field_attrs

    run_dir = Path(args.run_dir)
    run_config(run_dir)  # "not a run directory" before anything else
    check_output_file(args.out)
    if not 0 <= args.polish <= 1000:
        raise InputError(f"--polish: must be in 0..1000, got {args.polish}")
    coeffs = load_array(args.coeffs, "coefficients", (1, 2, 3, 4)) if args.coeffs else None
    nu = load_array(args.nu, "fields", (2, 3, 4)) if args.nu else None
    # A given file names its own errors; one not given is named by the flag that would give it.
    names = {"c": "--c", "coeffs": str(args.coeffs or "--coeffs FILE.npy"), "nu": str(args.nu or "--nu FILE.npy")}
    with warnings.catch_warnings(record=True) as caught:  # each warning becomes one line on stderr
        warnings.simplefilter("always")
        surrogate = Surrogate.load(run_dir, checkpoint=args.checkpoint)
        given = {"c": args.c, "coeffs": coeffs, "nu": nu}
        for key, (value, name) in _named(args.param, surrogate.problem).items():
            if given[key] is not None:
                raise InputError(f"{name}: the instances are given twice (also as --{key})")
            given[key], names[key] = value, name
        params = surrogate.instances(**given, names=names)
    for w in caught:
        warn(str(w.message))
    tiling = _tiling(args.domain, surrogate.problem.resolution, comm)
    t0 = time.perf_counter()
    u = surrogate.fields(params, polish=args.polish, tiling=tiling)
    seconds = time.perf_counter() - t0
    if comm.rank != 0:
        return 0
    attrs = field_attrs(surrogate.config, "diffnet") | {"checkpoint": str(surrogate.checkpoint), "polish": args.polish}
    out = write_fields(args.out, u, surrogate.problem.coordinates(), {dataset_name(surrogate.problem, params): params},
                       attrs)
    n = len(params)
    what = f" + {args.polish} polish iteration{'s' if args.polish != 1 else ''}" if args.polish else ""
    print(f"wrote {out} and {out.with_suffix('.xdmf')}: {n} field{'s' if n != 1 else ''} {u.shape[1:]} "
          f"in {seconds:.3f} s, from checkpoint {surrogate.checkpoint}{what}")
    return 0


def _named(items: list[str], problem) -> dict[str, tuple]:
    """``--param NAME=VALUE`` items as ``{c|coeffs|nu: (value, how messages name it)}``: numbers for a
    scalar parameter (repeatable), a .npy path for a vector parameter or a field input."""
    from deepfusion.inputs import by_name

    scalars: dict[str, list[float]] = {}
    files: dict[str, Path] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not (sep and name and value):
            raise InputError(f"--param {item!r}: expected NAME=VALUE")
        if problem.parameters.shape == () and name == problem.parameters.name:
            try:
                scalars.setdefault(name, []).append(float(value))
            except ValueError:
                raise InputError(f"--param {name}: expected a number, got {value!r}") from None
        elif name in files:
            raise InputError(f"--param {name}: given twice")
        else:
            files[name] = Path(value)
    keywords, names = by_name(problem, {**scalars, **files})
    out = {}
    for key, value in keywords.items():
        if key == "c":
            out[key] = (value, f"--param {names[key]}")
        else:
            out[key] = (load_array(value, "coefficients" if key == "coeffs" else "fields", (1, 2, 3, 4)), str(value))
    return out


def _tiling(domain: str, grid: tuple[int, ...], comm):
    """This rank's tile of ``grid`` under ``--domain`` (None without one)."""
    if not domain.strip():
        return None
    from deepfusion.halo import MPITiling, domain_splits

    try:
        counts = [int(v) for v in domain.split(",")]
    except ValueError:
        raise InputError(f"--domain: expected tile counts such as 2 or 1,2, got {domain!r}") from None
    if len(counts) not in (1, len(grid)) or min(counts) < 1:
        raise InputError(f"--domain: give one tile count per axis of the {len(grid)}-D grid, or one for slabs; "
                         f"got {domain!r}")
    splits = domain_splits(counts, len(grid))
    if math.prod(splits) != comm.size:
        raise InputError(f"--domain: {list(splits)} needs {math.prod(splits)} ranks, the job has {comm.size} "
                         f"(launch with mpiexec -n {math.prod(splits)})")
    try:
        return MPITiling(comm, grid, splits)
    except ValueError as e:
        raise InputError(str(e).replace("parallel.domain", "--domain")) from None
