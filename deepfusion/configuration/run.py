"""A run as its configuration makes it, built once: :class:`Run` holds the family on the run's grid, its
training and held-out instances and the attributes its field files carry, and makes from them the
problems the generator trains and is evaluated on, on every multigrid level, and the generator itself.

``deepfusion train`` builds it once and hands it to the trainer and the evaluation; ``compare``, ``uq``,
``infer``, ``reference`` and :class:`~deepfusion.surrogate.Surrogate` take the same object, so no command
builds the family twice or draws its instances again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from deepfusion.configuration.schema import Config
from diffnet.backend.clock import PartClock

from deepfusion.configuration.config import family_table
from deepfusion.configuration.registry import configured_family

__all__ = ["Run", "HELDOUT_STREAM"]

# The held-out draws' seed is data.seed plus this: another stream than the training set's.
HELDOUT_STREAM = 7919


@dataclass(frozen=True)
class Run:
    """The family, its instances and its field attributes of one configuration (:meth:`from_config`).

    Attributes
    ----------
    cfg : Config
        The resolved configuration.
    problem : diffnet.protocol.family.Family
        The family on ``problem.resolution``, built once.
    """

    cfg: Config
    problem: Any
    # The family on other grids (multigrid levels), built once each; not part of the run's identity.
    _grids: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_config(cls, cfg: Config) -> "Run":
        """The run of ``cfg``: its family (``problem.family``, :mod:`deepfusion.configuration.registry`) with the
        keys of its table, on ``problem.resolution`` (the object the configuration's checks built)."""
        return cls(cfg, configured_family(cfg.problem.family, cfg.family_keys, tuple(cfg.problem.resolution)))

    def on_grid(self, resolution: tuple[int, ...]):
        """The family on another grid (a multigrid level's), built once per grid."""
        resolution = tuple(resolution)
        if resolution == tuple(self.problem.resolution):
            return self.problem
        if resolution not in self._grids:
            self._grids[resolution] = configured_family(self.cfg.problem.family, self.cfg.family_keys, resolution)
        return self._grids[resolution]

    # -- instances ---------------------------------------------------------------------------------------
    @cached_property
    def training(self) -> np.ndarray:
        """The training instances, one row per sample (the family's draw of ``data.n_train``)."""
        d = self.cfg.data
        return self.problem.sample(d.n_train, d.sampling, d.seed)

    @cached_property
    def heldout(self) -> np.ndarray:
        """The held-out instances: the family's own fixed set (e.g. ``burgers.test_c``), or else ``data.n_test``
        random draws from another stream than the training set's."""
        fixed = self.problem.fixed_heldout()
        return fixed if fixed is not None else self._random_heldout(self.cfg.data.n_test)

    def heldout_first(self, count: int) -> np.ndarray:
        """The first ``count`` held-out instances: of the fixed set (at most its size), or ``count`` random draws
        (the stream's first rows do not depend on how many are drawn)."""
        fixed = self.problem.fixed_heldout()
        if fixed is None:
            return self._random_heldout(count)
        if count > len(fixed):
            from deepfusion.configuration.inputs import InputError

            raise InputError(f"--samples: this run holds out {len(fixed)} instance{'s' if len(fixed) != 1 else ''} "
                             f"(its family's fixed held-out set); got {count}")
        return fixed[:count]

    def _random_heldout(self, count: int) -> np.ndarray:
        return self.problem.sample(count, "random", self.cfg.data.seed + HELDOUT_STREAM)

    def field_attrs(self, source: str) -> dict:
        """Attributes of a field file: the family, where the fields come from, and every key of the family's
        table as ``<family>.<key>``."""
        table = family_table(self.cfg)
        attrs = {"problem": table, "source": source}
        for f in dataclasses.fields(self.cfg.family_keys):
            value = getattr(self.cfg.family_keys, f.name)
            attrs[f"{table}.{f.name}"] = np.asarray(value, dtype=np.float64) if isinstance(value, tuple) else value
        return attrs

    # -- what the generator is trained and evaluated on -------------------------------------------------------
    def generator(self, clock: PartClock | None = None, problem=None):
        """The problem whose ``field`` is the generator's product: the family's, corrected on a coarse space
        when ``model.coarse_correction`` says so (:class:`diffnet.multigrid.corrected.CoarseCorrected`). Everything
        that runs a model for its fields (training, evaluation, inference, the Python API, compare, uq) goes
        through it; references and floors come from the family itself. ``clock`` gathers the seconds of the
        correction's parts. ``problem``: the family on another grid (default: the run's)."""
        problem = self.problem if problem is None else problem
        return self._corrected(problem, problem, clock)

    def trained(self, problem, clock: PartClock | None = None):
        """What the generator trains on for ``problem`` (the family on one level's grid): the family itself, or
        its preconditioned loss (``train.loss``), with the generator's coarse correction on its fields."""
        trained = problem
        if self.cfg.train.loss == "preconditioned":
            from diffnet.multigrid.preconditioned import PreconditionedLoss

            trained = PreconditionedLoss(problem, self.cfg.train.precondition_cycles, self.cfg.train.precondition_form)
        return self._corrected(trained, problem, clock)

    @cached_property
    def quadratic(self) -> bool:
        """Whether the family's loss is quadratic in its field: its coarse correction is then one solve per instance,
        kept, else a damped Newton iteration per pass (:func:`diffnet.multigrid.minimiser.coarse_minimiser`)."""
        from deepfusion.configuration.family_checks import quadratic

        return quadratic(self.problem)

    def _corrected(self, fields, family, clock: PartClock | None):
        if not self.cfg.model.coarse_correction:
            return fields
        from diffnet.multigrid.corrected import CoarseCorrected

        clock = clock if clock is not None else PartClock()
        return CoarseCorrected(fields, family, self.cfg.model.coarse_correction, clock, self.quadratic)

    def build_model(self):
        """The generator of ``[model]``; a multigrid run that deepens (``multigrid.transfer``) gets a
        :class:`~diffnet.generators.networks.LevelStack` with one refinement per finer level, and a run with a
        second stage (``train.second_stage_epochs``) a :class:`~diffnet.generators.two_stage.TwoStage` of both
        networks."""
        import torch

        from diffnet.generators.networks import build_network

        cfg, problem, mg = self.cfg, self.problem, self.cfg.multigrid
        model = build_network(cfg.model.name, problem.in_channels, tuple(cfg.model.channels),
                              cfg.model.checkpoint_activations,
                              levels=tuple(mg.levels) if mg.transfer == "deepen" else (), top_channels=mg.top_channels,
                              output=cfg.model.output, dims=len(problem.resolution), out_channels=len(problem.unknowns))
        if cfg.train.second_stage_epochs:  # built after the first, whose initial weights stay as without it
            from diffnet.generators.two_stage import Correction, TwoStage

            fields = len(problem.unknowns)
            second = build_network(cfg.model.name, problem.in_channels + fields, tuple(cfg.model.channels),
                                   cfg.model.checkpoint_activations, output=cfg.model.output,
                                   dims=len(problem.resolution), out_channels=fields)
            model = TwoStage(model, Correction(second, fields), cfg.train.precondition_cycles)
        return model.to(getattr(torch, cfg.train.dtype))

    def levels(self, model, clock: PartClock | None = None):
        """``level(k) -> (generator, problem)`` of multigrid level k: the problem on that level's grid
        (or, with ``multigrid.coarse_loss = "galerkin"`` below the finest level, the finest grid's
        problem of the level's prolonged output), and the generator trained there (the deepened
        stack's level k, or the carried network); one past the finest level, the second stage's
        network and problem (:meth:`diffnet.generators.two_stage.TwoStage.pair`). ``clock`` gathers the
        seconds of the generator's coarse correction on every level. Each level's problem is made once."""
        from diffnet.generators.galerkin import GalerkinLevel
        from diffnet.generators.networks import LevelStack
        from diffnet.generators.two_stage import TwoStage

        cfg = self.cfg
        trained: dict[int, object] = {}
        levels = cfg.multigrid.levels
        finest = max(len(levels), 1) - 1
        first = model.first if isinstance(model, TwoStage) else model

        def on_grid(k: int):
            if k not in trained:
                grid = tuple(cfg.problem.resolution) if not levels else (levels[k],) * len(cfg.problem.resolution)
                trained[k] = self.trained(self.on_grid(grid), clock)
            return trained[k]

        def level(k: int):
            if k == finest + 1:  # the second stage (build_schedule): on the first stage's corrected fields
                return model.pair(self.generator(clock), on_grid(finest), clock)
            galerkin = cfg.multigrid.coarse_loss == "galerkin" and k < finest
            problem = GalerkinLevel(on_grid(k), on_grid(finest)) if galerkin else on_grid(k)
            return (first.level(k) if isinstance(first, LevelStack) else first), problem

        return level
