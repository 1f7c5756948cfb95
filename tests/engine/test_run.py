"""The run built once (deepfusion.configuration.run.Run): one object from the configuration holds the family, its
training and held-out instances and field attributes, and train, evaluate, diagnostics, compare, uq and the
Surrogate take it instead of building the family again."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
from helpers import PLAIN, ROOT

from deepfusion.configuration.config import load_config
from deepfusion.configuration.run import Run

SMALL = [*PLAIN, "--set", "problem.resolution=[33,33]", "--set", "multigrid.levels=[17,33]",
         "--set", "multigrid.epochs=[1,1]", "--set", "model.channels=[4,8]", "--set", "data.n_train=8",
         "--set", "data.n_test=2", "--set", "train.batch_size=4", "--set", "output.plots=false",
         "--set", "parallel.threads_per_rank=1"]


def test_a_run_holds_its_family_and_instances_once():
    cfg = load_config(ROOT / "configs" / "poisson.toml", [a for a in SMALL if a != "--set"])
    run = Run.from_config(cfg)  # the family built and checked once, here; every command is handed this object
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.family = None
    np.testing.assert_array_equal(run.training, run.family.sample(8, cfg.data.sampling, cfg.data.seed))
    assert run.training is run.training and run.heldout is run.heldout  # drawn once
    np.testing.assert_array_equal(run.heldout_first(1), run.heldout[:1])  # the stream's first rows
    assert len(run.heldout_first(5)) == 5 and not np.isclose(run.heldout[:, None], run.training[None]).all(2).any()
    assert run.on_grid((17, 17)) is run.on_grid((17, 17)) and run.on_grid((33, 33)) is run.family
    assert run.field_attrs("diffnet")["problem"] == "poisson" and run.field_attrs("diffnet")["source"] == "diffnet"


# Counts every construction of the family (from its options, or on another grid), by grid, over one whole `deepfusion train`
# (configuration, training on two levels, the evaluation with its coarse imprint and estimate).
_COUNTING = """
import atexit, collections, sys
from diffnet.families.poisson import PoissonFamily
built = collections.Counter()
original, moved = PoissonFamily.from_options.__func__, PoissonFamily.at_resolution
def counted(cls, options, resolution):
    built[tuple(resolution)] += 1
    return original(cls, options, resolution)
def regridded(self, resolution):
    built[tuple(resolution)] += 1
    return moved(self, resolution)
PoissonFamily.from_options, PoissonFamily.at_resolution = classmethod(counted), regridded
atexit.register(lambda: print("BUILT", sorted(built.items()), file=sys.stderr))
from deepfusion.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_one_train_and_its_evaluation_build_the_family_once_per_grid(tmp_path):
    done = subprocess.run([sys.executable, "-c", _COUNTING, "train", str(ROOT / "configs" / "poisson.toml"),
                           "--out", str(tmp_path / "run"), *SMALL], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "cosine with the coarse level's imprint" in done.stdout  # the diagnostics ran, on level 0's family
    line = next(line for line in done.stderr.splitlines() if line.startswith("BUILT"))
    # 33^2 from the options once; 17^2 for the coarse level (the quadratic probe takes it too) and once inside the
    # coarse correction (its coarse space reads the family's held nodes there); the self-check's 9^2 once.
    # Before the Run: six times on 33^2 from the options, three on 17^2.
    assert line == "BUILT [((9, 9), 1), ((17, 17), 2), ((33, 33), 1)]"


def test_the_sweeps_end_the_product_at_inference_and_a_trained_run_gains_them_by_its_config():
    """model.sweeps: the generator (every inference path, a second stage) ends with the sweeps, the first stage's
    training family corrects without them, and a checkpoint belongs to the run whatever its sweeps."""
    from deepfusion.training.rundir import _architecture

    small = [a for a in SMALL if a != "--set" and not a.startswith(("model.coarse_correction", "model.sweeps"))]
    cfg = load_config(ROOT / "configs" / "poisson.toml", [*small, "model.coarse_correction=5", "model.sweeps=3"])
    run = Run.from_config(cfg)
    model = run.build_model()
    assert run.product(model).finished.sweeps == 3 and run.trained(run.family).sweeps == 0
    plain = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, sweeps=0))
    assert _architecture(plain) == _architecture(cfg)
    # model.cycles alike: the product's, not the first stage's training family's, and not the checkpoint's
    cycled = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, cycles=3))
    product = Run.from_config(cycled).product(model)
    assert product.finished.cycles == 3 and Run.from_config(cycled).trained(run.family).cycles == 1
    assert product.steps()[1:] == ["coarse correction on 5x5 (one kept solve)",
                                   "3 symmetric Gauss-Seidel sweeps, 3 times"]
    assert product.chain().startswith("U-Net deepened by 1 level -> coarse correction")
    assert _architecture(cycled) == _architecture(cfg)
    # model.polish alike, and outermost: the corrected, swept product's field then the family's V-cycles
    polished = dataclasses.replace(cycled, model=dataclasses.replace(cycled.model, polish=2))
    product = Run.from_config(polished).product(model)
    assert product.chain().endswith("3 times -> 2 V-cycles") and product.finished.inner.cycles == 3
    trained = Run.from_config(polished).trained(run.family)
    assert trained.cycles == 1 and trained.sweeps == 0  # no polish around it either: a CoarseCorrected
    assert _architecture(polished) == _architecture(cfg)
