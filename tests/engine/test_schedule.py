"""Multigrid schedules: cycle orders, stage bookkeeping and their config checks (pure, no training)."""

import pytest

from helpers import ROOT
from deepfusion.configuration.schema import ConfigError
from deepfusion.configuration.config import load_config
from deepfusion.configuration.schedule import build_schedule, cycle_visits, visit_at


@pytest.mark.parametrize("cycle, n, visits", [
    ("half_v", 1, [0]),
    ("half_v", 3, [0, 1, 2]),
    ("v", 2, [1, 0, 1]),
    ("v", 3, [2, 1, 0, 1, 2]),
    ("w", 2, [1, 0, 1]),
    ("w", 3, [2, 1, 0, 1, 0, 1, 2]),
    ("f", 3, [2, 1, 0, 1, 0, 1, 2]),
    ("f", 4, [3, 2, 1, 0, 1, 0, 1, 2, 1, 0, 1, 2, 3]),
    ("w", 4, [3, 2, 1, 0, 1, 0, 1, 2, 1, 0, 1, 0, 1, 2, 3]),
])
def test_cycle_visits(cycle, n, visits):
    assert cycle_visits(cycle, n) == visits


def test_cycles_end_on_the_finest_level_and_move_one_level_at_a_time():
    for cycle in ("half_v", "v", "w", "f"):
        for n in range(1, 6):
            visits = cycle_visits(cycle, n)
            assert visits[-1] == n - 1 and set(visits) == set(range(n))
            assert all(abs(a - b) == 1 for a, b in zip(visits, visits[1:])), (cycle, n)


def test_schedule_stages_share_one_global_step_counter():
    cfg = load_config(None, ["problem.family=poisson", "problem.resolution=[64,64]", "data.sampling=sobol",
                             "data.n_train=64", "multigrid.levels=[16,32,64]", "multigrid.schedule=v",
                             "multigrid.epochs=[4,3,2]", "multigrid.lr=[3e-3,2e-3,1e-3]",
                             "multigrid.batch_size=[16,8,32]"])
    visits = build_schedule(cfg)
    assert [s.level for s in visits] == [2, 1, 0, 1, 2]
    assert [s.grid for s in visits] == [(64, 64), (32, 32), (16, 16), (32, 32), (64, 64)]
    assert [s.steps for s in visits] == [2 * 2, 8 * 3, 4 * 4, 8 * 3, 2 * 2]
    assert [s.lr for s in visits] == [1e-3, 2e-3, 3e-3, 2e-3, 1e-3]
    assert [s.first_step for s in visits] == [0, 4, 28, 44, 68]
    assert visits[-1].end == 72
    assert [visit_at(visits, k) for k in (0, 3, 4, 27, 28, 71, 72)] == [0, 0, 1, 1, 2, 4, 5]
    assert visits[1].label() == "level 2/3 32x32"
    assert {s.kind for s in visits} == {"level"} and not any(s.second for s in visits)


def test_the_second_stage_is_a_stage_of_its_own_kind_on_the_finest_level():
    cfg = load_config(None, ["problem.family=poisson", "problem.resolution=[64,64]", "data.n_train=64",
                             "multigrid.levels=[32,64]", "multigrid.epochs=[2,1]", "train.second_stage_epochs=3"])
    *visits, second = build_schedule(cfg)
    assert [(s.kind, s.level) for s in visits] == [("level", 0), ("level", 1)]
    assert (second.kind, second.level, second.grid, second.epochs, second.second) == ("second", 1, (64, 64), 3, True)
    assert second.label() == "second stage 64x64"


def test_single_level_schedule_is_the_train_section():
    cfg = load_config(None, ["train.epochs=7", "train.batch_size=16", "data.n_train=64"])
    (visit,) = build_schedule(cfg)
    assert (visit.grid, visit.epochs, visit.steps, visit.lr, visit.label()) == ((64, 64), 7, 28, cfg.train.lr, "")
    # `multigrid.levels=[]` alone turns a shipped multigrid config into one level: the train section's.
    cfg = load_config(ROOT / "configs" / "poisson.toml", ["multigrid.levels=[]", "problem.resolution=[48,48]",
                                                         "train.second_stage_epochs=0"])
    (visit,) = build_schedule(cfg)
    assert (visit.grid, visit.epochs, visit.lr, visit.batch_size) == ((48, 48), cfg.train.epochs, cfg.train.lr,
                                                                 cfg.train.batch_size)


@pytest.mark.parametrize("sets, fragment", [
    (["multigrid.levels=[32,64]", "multigrid.epochs=[1]"], "multigrid.epochs: give one value per level"),
    (["multigrid.levels=[32,64]", "multigrid.lr=[1e-3]"], "multigrid.lr: give one value per level of multigrid.levels (2)"),
    (["multigrid.levels=[32,48]"], "multigrid.levels: the last level must be the square (cubic) problem.resolution"),
    (["multigrid.levels=[32,64]", "problem.resolution=[64,32]"], "must be the square (cubic) problem.resolution"),
    (["multigrid.levels=[64,32]"], "multigrid.levels: must be at most 8 node counts, increasing"),
    (["multigrid.levels=[32,64]", "train.optimizer=lbfgs"], "train.optimizer: multigrid levels are trained by Adam"),
    (["multigrid.levels=[32,64]", "multigrid.batch_size=[8,128]"], "multigrid.batch_size: must be <= data.n_train"),
    (["multigrid.schedule=x"], "multigrid.schedule: must be one of"),
    (["multigrid.transfer=copy"], "multigrid.transfer: must be one of"),
    (["problem.family=poisson", "poisson.truth_refine=1"], "poisson.truth_refine: must be in 2..16"),
])
def test_multigrid_config_errors(sets, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, sets)
