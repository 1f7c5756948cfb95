"""``deepfusion uq``: mean and standard-deviation fields over N instances drawn from the family, through
the Python surrogate; with ``--classical`` the same statistics from the classical solve of equal accuracy."""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np

from deepfusion.commands import warn
from deepfusion.configuration.inputs import InputError, check_output_file, require

__all__ = ["command"]


def _check(args: argparse.Namespace) -> None:
    check_output_file(args.out)
    if not 2 <= args.samples <= 10_000_000:
        raise InputError(f"--samples: must be in 2..10000000, got {args.samples}")
    if not 1 <= args.batch <= 65536:
        raise InputError(f"--batch: must be in 1..65536, got {args.batch}")
    if not 2 <= args.reference_samples <= 100_000:
        raise InputError(f"--reference-samples: must be in 2..100000, got {args.reference_samples}")


def _classical(surrogate, say) -> tuple[str, int, float]:
    """The classical configuration as accurate as the network: the refinement search of ``compare`` against
    the network's mean error on (up to) 4 held-out instances of the run, in the field and in each derived field."""
    from deepfusion.analysis import reference_cache
    from deepfusion.analysis.compare import classical_search, derived_targets
    from deepfusion.analysis.derived import measure
    from deepfusion.analysis.equal_accuracy import binding, cheapest
    from deepfusion.analysis.inference import on_domain, relative_l2

    family = surrogate.family
    held = surrogate.run.heldout[:4]
    # Only the errors are needed here: the reference, not the floor (compare reports that).
    truth = on_domain(family, held, reference_cache.truth(family, held))
    pred = surrogate.fields(held)
    target = float(relative_l2(pred, truth).mean())
    derived = measure(family, held, pred, truth, None)
    targets = derived_targets(derived)
    say(f"  DiffNet error {target:.4f}" + "".join(f", {name} {value:.4f}" for name, value in targets.items())
        + f" on {len(held)} held-out instances; classical search to {'those errors' if targets else 'that error'}:")
    points = classical_search(family, held, truth, target, say, derived=derived)
    best = cheapest(points, target, targets)
    if best is None:
        raise InputError("--classical: no classical configuration in the search is as accurate as this network "
                         "(below the reference's own grid); compare against the reference instead")
    if targets:
        say(f"  the match: {best.method} on {best.grid}; {binding(points, target, targets)} binds")
    return best.method, best.grid, target


class Outputs:
    """The moments of a family's derived fields (each scalar, and each tensor component as ``stress_xx``) and the
    values of its quantities of interest, over the instances solved (nothing for a family with neither)."""

    def __init__(self, family, inside) -> None:
        from deepfusion.analysis.uq import Moments

        self.family, self.inside, self._moments = family, inside, Moments
        self.moments: dict = {}
        self.values: dict[str, list] = {}

    def add(self, instances: np.ndarray, fields: np.ndarray) -> None:
        from deepfusion.analysis.derived import derived_fields, quantities, scalar_parts

        mask = None if self.inside is None else self.inside(instances)
        derived = derived_fields(self.family, instances, fields)
        for key, part in scalar_parts(derived, len(self.family.resolution)).items():
            self.moments.setdefault(key, self._moments()).add(part, mask)
        for name, value in quantities(self.family, instances, fields).items():
            self.values.setdefault(name, []).extend(np.asarray(value, dtype=np.float64).tolist())

    def fields(self) -> dict[str, np.ndarray]:
        """``NAME_mean`` and ``NAME_std`` per derived scalar."""
        return {f"{k}_{s}": (m.mean_inside if s == "mean" else m.std) for k, m in self.moments.items()
                for s in ("mean", "std")}

    def quantities(self) -> dict[str, dict]:
        return {k: {"mean": float(np.mean(v)), "std": float(np.std(v, ddof=1)) if len(v) > 1 else 0.0,
                    "min": float(np.min(v)), "max": float(np.max(v))} for k, v in self.values.items()}


