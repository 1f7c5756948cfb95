"""A finished run's evaluation: its held-out fields against the reference and the floor, the
error's structure and estimate, ``eval.json``, the field files, the table and the plots.

The inference primitives it uses live in :mod:`deepfusion.analysis.inference`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from deepfusion.analysis.derived import Derived, derived_fields, measure
from deepfusion.analysis.diagnostics import coarse_imprint, error_structure
from deepfusion.analysis.inference import FloorReport, against_floor, domain_of, instance_labels, relative_l2
from deepfusion.files.fields import Layout, by_unknown, write_fields
from diffnet.backend.clock import CORRECTION_PARTS, POLISH, PartClock, part_text, total
from diffnet.multigrid.preconditioned import error_estimate

__all__ = ["Assessment", "assess", "evaluate_run", "print_assessment"]


@dataclass(frozen=True)
class Assessment:
    """What an evaluation found, computed without printing or writing (:func:`assess`); :func:`print_assessment`
    shows it, :meth:`report` is ``eval.json``'s content."""

    parameter: str  # the instances' name (the family's parameter)
    test: np.ndarray  # the held-out instances
    resolution: tuple[int, ...]  # the grid
    accuracy: FloorReport  # error against the truth, the floor, their ratio
    structure: dict  # where the error lives (low-mode share, the coarse level's imprint)
    per_field: dict  # each unknown alone (several unknowns only)
    estimate: dict  # the error against the grid's own solution, measured and data-free
    first: dict  # a two-stage generator's first network alone
    infer_seconds: float  # the held-out instances' fields, warm (a new batch's own set-up included)
    parts: dict  # the inference's seconds per instance by part (diffnet.backend.clock): network(s), coarse correction, ...
    newton_steps: float | None = None  # a nonlinear coarse correction's Newton iterations per instance
    derived: Derived = Derived()  # derived fields and quantities of interest against the truth's (and the floor's)
    steps: tuple[str, ...] = ()  # the product's chain, link by link (Product.steps)
    first_call_seconds: float | None = None  # the same fields on the process's first call (compiles, kernels)

    def report(self, train_seconds: float | None) -> dict:
        """``eval.json``'s content."""
        pname, acc = self.parameter, self.accuracy
        return {"parameter": pname, pname: self.test.tolist(), "resolution": list(self.resolution),
                "product": {"chain": " -> ".join(self.steps), "steps": list(self.steps)},
                **acc.as_dict(), "train_seconds": train_seconds, "reference_seconds": acc.truth_seconds,
                "inference_seconds": self.infer_seconds, "inference_first_call_s": self.first_call_seconds,
                "inference_parts_per_instance_s": self.parts,
                "coarse_newton_iterations_per_instance": self.newton_steps,
                **self.structure, **self.estimate, **self.first, **self.derived.report(),
                **({"fields": self.per_field} if self.per_field else {})}


def assess(run, product, test: np.ndarray, pred: np.ndarray, timing: dict | None = None) -> Assessment:
    """The held-out fields ``pred`` of ``test`` against the family's truth and floor, and the error's structure
    and estimate (``run``: the :class:`~deepfusion.configuration.run.Run`; ``product``: what the fields come from,
    :meth:`~deepfusion.configuration.run.Run.product`; ``timing``: the inference's ``seconds`` (warm), ``parts`` (its
    seconds per instance by part), ``newton_steps`` (a nonlinear coarse correction's Newton iterations per instance)
    and ``first_call`` (the same fields' seconds on the process's first call))."""
    cfg, family, timing = run.cfg, run.family, dict(timing or {})
    acc = against_floor(family, test, pred)
    structure = error_structure(pred, acc.truth, acc.optimum, coarse_imprint(run, product.model, test, pred.shape[1:]),
                                dims=len(family.coordinates()))
    return Assessment(family.parameters.name, test, tuple(family.resolution), acc, structure,
                      _per_field(family, pred, acc),
                      _estimated_error(cfg, family, test, pred, acc), _first_stage(product, test, acc),
                      timing.get("seconds", float("nan")), dict(timing.get("parts") or {}), timing.get("newton_steps"),
                      measure(family, test, pred, acc.truth, acc.optimum), tuple(product.steps()),
                      timing.get("first_call"))


