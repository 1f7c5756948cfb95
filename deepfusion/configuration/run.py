"""A run as its configuration makes it, built once: :class:`Run` holds the family on the run's grid, its
training and held-out instances and the attributes its field files carry, and makes from them the generator, the
families it is trained and evaluated on, and the training's :class:`Schedule` (its visits, each with the generator and
the family it trains).

``deepfusion train`` builds it once and hands it to the trainer and the evaluation; ``compare``, ``uq``,
``infer``, ``reference`` and :class:`~deepfusion.surrogate.Surrogate` take the same object, so no command
builds the family twice or draws its instances again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from deepfusion.configuration.schema import Config, TrainConfig
from deepfusion.configuration.config import family_table
from deepfusion.configuration.family_checks import checked_family
from diffnet.backend.clock import PartClock

if TYPE_CHECKING:
    import torch

    from deepfusion.configuration.schedule import Visit
    from diffnet.product.product import Finish, Product
    from diffnet.protocol.family import Family

__all__ = ["Run", "Schedule", "Target", "HELDOUT_STREAM"]

# The held-out draws' seed is data.seed plus this: another stream than the training set's.
HELDOUT_STREAM = 7919


@dataclass(frozen=True)
class Run:
    """The family, its instances and its field attributes of one configuration (:meth:`from_config`).

    Attributes
    ----------
    cfg : Config
        The resolved configuration.
    family : diffnet.protocol.family.Family
        The family on ``problem.resolution``, built and checked once.
    training : numpy.ndarray
        The training instances, one row per sample (the family's draw of ``data.n_train``, each checked).
    """

    cfg: Config
    family: Family
    training: np.ndarray = field(compare=False, repr=False)
    # The family on other grids (the schedule's levels), built once each; not part of the run's identity.
    _grids: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_config(cls, cfg: Config) -> "Run":
        """The run of ``cfg``: its family (``problem.family``, :mod:`deepfusion.configuration.registry`) with the
        keys of its table on ``problem.resolution``, and its training set, after the family's checks
        (:func:`~deepfusion.configuration.family_checks.checked_family`; one line each, :class:`ConfigError`)."""
        family, training = checked_family(cfg)
        return cls(cfg, family, training)


    @classmethod
    def of(cls, family: Family, training: np.ndarray, train: TrainConfig | None = None) -> "Run":
        """The run of a family object built by hand (a script, a benchmark, a test) and its training instances: one
        visit of ``train``'s epochs on the family's grid, the family's default keys, no multigrid levels, coarse
        correction or second stage, and none of :meth:`from_config`'s checks."""
        from deepfusion.configuration.schema import DataConfig, MultigridConfig, ProblemConfig

        cfg = Config(problem=ProblemConfig(family=family.name, resolution=tuple(family.resolution)),
                     family_keys=type(family).Options(), data=DataConfig(n_train=len(training)),
                     train=train if train is not None else TrainConfig(), multigrid=MultigridConfig(levels=()))
        return cls(cfg, family, np.asarray(training))

    def on_grid(self, resolution: tuple[int, ...]) -> Family:
        """The family on another grid (a level's), built once per grid."""
        resolution = tuple(resolution)
        if resolution == tuple(self.family.resolution):
            return self.family
        if resolution not in self._grids:
            self._grids[resolution] = self.family.at_resolution(resolution)
        return self._grids[resolution]

    # -- instances ---------------------------------------------------------------------------------------
    @cached_property
    def heldout(self) -> np.ndarray:
        """The held-out instances: the family's own fixed set (e.g. ``burgers.test_c``), or else ``data.n_test``
        random draws from another stream than the training set's."""
        fixed = self.family.fixed_heldout()
        return fixed if fixed is not None else self._random_heldout(self.cfg.data.n_test)

    def heldout_first(self, count: int) -> np.ndarray:
        """The first ``count`` held-out instances: of the fixed set (at most its size), or ``count`` random draws
        (the stream's first rows do not depend on how many are drawn)."""
        fixed = self.family.fixed_heldout()
        if fixed is None:
            return self._random_heldout(count)
        if count > len(fixed):
            from deepfusion.configuration.inputs import InputError

            raise InputError(f"--samples: this run holds out {len(fixed)} instance{'s' if len(fixed) != 1 else ''} "
                             f"(its family's fixed held-out set); got {count}")
        return fixed[:count]

    def _random_heldout(self, count: int) -> np.ndarray:
        return self.family.sample(count, "random", self.cfg.data.seed + HELDOUT_STREAM)

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
    def finish(self) -> Finish:
        """What finishes the network's field (``model.coarse_correction``, ``model.sweeps``, ``model.cycles``,
        ``model.polish``), as diffnet's product takes it."""
        from diffnet.product.product import Finish

        m = self.cfg.model
        return Finish(m.coarse_correction, m.sweeps, m.cycles, m.polish)

    def product(self, model: torch.nn.Module, clock: PartClock | None = None) -> Product:
        """The run's product, the fields a user gets (:class:`diffnet.product.product.Product`): ``model``'s (the trained
        generator, one network or two stages) field finished as the config says, built once here and applied by
        everything that runs a trained generator (the evaluation, inference, the Python API, compare, uq, invert);
        references and floors come from the family itself. ``clock`` gathers the seconds of its parts."""
        from diffnet.product.product import Product

        return Product(self.family, model, self.finish(), clock)

    def generator(self, *args, **kwargs) -> None:
        """Retired: :meth:`product` (the generator is the network; the family its fields come from is the product)."""
        raise AttributeError("Run.generator() is now Run.product(model): the generator is the network, what a user "
                             "gets from it is the product")

    def trained(self, family: Family, clock: PartClock | None = None) -> Family:
        """What the first stage's generator trains on for ``family`` (on one level's grid): the family itself, or its
        preconditioned loss (``train.loss``), with the product's coarse correction on its fields and without its
        sweeps, cycles and polish (:func:`diffnet.product.product.trained`)."""
        from diffnet.product.product import trained

        fields = family
        if self.cfg.train.loss == "preconditioned":
            from diffnet.multigrid.preconditioned import PreconditionedLoss

            fields = PreconditionedLoss(family, self.cfg.train.precondition_vcycles, self.cfg.train.precondition_form)
        return trained(fields, family, self.finish(), clock)

    def build_model(self) -> torch.nn.Module:
        """The generator of ``[model]``; a multigrid run that deepens (``multigrid.transfer``) gets a
        :class:`~diffnet.generators.networks.LevelStack` with one refinement per finer level, and a run with a
        second stage (``train.second_stage_epochs``) a :class:`~diffnet.generators.two_stage.TwoStage` of both
        networks."""
        import torch

        from diffnet.generators.networks import build_network

        cfg, family, mg = self.cfg, self.family, self.cfg.multigrid
        model = build_network(cfg.model.name, family.in_channels, tuple(cfg.model.channels),
                              cfg.model.checkpoint_activations,
                              levels=tuple(mg.levels) if mg.transfer == "deepen" else (), top_channels=mg.top_channels,
                              output=cfg.model.output, dims=len(family.resolution), out_channels=len(family.unknowns))
        if cfg.train.second_stage_epochs:  # built after the first, whose initial weights stay as without it
            from diffnet.generators.two_stage import SecondNetwork, TwoStage

            fields = len(family.unknowns)
            second = build_network(cfg.model.name, family.in_channels + fields, tuple(cfg.model.channels),
                                   cfg.model.checkpoint_activations, output=cfg.model.output,
                                   dims=len(family.resolution), out_channels=fields)
            model = TwoStage(model, SecondNetwork(second, fields), cfg.train.precondition_vcycles)
        return model.to(getattr(torch, cfg.train.dtype))

    @cached_property
    def visits(self) -> list[Visit]:
        """The training's visits (:func:`deepfusion.configuration.schedule.build_schedule`): one per visit of a level, then
        the second stage's."""
        from deepfusion.configuration.schedule import build_schedule

        return build_schedule(self.cfg)

    def schedule(self, model: torch.nn.Module, clock: PartClock | None = None) -> "Schedule":
        """The schedule of ``model``: its visits, each with the generator and the family it trains
        (:class:`Schedule`); ``clock`` gathers the seconds of the coarse correction on every level."""
        return Schedule(self, model, clock if clock is not None else PartClock())


@dataclass(frozen=True)
class Target:
    """What one visit trains: ``generator`` (a module of the model) on the loss of ``family``."""

    generator: torch.nn.Module
    family: Family


@dataclass
class Schedule:
    """The training's multigrid levels for one model: :attr:`visits` in order, and :meth:`target` of each.

    A level's family is made once: the family on that level's grid, as :meth:`Run.trained` wraps it (or, with
    ``multigrid.coarse_loss = "galerkin"`` below the finest level, the finest grid's loss of the level's prolonged
    output, :class:`~diffnet.generators.galerkin.GalerkinLoss`). A level's generator is the deepened stack's level
    (``multigrid.transfer = "deepen"``) or the one network carried over. The second stage
    (:attr:`~deepfusion.configuration.schedule.Visit.second`) trains the second network on the product's fields
    (:meth:`diffnet.product.product.Product.second_stage`).
    """

    run: Run
    model: torch.nn.Module
    clock: PartClock
    _trained: dict = field(default_factory=dict, repr=False)

    @property
    def visits(self) -> list[Visit]:
        return self.run.visits

    def _on_grid(self, grid: tuple[int, ...]) -> Family:
        """The family a visit of ``grid`` trains, as :meth:`Run.trained` wraps it (made once per grid)."""
        grid = tuple(grid)
        if grid not in self._trained:
            self._trained[grid] = self.run.trained(self.run.on_grid(grid), self.clock)
        return self._trained[grid]

    def target(self, visit: Visit) -> Target:
        """The generator and the family ``visit`` trains.

        Parameters
        ----------
        visit : Visit
            One of :attr:`visits`.

        Returns
        -------
        Target
            The module of the model the visit trains, and the family whose loss it minimises (built once per level).
        """
        from diffnet.generators.galerkin import GalerkinLoss
        from diffnet.generators.networks import LevelStack
        from diffnet.product.product import first_network

        finest = tuple(self.run.family.resolution)  # the last level's grid (a configuration check)
        if visit.second:
            return Target(*self.run.product(self.model, self.clock).second_stage(self._on_grid(finest)))
        first = first_network(self.model)
        family = self._on_grid(visit.grid)
        if self.run.cfg.multigrid.coarse_loss == "galerkin" and tuple(visit.grid) != finest:
            family = GalerkinLoss(family, self._on_grid(finest))
        return Target(first.level(visit.level) if isinstance(first, LevelStack) else first, family)
