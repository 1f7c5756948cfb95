"""``deepfusion infer``: new instances through a trained run, written as an HDF5 field file (via :class:`Surrogate`)."""

from __future__ import annotations

import argparse
import math
import time
import warnings
from pathlib import Path

from deepfusion.commands import warn
from deepfusion.configuration.inputs import InputError, check_output_file, command_line_instances, dataset_name

__all__ = ["command"]


def command(args: argparse.Namespace, comm) -> int:
    from deepfusion.analysis.derived import derived_fields, quantities
    from deepfusion.analysis.inference import domain_of
    from deepfusion.files.fields import Layout, write_fields
    from deepfusion.training.rundir import run_config
    from deepfusion.surrogate import Surrogate

    run_dir = Path(args.run_dir)
    run_config(run_dir)  # "not a run directory" before anything else
    check_output_file(args.out)
    if not 0 <= args.polish <= 1000:
        raise InputError(f"--polish: must be in 0..1000, got {args.polish}")
    with warnings.catch_warnings(record=True) as caught:  # each warning becomes one line on stderr
        warnings.simplefilter("always")
        surrogate = Surrogate.load(run_dir, checkpoint=args.checkpoint)
        instances = command_line_instances(surrogate.family, args, (2, 3, 4))
    for w in caught:
        warn(str(w.message))
    tiling = _tiling(args.domain, surrogate.family.resolution, comm)
    t0 = time.perf_counter()
    u = surrogate.fields(instances, polish=args.polish, tiling=tiling)
    seconds = time.perf_counter() - t0
    if comm.rank != 0:
        return 0
    steps = surrogate.run.cfg.model.polish + args.polish  # the product's own (model.polish), then the command's
    attrs = surrogate.run.field_attrs("diffnet") | {"checkpoint": str(surrogate.checkpoint), "polish": steps}
    family = surrogate.family
    derived, values = derived_fields(family, instances, u), quantities(family, instances, u)
    datasets = {dataset_name(family, instances): instances} | values  # each quantity of interest one value per instance
    out = write_fields(args.out, u, family.coordinates(), datasets, attrs, domain_of(family, instances),
                       Layout.of(family), derived)
    n = len(instances)
    what = f" + {steps} polish iteration{'s' if steps != 1 else ''}" if steps else ""
    print(f"wrote {out} and {out.with_suffix('.xdmf')}: {n} field{'s' if n != 1 else ''} {u.shape[1:]} "
          f"in {seconds:.3f} s, from checkpoint {surrogate.checkpoint}{what}"
          + (f"; derived: {', '.join(derived)}" if derived else ""))
    for name, value in values.items():
        print(f"{name}: " + " ".join(f"{v:.4g}" for v in value))
    return 0


def _tiling(domain: str, grid: tuple[int, ...], comm):
    """This rank's tile of ``grid`` under ``--domain`` (None without one)."""
    if not domain.strip():
        return None
    from deepfusion.parallel.domain import domain_splits
    from deepfusion.parallel.halo import MPITiling

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
        raise InputError(f"--domain: {e}") from None