def print_assessment(found: Assessment, names: list[str]) -> None:
    """The evaluation's table and its lines, as a run prints them."""
    acc, structure, estimate, first = found.accuracy, found.structure, found.estimate, found.first
    width = max(10, max(len(n) for n in names))
    print(f"\n{'instance':>{width}}   rel. L2 vs reference   floor    ratio")
    for name, ek, fk in zip(names, acc.error, acc.floor):
        print(f"{name:>{width}}   {ek:.4f}               {fk:.4f}   {ek / fk:5.2f}")
    print(f"{'mean':>{width}}   {acc.error.mean():.4f}               {acc.floor.mean():.4f}   {acc.ratio:5.2f}"
          f"   (max error {acc.error.max():.4f})")
    for name, row in found.per_field.items():
        print(f"{name:>{width}}   {row['mean_rel_l2']:.4f}               {row['mean_floor']:.4f}   "
              f"{row['ratio_to_floor']:5.2f}   (each field alone, mean over the instances)")
    for line in found.derived.lines(width):
        print(line)
    print(f"grid {'x'.join(map(str, found.resolution))}; reference: {acc.truth_name}; "
          f"floor: {acc.floor_name}" + ("" if acc.floor_is_root.all() or acc.optimum is None else
                                           f" (no root for instances {np.flatnonzero(~acc.floor_is_root).tolist()}: "
                                           "their least-squares optimum)") + "\n")
    if structure:
        print(f"error structure: {structure['mean_low_mode_share']:.0%} of the squared error in the lowest modes "
              f"(the sum of the mode numbers <= {structure['low_mode_k_max']})" + (
                  f"; cosine with the coarse level's imprint {structure['mean_imprint_cosine']:.2f} "
                  f"(imprint {structure['mean_coarse_imprint_rel_l2']:.4f} of the field)"
                  if "imprint_cosine" in structure else ""))
    if estimate:
        vcycles = estimate.get("estimate_vcycles", 1)
        print(f"error against this grid's own solution: {np.mean(estimate['grid_rel_l2']):.4f} measured"
              + (f", {np.mean(estimate['estimated_grid_rel_l2']):.4f} estimated by |B g| / |u - B g| "
                 f"({vcycles} V-cycle{'s' if vcycles > 1 else ''}; the preconditioned loss's value, data-free)"
                 if "estimated_grid_rel_l2" in estimate else ""))
    if first:
        print(f"the first stage alone: error {np.mean(first['first_stage_rel_l2']):.4f}, ratio "
              f"{first['first_stage_ratio_to_floor']:.2f}; the second stage takes it to {acc.ratio:.2f}")
    seconds, count = found.infer_seconds, len(found.test)
    correction = total(found.parts, CORRECTION_PARTS) * count
    print("product: " + " -> ".join(found.steps))
    print(f"inference {seconds:.3f} s for {count} instances"
          + ("" if found.first_call_seconds is None else
             f" (warm; the process's first call {found.first_call_seconds:.3f} s, with its compiles and kernels)")
          + (f"; the coarse correction and its sweeps {correction:.3f} s ({correction / seconds:.0%})"
             if correction > 0 and seconds > 0 else "")
          + (f"; the polish {total(found.parts, (POLISH,)) * count:.3f} s"
             if POLISH in found.parts else "")  # (a split run's fields come untimed by part)
          + f"; reference {acc.truth_seconds:.2f} s, floor {acc.floor_seconds:.2f} s")
    if found.parts:
        print("one instance's inference by part: " + part_text(found.parts)
              + ("" if found.newton_steps is None else f"; coarse Newton {found.newton_steps:.3g} iterations per instance"))


