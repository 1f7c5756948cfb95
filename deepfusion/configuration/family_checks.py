"""The family a configuration names, built on its grid and tried on one instance before anything is written:
the checks that need its code to run (its keys among themselves, its inputs against ``in_channels``, its field's
and its domain's shapes, the training set's draw and each of its instances, the members of its capabilities, a
load, private hooks of an earlier version, and whether its loss's kind admits what its training and product ask for). :meth:`deepfusion.configuration.run.Run.from_config` runs them once, and the
:class:`~deepfusion.configuration.run.Run` hands the family on. Each failure is one line (:class:`ConfigError`), an
error of the family's own code included. What needs a solve (its truth, its floor, the loss at its own solution) is
tried before training, by :mod:`deepfusion.analysis.selfcheck`."""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING

import numpy as np

from deepfusion.configuration.registry import family_class
from deepfusion.configuration.schema import Config, ConfigError, has_lbfgs

if TYPE_CHECKING:
    from diffnet.protocol.family import Family

__all__ = ["checked_family"]


def checked_family(cfg: Config) -> tuple[Family, np.ndarray]:
    """The family of ``cfg`` on its grid and its training set (``data.n_train`` draws, each instance checked by the
    family), after the checks on one instance; raises :class:`ConfigError`, one line, on the first that fails."""
    family = family_class(cfg.problem.family)
    resolution = tuple(cfg.problem.resolution)
    _retired(family)
    with _family_errors(family):
        family.check_options(cfg.family_keys, n_train=cfg.data.n_train, sampling=cfg.data.sampling, resolution=resolution)
        configured = family.from_options(cfg.family_keys, resolution)
        _first_inputs(configured)
        _first_field(configured)
    try:  # the training set's draw (a tensor grid needs n = k^m, a list its length)
        training = configured.sample(cfg.data.n_train, cfg.data.sampling, cfg.data.seed)
    except ValueError as e:
        raise ConfigError(f"data.sampling: {str(e).splitlines()[0]}") from None
    try:
        configured.check_instances(training)
    except ValueError as e:
        raise ConfigError(f"data: the training set's {str(e).splitlines()[0]} (the family's check_instances)") from None
    _check_members(configured)
    with _family_errors(family):
        _first_load(configured, training[0])
    _training_needs(cfg, family, configured)
    return configured, training


def _training_needs(cfg: Config, family: type, configured: Family) -> None:
    """What the configured training and product ask of the family's loss (its kind, :mod:`diffnet.protocol.loss`: each
    step admitted by some kinds only, :data:`~diffnet.protocol.loss.STEPS`) and of its samples (whole, for a V-cycle or
    a coarse solve)."""
    from diffnet.protocol.loss import refusal

    t, m = cfg.train, cfg.model
    loss = _the_loss(family, configured)
    split = bool(cfg.parallel.domain) and math.prod(cfg.parallel.domain) > 1
    asked = [("train.loss", "preconditioned", t.loss == "preconditioned", "use train.loss = 'family'"),
             ("train.second_stage_epochs", "second_stage", t.second_stage_epochs, "use 0"),
             ("model.coarse_correction", "coarse_correction", m.coarse_correction, "use 0"),
             ("model.sweeps", "sweeps", m.sweeps, "use 0")]
    for key, step, on, instead in asked:
        why = refusal(loss, step) if on else None
        if why:
            lever = (f" (its lever against a smooth error is {configured.smooth_error_lever})"
                     if configured.smooth_error_lever and step in ("preconditioned", "coarse_correction") else "")
            raise ConfigError(f"{key}: the {family.name} family (as configured): {why}{lever}; {instead}")
        if on and split:
            raise ConfigError(f"{key}: needs each sample whole (a V-cycle or a coarse solve); use parallel.domain = [] "
                              f"or {instead}")
    if t.second_stage_epochs and has_lbfgs(t.optimizer):
        raise ConfigError("train.second_stage_epochs: a second stage follows Adam or SGD, not an L-BFGS phase; use "
                          "train.optimizer = 'adam' or 'sgd'")
    if t.loss == "preconditioned" and t.precondition_form == "loss" and loss.assembled_correction is not None:
        raise ConfigError(f"train.precondition_form: the {family.name} family gives B g from its assembled system, "
                          "not as a torch V-cycle the 'loss' form differentiates; use 'target'")
    hessian = t.loss == "preconditioned" or m.coarse_correction or t.second_stage_epochs
    if hessian and cfg.parallel.cuda_graphs and getattr(loss, "assembled_correction", None) is not None:
        raise ConfigError(f"parallel.cuda_graphs: the {family.name} family gives B g from its assembled system (numpy, "
                          "on the host), which a CUDA graph cannot capture; use parallel.cuda_graphs = false")
    if m.polish and not configured.has("polish"):
        raise ConfigError(f"model.polish: the {family.name} family (as configured) declares no polish step (the "
                          "'polish' capability); use 0")


def _the_loss(family: type, configured: Family):
    """The family's loss object (:meth:`~diffnet.protocol.family.Family.loss`), checked to be one; a family of an
    earlier version gets the one its capabilities declare."""
    from diffnet.protocol.loss import Loss

    try:
        loss = configured.loss()
    except (TypeError, ValueError, AttributeError) as e:
        raise ConfigError(f"problem.family: the {family.name} family's loss() failed: {type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''} (docs/families.md, 'The loss')") from None
    if not isinstance(loss, Loss):
        raise ConfigError(f"problem.family: the {family.name} family's loss() returned {type(loss).__name__}; it must "
                          "return a diffnet.Energy, a diffnet.Residual or a diffnet.Loss (docs/families.md, 'The loss')")
    return loss