def command(args: argparse.Namespace, comm) -> int:
    from deepfusion.analysis.inference import domain_of
    from deepfusion.analysis.uq import draw_parameters, run_study
    from deepfusion.analysis.uq import summary as field_summary
    from deepfusion.files.fields import write_statistics
    from deepfusion.training.rundir import run_config
    from deepfusion.surrogate import Surrogate

    run_dir = Path(args.run_dir)
    cfg = run_config(run_dir)
    _check(args)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        surrogate = Surrogate.load(run_dir, checkpoint=args.checkpoint)
    for w in caught:
        warn(str(w.message))
    spec = surrogate.family.parameters
    if args.classical:
        require(surrogate.family, "classical", "--classical")
        require(surrogate.family, "reference", "--classical")
    try:
        instances = draw_parameters(surrogate.family, args.samples, args.distribution, args.seed)
    except ValueError as e:
        raise InputError(f"--distribution: {e}") from None
    try:
        surrogate.family.check_instances(instances)
    except ValueError as e:
        raise InputError(f"--distribution {args.distribution}: the drawn {e} (the family's check_instances)") from None
    outside = int(spec.outside(instances).sum()) if instances.shape[1:] == spec.shape else 0
    if outside:
        warn(f"{outside} of {len(instances)} drawn instances lie outside the training range {spec.range_text()} "
             f"(the network extrapolates there)")
    name = spec.name
    print(f"deepfusion uq: {run_dir} ({surrogate.family.name}, {'x'.join(map(str, cfg.problem.resolution))}), "
          f"checkpoint {surrogate.checkpoint}; {args.samples} instances, {name} {args.distribution}, seed {args.seed}"
          + ("; each side's time includes its own per-instance set-up" if args.classical else ""), flush=True)
    keep = min(args.reference_samples, args.samples) if args.classical else 0

    family = surrogate.family
    # A domain that moves with the instance: each node's statistics over the samples whose domain holds it.
    inside = (lambda p: domain_of(family, p) <= 0) if family.has("domain") else None
    outputs = Outputs(family, inside)

    def network(p: np.ndarray) -> tuple[np.ndarray, float]:
        t0 = time.perf_counter()
        u = surrogate.fields(p)
        seconds = time.perf_counter() - t0
        outputs.add(p, u)  # derived fields and quantities: the engineer's post-processing, not the network's time
        return u, seconds

    surrogate.clear_caches()  # each side pays its own per-instance set-up (a cut domain's quadrature)
    diffnet = run_study(network, instances, args.batch, "DiffNet", keep, inside=inside)
    fields = {"mean": diffnet.moments.mean_inside, "std": diffnet.moments.std}
    if inside is not None:  # a statistic of the grid alone: for several unknowns, that of the first (each has the same)
        fraction = diffnet.moments.inside_fraction
        fields["inside_fraction"] = fraction if fraction.ndim == len(surrogate.grid) else fraction[0]
    summary = {"run_dir": str(run_dir), "checkpoint": str(surrogate.checkpoint), "problem": surrogate.family.name,
               "samples": args.samples, "distribution": args.distribution, "seed": args.seed,
               "diffnet_seconds": diffnet.seconds}
    if args.classical:
        summary.update(_classical_study(surrogate, instances, args.batch, keep, diffnet, fields, run_dir, inside))
    mean = diffnet.moments.mean_inside
    nodes_inside = int(np.isfinite(mean if mean.ndim == len(surrogate.grid) else mean[0]).sum())
    fields = _per_field(fields, surrogate.family.unknowns, len(surrogate.grid)) | outputs.fields()
    summary["fields"] = field_summary(fields, surrogate.grid)
    if outputs.values:
        summary["quantities"] = outputs.quantities()
    attrs = surrogate.run.field_attrs("diffnet") | {"checkpoint": str(surrogate.checkpoint), "samples": args.samples,
                                           "distribution": args.distribution, "seed": args.seed,
                                           "std_divisor": "N - 1"}
    out = write_statistics(args.out, fields, surrogate.grid, {name: instances}, attrs)
    report = Path(args.out).with_suffix(".json")
    report.write_text(json.dumps(summary, indent=2) + "\n")
    from deepfusion.files.plots import plot_statistics

    axes = list(surrogate.grid)[-2:]  # the plotted plane's axes (3-D: its mid-plane)
    figure = plot_statistics(fields, surrogate.grid, (axes[1], axes[0]), Path(args.out).with_suffix(".png"))
    if inside is not None:
        print(f"statistics over the nodes inside each instance's domain ({nodes_inside} "
              f"nodes inside at least one; inside_fraction holds, per node, the share of the samples)")
    for qname, row in summary.get("quantities", {}).items():
        print(f"{qname}: mean {row['mean']:.4g}, std {row['std']:.4g} over the {args.samples} instances")
    print(f"DiffNet: {args.samples} instances in {diffnet.seconds:.2f} s "
          f"({diffnet.seconds / args.samples * 1e3:.3f} ms each)")
    if args.classical:
        print(f"classical ({summary['classical_method']}, grid {summary['classical_grid']}): "
              f"{summary['classical_seconds']:.2f} s; Monte Carlo check on {keep} instances against "
              f"{summary['reference']}: mean error DiffNet {summary['mean_error_diffnet']:.2e}, classical "
              f"{summary['mean_error_classical']:.2e}; std error DiffNet {summary['std_error_diffnet']:.2e}, "
              f"classical {summary['std_error_classical']:.2e}")
        n_star = summary["break_even_samples"]
        print("break-even for this study, training included: " + (
            "never (the classical solve is faster per instance)" if n_star is None and summary["train_seconds"]
            else "unknown (no training time recorded)" if n_star is None else f"{n_star:.3g} instances"))
    print(f"wrote {out}, {out.with_suffix('.xdmf')}, {report}, {figure}")
    return 0


