"""Training schedules: the visits of a run, one per visit of a grid level, then the second stage's (pure functions of
the config).

A single-level run is one visit. A multigrid run (``[multigrid]``) visits its levels in the order of
``multigrid.schedule``; each visit has its own grid, epochs, peak learning rate and global batch (the first stage: the
first network's training), a second stage (the second network's) one more visit of the finest grid, and the
optimiser steps of all visits are numbered on one global
counter, so checkpoints, metrics and resume points are global steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from deepfusion.configuration.schema import Config, TrainConfig
from deepfusion.configuration.schema import first_order, has_lbfgs
from deepfusion.parallel.partition import steps_per_epoch

__all__ = ["KINDS", "Visit", "cycle_visits", "build_schedule", "visit_at", "adam_steps", "total_steps"]

# What a visit trains: a visit of one grid level (the generator, or its level of a deepened stack), or the second
# network of a two-stage model (on the finest level).
KINDS = ("level", "second")


@dataclass(frozen=True)
class Visit:
    """One visit of the schedule, optimiser steps ``first_step`` .. ``first_step + steps - 1``: the first network's visit
    of one level (``kind = "level"``) or the second stage's (``kind = "second"``: the second network, on the finest
    level)."""

    index: int  # position in the schedule
    kind: str  # one of KINDS
    level: int  # the grid level trained on, counted from the coarsest (0) as everywhere
    levels: int  # how many grid levels the run has
    grid: tuple[int, int]
    epochs: int
    lr: float
    batch_size: int
    first_step: int
    steps: int

    @property
    def second(self) -> bool:
        """Whether this is the second stage (the second network, on the finest grid) rather than a visit of a level."""
        return self.kind == "second"

    @property
    def end(self) -> int:
        """The global step after this visit's last one."""
        return self.first_step + self.steps

    def label(self) -> str:
        """``level 2/3 128x128``, ``second stage 64x64`` (empty for a single-level run's one stage)."""
        if self.second:
            return f"second stage {'x'.join(map(str, self.grid))}"
        return f"level {self.level + 1}/{self.levels} {'x'.join(map(str, self.grid))}" if self.levels > 1 else ""


def cycle_visits(cycle: str, n: int) -> list[int]:
    """The order in which a cycle visits levels 0 (coarsest) .. n - 1 (finest).

    ``half_v``: 0, 1, ..., n-1. ``v``, ``w`` (two coarse-grid corrections on every level
    below the finest) and ``f`` (a V-cycle after each coarse-grid correction) start and
    end on the finest grid and follow the textbook diagrams (Briggs, Henson and McCormick,
    *A Multigrid Tutorial*); a level is never visited twice in a row.
    """
    if n < 1:
        raise ValueError(f"need at least one level, got {n}")
    if cycle == "half_v":
        return list(range(n))

    def mu_cycle(k: int, mu: int) -> list[int]:
        if k == 0:
            return [0]
        out = [k]
        for _ in range(mu):
            out += mu_cycle(k - 1, mu) + [k]
        return out

    def f_cycle(k: int) -> list[int]:
        if k == 0:
            return [0]
        return [k] + f_cycle(k - 1) + mu_cycle(k - 1, 1)[1:] + [k]

    if cycle == "v":
        visits = mu_cycle(n - 1, 1)
    elif cycle == "w":  # one coarse-grid correction from the finest grid, two from every level below
        visits = [n - 1] + mu_cycle(n - 2, 2) + [n - 1] if n > 1 else [0]
    elif cycle == "f":
        visits = f_cycle(n - 1)
    else:
        raise ValueError(f"unknown cycle {cycle!r}; choose half_v, v, w or f")
    return [v for i, v in enumerate(visits) if i == 0 or v != visits[i - 1]]


def build_schedule(cfg: Config) -> list[Visit]:
    """The visits of the run ``cfg`` describes (one when ``multigrid.levels`` is empty), then the second stage's
    (``train.second_stage_epochs``)."""
    mg, t = cfg.multigrid, cfg.train
    grids = [(n,) * len(cfg.problem.resolution) for n in mg.levels] or [tuple(cfg.problem.resolution)]
    n = len(grids)

    def per_level(values: tuple, default):  # the lists are unused without levels
        return list(values) if values and mg.levels else [default] * n

    epochs, lrs, batches = per_level(mg.epochs, t.epochs), per_level(mg.lr, t.lr), per_level(mg.batch_size, t.batch_size)
    visits, first = [], 0
    for index, level in enumerate(cycle_visits(mg.schedule, n) if n > 1 else [0]):
        steps = steps_per_epoch(cfg.data.n_train, batches[level]) * epochs[level]
        visits.append(Visit(index, "level", level, n, grids[level], epochs[level], lrs[level], batches[level], first,
                            steps))
        first += steps
    if t.second_stage_epochs:  # the second network, on the finest grid at its batch
        steps = steps_per_epoch(cfg.data.n_train, batches[-1]) * t.second_stage_epochs
        visits.append(Visit(len(visits), "second", n - 1, n, grids[-1], t.second_stage_epochs, t.second_stage_lr,
                            batches[-1], first, steps))
    return visits


def visit_at(visits: list[Visit], step: int) -> int:
    """The index of the visit that global step ``step`` belongs to (``len(visits)`` past the last)."""
    for visit in visits:
        if step < visit.end:
            return visit.index
    return len(visits)


def adam_steps(t: TrainConfig, visits: list[Visit]) -> int:
    """Optimiser steps of the first-order (Adam or SGD) visits (none when ``train.optimizer`` is L-BFGS alone)."""
    return visits[-1].end if first_order(t.optimizer) is not None else 0


def total_steps(t: TrainConfig, visits: list[Visit]) -> int:
    """Optimiser steps of the whole run: the Adam visits, then ``train.lbfgs_iterations`` of L-BFGS."""
    return adam_steps(t, visits) + (t.lbfgs_iterations if has_lbfgs(t.optimizer) else 0)
