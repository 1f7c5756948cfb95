"""Wiring: how a config becomes a diffnet problem, a generator, its training and held-out instances,
and the generator and problem of each multigrid level."""

from __future__ import annotations

import dataclasses

import numpy as np

from deepfusion.configuration.config import Config

__all__ = [
    "build_problem",
    "generator_problem",
    "training_problem",
    "build_model",
    "inference_bytes_per_sample",
    "training_bytes_per_sample",
    "level_models",
    "sample_parameters",
    "training_parameters",
    "heldout_parameters",
    "field_attrs",
]



def build_problem(cfg: Config, resolution: tuple[int, ...] | None = None):
    """The family of ``problem.family`` (:mod:`deepfusion.configuration.registry`) with the keys of its table, on
    ``problem.resolution`` or on ``resolution``."""
    from deepfusion.configuration.registry import family_class

    cls = family_class(cfg.problem.family)
    return cls.from_options(cfg.family, tuple(resolution or cfg.problem.resolution))


def generator_problem(cfg: Config, problem, clock: list | None = None):
    """The problem whose ``field`` is the generator's product: the family's, corrected on a coarse space
    when ``model.coarse_correction`` says so (:class:`diffnet.multigrid.coarse.CoarseCorrected`). Everything that
    runs a model for its fields (training, evaluation, inference, the Python API, compare, uq) goes
    through it; references and floors come from the family itself. ``clock[0]`` gathers the seconds the
    correction takes."""
    return _corrected(cfg, problem, problem, clock)


def _corrected(cfg: Config, fields, family, clock: list | None):
    """``fields`` (a problem giving fields and loss) with ``family``'s coarse correction on its fields, when the
    run has one."""
    if not cfg.model.coarse_correction:
        return fields
    from diffnet.multigrid.coarse import CoarseCorrected

    return CoarseCorrected(fields, family, cfg.model.coarse_correction, clock if clock is not None else [0.0])


def training_problem(cfg: Config, problem, clock: list | None = None):
    """What the generator trains on: the family itself, or its preconditioned loss (``train.loss``), with the
    generator's coarse correction (:func:`generator_problem`) on its fields."""
    trained = problem
    if cfg.train.loss == "preconditioned":
        from diffnet.multigrid.preconditioned import PreconditionedLoss

        trained = PreconditionedLoss(problem, cfg.train.precondition_cycles, cfg.train.precondition_form)
    return _corrected(cfg, trained, problem, clock)


def sample_parameters(cfg: Config, n: int, sampling: str, seed: int) -> np.ndarray:
    return build_problem(cfg).sample(n, sampling, seed)


def training_parameters(cfg: Config) -> np.ndarray:
    """Instance parameters of the training set, one row per sample."""
    return sample_parameters(cfg, cfg.data.n_train, cfg.data.sampling, cfg.data.seed)


def heldout_parameters(cfg: Config, count: int | None = None) -> np.ndarray:
    """Held-out instances: the family's own fixed set (e.g. ``burgers.test_c``), or else ``data.n_test``
    random draws from another stream.

    With ``count``, the first ``count`` of them (any number of draws: the stream's first rows
    do not depend on how many are drawn).
    """
    problem = build_problem(cfg)
    fixed = problem.fixed_heldout()
    if fixed is not None:
        if count is not None and count > len(fixed):
            from deepfusion.configuration.inputs import InputError

            raise InputError(f"--samples: this run holds out {len(fixed)} instance{'s' if len(fixed) != 1 else ''} "
                             f"(its family's fixed held-out set); got {count}")
        return fixed if count is None else fixed[:count]
    return problem.sample(cfg.data.n_test if count is None else count, "random", cfg.data.seed + 7919)


def build_model(cfg: Config, problem):
    """The generator of ``[model]``; a multigrid run that deepens (``multigrid.transfer``) gets
    a :class:`~diffnet.generators.networks.LevelStack` with one refinement per finer level, and a run with a
    second stage (``train.second_stage_epochs``) a :class:`~diffnet.generators.two_stage.TwoStage` of both networks."""
    import torch

    from diffnet.generators.networks import build_network

    mg = cfg.multigrid
    model = build_network(cfg.model.name, problem.in_channels, tuple(cfg.model.channels),
                          cfg.model.checkpoint_activations,
                          levels=tuple(mg.levels) if mg.transfer == "deepen" else (), top_channels=mg.top_channels,
                          output=cfg.model.output, dims=len(problem.resolution), out_channels=len(problem.unknowns))
    if cfg.train.second_stage_epochs:  # built after the first, whose initial weights stay as without it
        from diffnet.generators.two_stage import Correction, TwoStage

        fields = len(problem.unknowns)
        second = build_network(cfg.model.name, problem.in_channels + fields, tuple(cfg.model.channels),
                               cfg.model.checkpoint_activations, output=cfg.model.output, dims=len(problem.resolution),
                               out_channels=fields)
        model = TwoStage(model, Correction(second, fields), cfg.train.precondition_cycles)
    return model.to(getattr(torch, cfg.train.dtype))