@contextlib.contextmanager
def _family_errors(family: type):
    """A family's ValueError while it is configured as one line: ``family.key: what is wrong``
    (a message that names its own section, ``data.n_train: ...``, as it is); any other error of the family's own
    code (a member it lacks, a hook of an earlier version called with other arguments) as one line too, naming
    the family and the error, rather than a traceback."""
    try:
        yield
    except ValueError as e:
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(message if "." in message.split(":")[0] else f"{family.name}.{message}") from None
    except (TypeError, NotImplementedError, AttributeError, KeyError, IndexError, ZeroDivisionError) as e:
        message = str(e).splitlines()[0] if str(e) else ""
        raise ConfigError(f"problem.family: the {family.name} family failed on one instance at configuration: "
                          f"{type(e).__name__}: {message} (docs/families.md)") from None


def _retired(family: type) -> None:
    """Refuse a family that defines a member the engine no longer reads (a private hook of an earlier version,
    which would be ignored without a word), naming what replaced each."""
    from diffnet.protocol.family import retired_members

    found = retired_members(family)
    if found:
        listed = "; ".join(f"{klass}.{name} -> {instead}" for klass, name, instead in found)
        raise ConfigError(f"problem.family: the {family.name} family defines members the engine no longer reads "
                          f"(written against an earlier version): {listed} (docs/families.md, 'A family written "
                          "against an earlier version')")


def _first_inputs(configured: Family) -> None:
    """The network's inputs of one instance (the middle of the training range) before anything is written,
    so that a family that refuses this grid or these keys in ``inputs`` does so at configuration time; their
    channels checked against ``in_channels`` (the network is built for that many), and a family's ``domain``
    against the one shape the engine takes."""
    import torch

    from diffnet.grid.nodal import node_data

    low, high = configured.parameters.bounds()
    instances = 0.5 * (low + high)
    if configured.has("domain"):
        node_data(configured.domain(instances[None]), 1, tuple(configured.resolution),
                  f"{configured.name}.domain(instances)")
    x = configured.inputs(torch.as_tensor(instances, dtype=torch.float64)[None])
    expected = (1, configured.in_channels, *configured.resolution)
    if tuple(x.shape) != expected:
        raise ValueError(f"in_channels: inputs(instances) returned shape {list(x.shape)} for one instance; the network "
                         f"is built for in_channels = {configured.in_channels}, {list(expected)}")


def _first_load(configured: Family, first: np.ndarray) -> None:
    """Refuse a family whose instances have no load: for the middle of the training range and the first training
    instance, the field of a zero network output is zero and the loss is stationary there, so zero is their
    solution, and every error the engine reports, relative to it, would be NaN."""
    import torch

    low, high = configured.parameters.bounds()
    grid, channels = tuple(configured.resolution), len(configured.unknowns)
    for row in (0.5 * (low + high), np.asarray(first, dtype=np.float64)):
        instances = torch.as_tensor(row, dtype=torch.float64)[None]
        raw = torch.zeros(1, channels, *grid, dtype=torch.float64, requires_grad=True)
        u = configured.field(raw, instances)
        if bool(u.detach().abs().max() > 0):
            return
        loss = sum(value.sum() for value in configured.loss_terms(u, instances).values())
        (gradient,) = torch.autograd.grad(loss, raw, allow_unused=True)
        if gradient is not None and bool(gradient.abs().max() > 0):
            return
    raise ConfigError(f"problem.family: the {configured.name} family (as configured) has no load: for the middle of "
                      "the training range and the first training instance the zero field is the solution (the field "
                      "of a zero network output is zero and the loss is stationary there), and a relative error "
                      "against zero has no meaning; give it a load (a source, a traction, a held value other than 0)")


def _first_field(configured: Family) -> None:
    """One instance's field of a zero network output, one channel per declared unknown, checked for the
    shape the engine takes ((1, *grid) for one unknown, (1, C, *grid) for several): a family that packs
    several unknowns into one grid, or declares other unknowns than its field has, is refused here."""
    import torch

    from diffnet.protocol.family import check_vectors

    names, grid = tuple(configured.unknowns), tuple(configured.resolution)
    if not names or len(set(names)) != len(names):
        raise ValueError(f"unknowns: need distinct names, got {list(names)}")
    check_vectors(names, configured.vectors, len(grid))
    low, high = configured.parameters.bounds()
    instances = torch.as_tensor(0.5 * (low + high), dtype=torch.float64)[None]
    u = configured.field(torch.zeros(1, len(names), *grid, dtype=torch.float64), instances)
    expected = (1, *grid) if len(names) == 1 else (1, len(names), *grid)
    if tuple(u.shape) != expected:
        raise ValueError(f"field returned shape {list(u.shape)} for unknowns {list(names)} on {list(grid)}; "
                         f"the engine needs {list(expected)} (declare each unknown field in `unknowns`)")


def _check_members(configured: Family) -> None:
    """The family (as configured) has every member of every capability it declares, of the right kind."""
    from diffnet.protocol.capabilities import check_capabilities

    try:
        check_capabilities(configured)
    except TypeError as e:
        raise ConfigError(f"problem.family: {e}") from None