def evaluate_run(run, model: torch.nn.Module, run_dir: Path, train_seconds: float | None,
                 pred: tuple[np.ndarray, float] | None = None) -> FloorReport | None:
    """A finished run's accuracy on its held-out instances: ``eval.json``, the field files, the table and plots.

    ``pred``: the held-out fields and the seconds they took, when already predicted (under a
    domain split, tile by tile). Else they are predicted here, warm: the product runs once first (the process's
    compiles and kernels, its seconds reported apart), forgets what it kept, then gives the held-out fields again, timed,
    each instance paying its own set-up as a new query would.
    The error is against the independent reference and beside the grid's floor (see
    :func:`against_floor`); the table prints both and their ratio (:func:`assess` computes,
    :func:`print_assessment` prints). A family without a reference solver gets its held-out loss
    instead (and None is returned).

    Parameters
    ----------
    run : Run
        The run (its family, held-out instances and config).
    model : torch.nn.Module
        The trained generator.
    run_dir : Path
        The run directory the report, field files and plots go to.
    train_seconds : float or None
        The training's wall-clock seconds, where known (for the report and N*).
    pred : tuple of (numpy.ndarray, float), optional
        The held-out fields and their seconds, when already predicted.

    Returns
    -------
    FloorReport or None
        The error against the reference and the floor, or None for a family without a reference solver.
    """
    cfg, family, test = run.cfg, run.family, run.heldout  # the run's family, built once (run.Run)
    pname = family.parameters.name
    clock = PartClock()
    product = run.product(model, clock)  # the fields a user gets: the network's, finished as the config says
    first_call = None
    if pred is None:
        t0 = time.perf_counter()
        product.fields(test)
        first_call = time.perf_counter() - t0
        product.clear_caches()
        clock.reset()
        t0 = time.perf_counter()
        pred = (product.fields(test), time.perf_counter() - t0)
    pred, infer_seconds = pred
    # Read now: the assessment runs the generator again.
    timing = {"seconds": infer_seconds, "parts": clock.per(len(test)), "newton_steps": clock.newton_steps(),
              "first_call": first_call}
    coords, domain = family.coordinates(), domain_of(family, test)
    layout = Layout.of(family)
    if not family.has("reference"):
        write_fields(run_dir / "test_prediction.h5", pred, coords, {pname: test}, run.field_attrs("diffnet"), domain,
                     layout=layout, derived=derived_fields(family, test, pred))
        return _loss_only(family, test, pred, run_dir, train_seconds, infer_seconds)
    print(f"reference: {family.truth_name()} for {len(test)} held-out instances, and the floor: "
          f"{family.floor_name() if family.has('floor') else 'none (the family declares no floor)'} ...", flush=True)
    found = assess(run, product, test, pred, timing)
    write_fields(run_dir / "test_prediction.h5", pred, coords, {pname: test}, run.field_attrs("diffnet"), domain,
                 layout, found.derived.fields)
    write_fields(run_dir / "test_reference.h5", found.accuracy.truth, coords, {pname: test},
                 run.field_attrs("reference") | {"reference": found.accuracy.truth_name}, domain,
                 layout, found.derived.truth_fields)
    (run_dir / "eval.json").write_text(json.dumps(found.report(train_seconds), indent=2) + "\n")
    names = instance_labels(family, test)
    print_assessment(found, names)
    if cfg.output.plots:
        _plots(family, test, pred, found.accuracy, names, run_dir / "plots", found.derived, product.name())
    print(f"run directory: {run_dir}")
    return found.accuracy


def _per_field(family, pred: np.ndarray, acc: FloorReport) -> dict:
    """For a family of several unknowns, each field's error against the truth, floor and ratio (the
    table's rows are all fields together); a vector's magnitude is not a field of its own here."""
    if len(family.unknowns) < 2 or acc.optimum is None:
        return {}
    out = {}
    for i, name in enumerate(family.unknowns):
        error = relative_l2(pred[:, i], acc.truth[:, i])
        floor = relative_l2(acc.optimum[:, i], acc.truth[:, i])
        out[name] = {"rel_l2": error.tolist(), "mean_rel_l2": float(error.mean()), "floor_rel_l2": floor.tolist(),
                     "mean_floor": float(floor.mean()), "ratio_to_floor": float(error.mean() / floor.mean())}
    return out


def _first_stage(product, test: np.ndarray, acc: FloorReport) -> dict:
    """A two-stage generator's first network alone on the held-out instances: its error and ratio to the floor."""
    first = product.first_stage()
    if first is None:
        return {}
    error = relative_l2(first.fields(test), acc.truth)
    return {"first_stage_rel_l2": error.tolist(), "first_stage_ratio_to_floor": float(error.mean() / acc.floor.mean())}


def _estimated_error(cfg, family, test: np.ndarray, pred: np.ndarray, acc: FloorReport) -> dict:
    """The error against the grid's own solution (the floor's field), for every family with a floor, and beside it, for
    a loss that is an energy, its data-free estimate |B g| / |u - B g| (:func:`diffnet.multigrid.preconditioned.
    error_estimate`: V-cycles of its Hessian, which a residual's J^T J is not)."""
    if acc.optimum is None:
        return {}
    measured = {"grid_rel_l2": relative_l2(pred, acc.optimum).tolist()}
    if family.loss().kind != "energy":
        return measured
    vcycles = cfg.train.precondition_vcycles
    estimated = error_estimate(family, torch.as_tensor(pred, dtype=torch.float64),
                               torch.as_tensor(test, dtype=torch.float64), vcycles)
    return measured | {"estimated_grid_rel_l2": estimated.tolist(), "estimate_vcycles": vcycles}