def _per_field(fields: dict[str, np.ndarray], unknowns: tuple[str, ...], dims: int) -> dict[str, np.ndarray]:
    """Statistics of several unknown fields, (C, *grid) each, as one field per unknown: ``mean_u_x``, ``std_u_x``,
    ...; a statistic of the grid alone (``inside_fraction``) and a single unknown's stay as they are."""
    out = {}
    for stat, value in fields.items():
        if len(unknowns) > 1 and value.ndim > dims:
            out.update({f"{stat}_{name}": value[i] for i, name in enumerate(unknowns)})
        else:
            out[stat] = value
    return out


def _classical_study(surrogate, instances, batch, keep, diffnet, fields, run_dir, inside) -> dict:
    """The classical side: its statistics, time, and both methods against a converged Monte Carlo reference."""
    from deepfusion.analysis import reference_cache
    from deepfusion.analysis.compare import measure_classical
    from deepfusion.analysis.equal_accuracy import break_even
    from deepfusion.analysis.inference import on_domain, relative_l2
    from deepfusion.analysis.uq import Moments, run_study
    from deepfusion.training.rundir import training_time

    method, grid, target = _classical(surrogate, print)

    def classical(p: np.ndarray) -> tuple[np.ndarray, float]:
        fields, seconds = measure_classical(surrogate.family, p, method, grid)
        return fields, sum(seconds)

    surrogate.family.clear_caches()  # the classical side builds its own set-up, as the network's did
    study = run_study(classical, instances, batch, f"classical {method} {grid}", keep, inside=inside)
    fields["classical_mean"], fields["classical_std"] = study.moments.mean_inside, study.moments.std
    print(f"  reference ({surrogate.family.truth_name()}) on the first {keep} instances ...", flush=True)
    mask = None if inside is None else inside(instances[:keep])
    truth = on_domain(surrogate.family, instances[:keep], reference_cache.truth(surrogate.family, instances[:keep]))
    ref, net, cls = Moments(), Moments(), Moments()
    ref.add(truth, mask)
    net.add(diffnet.kept, mask)
    cls.add(study.kept, mask)
    train_seconds, _ = training_time(run_dir)

    def whole(a: np.ndarray, b: np.ndarray) -> float:  # one field's relative L2 distance, over the nodes it has
        known = np.isfinite(a) & np.isfinite(b)
        return float(relative_l2(np.where(known, a, 0.0)[None], np.where(known, b, 0.0)[None])[0])

    n = len(instances)
    return {
        "classical_method": method, "classical_grid": grid, "target_error": target,
        "classical_seconds": study.seconds, "reference": surrogate.family.truth_name(), "reference_samples": keep,
        "mean_error_diffnet": whole(net.mean_inside, ref.mean_inside),
        "mean_error_classical": whole(cls.mean_inside, ref.mean_inside),
        "std_error_diffnet": whole(net.std, ref.std), "std_error_classical": whole(cls.std, ref.std),
        "train_seconds": train_seconds,
        "break_even_samples": break_even(train_seconds, study.seconds / n, diffnet.seconds / n),
        "total_seconds_diffnet_with_training": None if train_seconds is None else train_seconds + diffnet.seconds,
    }
