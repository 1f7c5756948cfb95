"""Training a run further: a longer schedule continues it, a finished run says so, --init-from starts
a new run from trained weights, and a refused config names the keys that differ."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from helpers import ROOT, TINY, run_cli
from deepfusion.configuration.config import load_config
from deepfusion.files.checkpoint import checkpoint_files, load_checkpoint
from deepfusion.configuration.schedule import build_schedule
from deepfusion.training.trainer import learning_rate
from test_multigrid import POISSON, SCHEDULE

BURGERS = str(ROOT / "configs" / "burgers.toml")
QUIET = ["--set", "output.plots=false"]
ONE = ["--set", "burgers.test_c=[4.1]"]  # one held-out instance: its Godunov reference is most of a tiny run


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.timeout(300)
def test_longer_schedule_continues_from_the_last_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    assert run_cli("train", POISSON, "--out", str(run_dir), *SCHEDULE, *QUIET).returncode == 0  # 24 steps
    # The finest level gets 3 more epochs: steps 24..35 follow the 6-epoch stage's schedule.
    longer = [*SCHEDULE, *QUIET, "--set", "multigrid.epochs=[3,6]"]
    proc = run_cli("train", POISSON, "--out", str(run_dir), *longer)
    assert proc.returncode == 0, proc.stderr
    assert "continuing with a longer schedule: multigrid.epochs [3, 3] -> [3, 6] (24 -> 36 steps)" in proc.stdout
    assert "trained 12 steps" in proc.stdout
    assert load_config(run_dir / "config.toml").multigrid.epochs == (3, 6)  # the run now says what it trained
    cfg = load_config(run_dir / "config.toml")
    visit = build_schedule(cfg)[-1]
    schedule = dataclasses.replace(cfg.train, lr=visit.lr)
    records = _records(run_dir)
    assert [r["step"] for r in records][-6:] == [26, 28, 30, 32, 34, 36]
    for r in records[-6:]:
        assert r["lr"] == pytest.approx(learning_rate(r["step"] - 1 - visit.first_step, visit.steps, schedule))
    assert records[-1]["epoch"] == 6  # 1-based, as the console counts
    # Run again: complete, nothing trained, evaluated again with the first training time kept.
    before = json.loads((run_dir / "eval.json").read_text())["train_seconds"]
    proc = run_cli("train", POISSON, "--out", str(run_dir), *longer)
    assert proc.returncode == 0, proc.stderr
    assert "the run is complete" in proc.stdout and "trained " not in proc.stdout
    assert json.loads((run_dir / "eval.json").read_text())["train_seconds"] == before
    assert checkpoint_files(run_dir / "checkpoints")[0].name == "step-00000036.h5"
    # Changing a level the run has finished is not a longer schedule.
    proc = run_cli("train", POISSON, "--out", str(run_dir), *SCHEDULE, *QUIET, "--set", "multigrid.epochs=[4,6]")
    assert proc.returncode == 2 and "may only lengthen its schedule" in proc.stderr


@pytest.mark.timeout(300)
def test_init_from_loads_weights_at_another_resolution(tmp_path):
    source = tmp_path / "src"
    assert run_cli("train", BURGERS, "--out", str(source), *TINY, *QUIET, *ONE, "--set", "train.epochs=2").returncode == 0
    weights = load_checkpoint(checkpoint_files(source / "checkpoints")[0]).model
    # A learning rate so small that one epoch cannot move the weights: what is saved is what was loaded.
    run_dir = tmp_path / "new"
    proc = run_cli("train", BURGERS, "--out", str(run_dir), *TINY, *QUIET, *ONE, "--set", "train.epochs=1",
                   "--set", "problem.resolution=[24,24]", "--set", "train.lr=1e-20", "--init-from", str(source))
    assert proc.returncode == 0, proc.stderr
    assert f"initial weights from {checkpoint_files(source / 'checkpoints')[0]}" in proc.stdout
    loaded = load_checkpoint(checkpoint_files(run_dir / "checkpoints")[0]).model
    for name, value in weights.items():
        np.testing.assert_allclose(loaded[name], value, rtol=0, atol=1e-12, err_msg=name)
    # Another network shape is refused with the reason, before anything is written.
    other = tmp_path / "other"
    proc = run_cli("train", BURGERS, "--out", str(other), *TINY, *QUIET, "--set", "model.channels=[8,24]",
                   "--init-from", str(source))
    assert proc.returncode == 2 and proc.stderr.startswith("deepfusion: error: --init-from:"), proc.stderr
    assert "model tensor" in proc.stderr and not other.exists()