def _loss_only(family, test: np.ndarray, pred: np.ndarray, run_dir: Path, train_seconds, infer_seconds) -> None:
    """The held-out loss terms of a family that declares no reference solver."""
    terms = family.loss_terms(torch.as_tensor(pred), torch.as_tensor(test, dtype=torch.float64))
    losses = {k: v.detach().numpy().tolist() for k, v in terms.items()}
    report = {"resolution": list(family.resolution), "heldout_loss": losses, "train_seconds": train_seconds,
              "inference_seconds": infer_seconds}
    (run_dir / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    summed = sum(np.asarray(v) for v in losses.values())
    print(f"the {family.name} family declares no reference solver: held-out loss {np.mean(summed):.4e} "
          f"on {len(test)} instances (eval.json)")
    print(f"run directory: {run_dir}")
    return None


def _by_field(family, fields: np.ndarray) -> dict[str, np.ndarray]:
    """Fields (S, C, *grid) of several unknowns by name, each (S, *grid), and each vector's magnitude."""
    out = by_unknown(fields, family.unknowns)
    for name, parts in family.vectors.items():
        out[f"|{name}|"] = np.sqrt(sum(out[p] ** 2 for p in parts))
    return out


def _plots(family, test, pred, acc, names, plots: Path, derived: Derived = Derived(),
           product: str = "DiffNet") -> None:
    from deepfusion.files.plots import mid_plane, plot_deformed, plot_fields, plot_loss, plot_streamlines

    plots.mkdir(exist_ok=True)
    plot_loss(plots.parent / "metrics.jsonl", plots / "loss.png")
    coords = family.coordinates()
    several = len(family.unknowns) > 1
    shown = min(len(test), 2 if several else 6)  # several fields: a row per field and sample
    labels = names[:shown]
    pred, truth = pred[:shown], acc.truth[:shown]
    if several:
        pred, truth = _by_field(family, pred), _by_field(family, truth)
    inputs = input_labels = None
    if family.has("input_fields"):  # the instance itself, e.g. its diffusivity field
        inputs, input_labels = family.input_fields(test[:shown])
    domain = domain_of(family, test[:shown])
    if len(coords) == 3:  # 3-D: the mid-plane (the field files hold the volumes, for ParaView)
        mid, plane, coords = mid_plane(coords)
        pred, truth = ({k: v[:, mid] for k, v in f.items()} if several else f[:, mid] for f in (pred, truth))
        inputs = None if inputs is None else inputs[:, mid]
        domain = None if domain is None else domain[:, mid]
        labels = [f"{label}, {plane}" for label in labels]
    plot_fields(pred, truth, coords, labels, plots / "fields.png",
                inputs=None if inputs is None else (inputs, input_labels), domain=domain, product=product)
    shown_plots = [plots / "loss.png", plots / "fields.png"]
    flows = [parts for name, parts in family.vectors.items() if name in family.velocities and len(coords) == 2]
    displacement = [parts for name, parts in family.vectors.items()
                    if len(parts) == 2 == len(coords) and name not in family.velocities]
    if several and flows:  # a 2-D velocity: streamlines over the vorticity (or the speed)
        mine, theirs = (np.stack([f[p] for p in flows[0]], axis=1) for f in (pred, truth))
        vorticity = "vorticity" in derived.fields
        background = ((derived.fields["vorticity"][:shown], derived.truth_fields["vorticity"][:shown]) if vorticity
                      else tuple(np.sqrt((f**2).sum(axis=1)) for f in (mine, theirs)))
        shown_plots.append(plot_streamlines(mine, theirs, background, "vorticity" if vorticity else "speed", coords,
                                            labels, plots / "streamlines.png"))
    elif several and displacement:  # a 2-D vector: the deformed shape (in 3-D the volumes are ParaView's)
        shown_plots.append(plot_deformed(np.stack([pred[p] for p in displacement[0]], axis=1),
                                         np.stack([truth[p] for p in displacement[0]], axis=1), coords, labels,
                                         plots / "deformed.png", domain))
    scalars = {k: v[:shown] for k, v in derived.fields.items() if v.ndim == 1 + len(coords)}
    if scalars and len(coords) == 2:  # derived scalars (von Mises, principal stresses) beside the truth's
        theirs = {k: derived.truth_fields[k][:shown] for k in scalars}
        plot_fields(scalars, theirs, coords, labels, plots / "derived.png", domain=domain, product=product)
        shown_plots.append(plots / "derived.png")
    print("plots: " + " ".join(map(str, shown_plots)))