def inference_bytes_per_sample(cfg: Config) -> int:
    """Activation bytes one sample keeps alive in a float32 inference pass of ``[model]``'s network."""
    from diffnet.generators.networks import NETWORKS

    return 4 * NETWORKS[cfg.model.name].live_widths * cfg.model.channels[0] * int(np.prod(cfg.problem.resolution))


# Bytes a training step keeps per grid node and per channel of the generator's finest width (float32),
# measured with benchmarks/memory.py and benchmarks/domain_parallel.py (2026-11-24): the U-Net at 512^2
# [16, 32, 64] 121 B, at 129^3 [8, 16, 32] 105 B, recomputed 60 B; a deepened stack's top block (one
# block of top_channels beside the coarse levels, which hold 2^-d of the grid) about a third of that.
_TRAIN_BYTES = {"plain": 128, "checkpointed": 64}


def training_bytes_per_sample(cfg: Config) -> int:
    """An estimate of the memory one sample takes in a training step on the finest grid (float32 x2 for float64)."""
    per = _TRAIN_BYTES["checkpointed" if cfg.model.checkpoint_activations else "plain"]
    nodes = int(np.prod(cfg.problem.resolution))
    deepened = len(cfg.multigrid.levels) > 1 and cfg.multigrid.transfer == "deepen"
    width = cfg.multigrid.top_channels / 3 + cfg.model.channels[0] / 2 ** len(cfg.problem.resolution) if deepened \
        else cfg.model.channels[0]
    return int(per * width * nodes * (2 if cfg.train.dtype == "float64" else 1))


def level_models(cfg: Config, model, clock: list | None = None):
    """``level(k) -> (generator, problem)`` of multigrid level k: the problem on that level's grid
    (or, with ``multigrid.coarse_loss = "galerkin"`` below the finest level, the finest grid's
    problem of the level's prolonged output), and the generator trained there (the deepened
    stack's level k, or the carried network); one past the finest level, the second stage's
    network and problem (:meth:`diffnet.generators.two_stage.TwoStage.pair`). ``clock[0]`` gathers the seconds of the
    generator's coarse correction on every level."""
    from diffnet.generators.galerkin import GalerkinLevel
    from diffnet.generators.networks import LevelStack
    from diffnet.generators.two_stage import TwoStage

    grids: dict[int, object] = {}  # the problem on each level's own grid, built once
    levels = cfg.multigrid.levels
    finest = max(len(levels), 1) - 1
    first = model.first if isinstance(model, TwoStage) else model

    def on_grid(k: int):
        if k not in grids:
            grid = tuple(cfg.problem.resolution) if not levels else (levels[k],) * len(cfg.problem.resolution)
            grids[k] = training_problem(cfg, build_problem(cfg, grid), clock)
        return grids[k]

    def level(k: int):
        if k == finest + 1:  # the second stage (build_schedule): on the first stage's corrected fields
            return model.pair(generator_problem(cfg, build_problem(cfg), clock), on_grid(finest))
        galerkin = cfg.multigrid.coarse_loss == "galerkin" and k < finest
        problem = GalerkinLevel(on_grid(k), on_grid(finest)) if galerkin else on_grid(k)
        return (first.level(k) if isinstance(first, LevelStack) else first), problem

    return level


def field_attrs(cfg: Config, source: str) -> dict:
    """Attributes of a field file: the family, where the fields come from, and every key of the family's
    table as ``<family>.<key>``."""
    from deepfusion.configuration.config import family_table

    table = family_table(cfg)
    attrs = {"problem": table, "source": source}
    for f in dataclasses.fields(cfg.family):
        value = getattr(cfg.family, f.name)
        attrs[f"{table}.{f.name}"] = np.asarray(value, dtype=np.float64) if isinstance(value, tuple) else value
    return attrs
