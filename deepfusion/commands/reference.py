"""``deepfusion reference``: the family's classical solutions of given instances (Godunov for Burgers, the Q1
FEM for the diffusivity families, a plugin's own solver), written as an HDF5 field file; with ``--truth``
the independent reference that the evaluation measures errors against (the family's ``truth``)."""

from __future__ import annotations

import argparse
import time
import warnings

from deepfusion.configuration.inputs import (InputError, ParameterRangeWarning, check_output_file, check_resolution,
                               command_line_instances, dataset_name, require)

__all__ = ["command"]


def _progress(k: int, n: int) -> None:
    print(f"  solved {k}/{n}", flush=True)


def command(args: argparse.Namespace, comm) -> int:
    from deepfusion.analysis.inference import domain_of, on_domain
    from deepfusion.configuration.config import family_table, load_config, parse_override
    from deepfusion.configuration.registry import FamilyError, family_class
    from deepfusion.configuration.run import Run
    from deepfusion.files.fields import Layout, write_fields

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
    run = Run.from_config(cfg)
    family = run.family
    require(family, "reference", "reference")
    with warnings.catch_warnings():  # a classical solve has no training range
        warnings.simplefilter("ignore", ParameterRangeWarning)
        instances = command_line_instances(family, args, (len(resolution), len(resolution) + 1))
    solve, name = (family.truth, family.truth_name()) if args.truth else (family.reference, family.reference_name())
    domain = domain_of(family, instances)
    t0 = time.perf_counter()
    u = on_domain(family, instances, solve(instances, progress=_progress), domain)  # a domain's fields: inside it only
    seconds = time.perf_counter() - t0
    # The file says which of the two it holds: the evaluation's truth or the family's same-grid reference.
    attrs = run.field_attrs("truth" if args.truth else "reference") | {"reference": name}
    out = write_fields(args.out, u, family.coordinates(), {dataset_name(family, instances): instances}, attrs,
                       domain, Layout.of(family))
    n = len(instances)
    print(f"wrote {out} and {out.with_suffix('.xdmf')}: {n} solution{'s' if n != 1 else ''} of the {family.name} "
          f"family ({'the independent reference: ' if args.truth else ''}{name}) in {seconds:.2f} s")
    return 0
