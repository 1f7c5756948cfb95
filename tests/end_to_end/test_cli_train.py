"""End to end on one rank: train, evaluate, infer, reference, resume, bad input (deepfusion/commands/train.py,
deepfusion/commands/infer.py, deepfusion/commands/reference.py)."""

import json

import h5py
import numpy as np
import pytest

from helpers import ROOT, TINY, float32_atol, run_cli, train_once
from deepfusion.configuration.config import load_config
from deepfusion.files.checkpoint import load_checkpoint

CONFIG = str(ROOT / "configs" / "burgers.toml")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    return train_once(tmp_path_factory, CONFIG, "burgers", *TINY)


def test_tiny_training_lowers_loss_and_writes_run_dir(tiny_run):
    run_dir, stdout = tiny_run
    for name in ["config.toml", "metrics.jsonl", "eval.json", "plots/loss.png", "plots/fields.png",
                 "test_prediction.h5", "test_prediction.xdmf", "test_reference.h5", "test_reference.xdmf",
                 "checkpoints/step-00000020.h5", "checkpoints/step-00000040.h5"]:
        assert (run_dir / name).is_file(), name
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(4, 41, 4))
    for key in ["epoch", "step", "loss", "residual", "samples_per_s", "compute_s", "comm_s", "ranks", "threads"]:
        assert key in records[0], key
    assert records[0]["ranks"] == 1 and records[0]["threads"] == 1
    first, last = records[0]["loss"], np.mean([r["loss"] for r in records[-3:]])
    assert last < 0.7 * first, (first, last)
    report = json.loads((run_dir / "eval.json").read_text())
    assert report["c"] == [3.3, 4.1, 4.77, 5.5, 5.9]
    assert all(0 < e < 2 for e in report["rel_l2"])
    assert "rel. L2 vs reference   floor    ratio" in stdout and "plots:" in stdout
    assert "reference: Godunov" in stdout and report["ratio_to_floor"] > 0
    # Each rank's peak memory, beside the node's: a few hundred MiB of a process that imported torch.
    memory = next(line for line in stdout.splitlines() if line.startswith("peak memory per rank: "))
    peak, node = float(memory.split("at most ")[1].split()[0]), float(memory.split("node has ")[1].split()[0])
    assert 0.05 < peak < node, memory
    kept = float(memory.split("kept set-up at most ")[1].split()[0])  # a third of the node, one rank on it
    assert 0 < kept <= min(12.0, node / 3) + 0.05, memory
    with h5py.File(run_dir / "test_prediction.h5") as f:
        assert f["u"].shape == (5, 16, 16)
        np.testing.assert_allclose(f["c"][()], report["c"])
        assert f.attrs["problem"] == "burgers"
    ckpt = load_checkpoint(run_dir / "checkpoints" / "step-00000040.h5")
    assert ckpt.step == 40 and ckpt.epoch == 10 and ckpt.ranks == 1


@pytest.mark.float32
def test_infer_writes_field_file(tiny_run, tmp_path, cli):
    run_dir, _ = tiny_run
    out = tmp_path / "fields.h5"
    proc = cli("infer", str(run_dir), "--c", "3.3", "--c", "4.1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    with h5py.File(out) as f:
        assert f["u"].shape == (2, 16, 16)
        np.testing.assert_allclose(f["c"][()], [3.3, 4.1])
        assert f["t"].shape == (16,) and f["x"].shape == (16,)
        assert f["t"][-1] == pytest.approx(1 / 3)
        # Same instances, same model: the same fields as the run's own evaluation, to float32
        # rounding (two instances here, the whole test set there: another batch shape).
        with h5py.File(run_dir / "test_prediction.h5") as g:
            expected = g["u"][:2]
            np.testing.assert_allclose(f["u"][()], expected, rtol=0, atol=float32_atol(run_dir, np.abs(expected).max()))
    assert out.with_suffix(".xdmf").is_file()


def test_resume_from_intermediate_checkpoint_is_bitwise(tiny_run, tmp_path, cli):
    import shutil

    run_dir, _ = tiny_run
    copy = tmp_path / "moved"
    shutil.copytree(run_dir, copy)
    (copy / "checkpoints" / "step-00000040.h5").unlink()  # as if the job died after step 20
    proc = cli("train", CONFIG, "--out", str(copy), *TINY, "--resume")
    assert proc.returncode == 0, proc.stderr
    assert "resuming from" in proc.stdout and "(step 20)" in proc.stdout
    a = load_checkpoint(run_dir / "checkpoints" / "step-00000040.h5")
    b = load_checkpoint(copy / "checkpoints" / "step-00000040.h5")
    for name in a.model:
        np.testing.assert_array_equal(a.model[name], b.model[name], err_msg=name)
    steps = [json.loads(line)["step"] for line in (copy / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(4, 41, 4))  # no duplicated lines after the resume point
    # A different config is refused rather than silently mixed.
    proc = cli("train", CONFIG, "--out", str(copy), *TINY, "--set", "train.lr=1e-2", "--resume")
    assert proc.returncode == 2
    assert "holds a run with a different config" in proc.stderr


def test_a_run_takes_other_sweeps_and_cycles_by_its_config_unless_a_second_stage_trains_through_them(tiny_runs):
    """model.sweeps and model.cycles end the product at inference; the first stage trains without them, so a run
    continues (or, finished, is evaluated again) with other values; a second stage's training goes through them."""
    import dataclasses

    from deepfusion.configuration.inputs import InputError
    from deepfusion.training.rundir import find_resume_point, run_config

    run_dir = tiny_runs["poisson"]  # read only
    cfg = run_config(run_dir)
    other = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, coarse_correction=5, sweeps=4, cycles=2))
    with pytest.raises(InputError, match=r"\(model.coarse_correction differ"):
        find_resume_point(run_dir, True, other, print)
    other = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, sweeps=4, cycles=2))
    assert find_resume_point(run_dir, True, other, print) is not None
    staged = dataclasses.replace(other, train=dataclasses.replace(cfg.train, second_stage_epochs=2))
    with pytest.raises(InputError, match=r"\(model.sweeps, model.cycles, train.second_stage_epochs differ"):
        find_resume_point(run_dir, True, staged, print)


def test_existing_run_dir_with_other_config_refused_without_resume(tiny_run, cli):
    run_dir, _ = tiny_run
    proc = cli("train", CONFIG, "--out", str(run_dir), *TINY, "--set", "burgers.viscosity=0.02",
               "--set", "model.channels=[8,24]")
    assert proc.returncode == 2 and "holds a run with a different config" in proc.stderr
    assert "(burgers.viscosity, model.channels differ from" in proc.stderr  # the refusal names the keys


def test_reference_command(tmp_path, cli):
    out = tmp_path / "ref.h5"
    proc = cli("reference", "burgers", "--c", "4.0", "--resolution", "9", "17", "--set", "burgers.viscosity=0.02",
               "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    with h5py.File(out) as f:
        assert f["u"].shape == (1, 9, 17)
        assert f.attrs["source"] == "reference" and f.attrs["reference"].startswith("Godunov")
        assert f.attrs["burgers.viscosity"] == 0.02
        by_flag = f["u"][()]
    # The same instance under the parameter's own name: --param c=4.0 (it was accepted and ignored once).
    proc = cli("reference", "burgers", "--param", "c=4.0", "--resolution", "9", "17", "--set", "burgers.viscosity=0.02",
               "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    with h5py.File(out) as f:
        assert np.array_equal(f["u"][()], by_flag) and list(f["c"][()]) == [4.0]
    proc = cli("reference", "burgers", "--param", "c=4.0", "--c", "5", "--out", str(out))
    assert proc.returncode == 2 and "--param c: the instances are given twice (also as --c)" in proc.stderr


@pytest.mark.timeout(600)
@pytest.mark.parametrize("config, extra", [
    pytest.param("poisson_256.toml", ["--set", "data.n_test=1"], marks=pytest.mark.slow),
    ("burgers_256.toml", ["--set", "burgers.test_c=[4.1]"]),
    ("burgers_inviscid_256.toml", ["--set", "burgers.test_c=[4.1]"]),
    pytest.param("burgers_512_c16.toml", ["--set", "burgers.test_c=[12.9]"], marks=pytest.mark.slow),
    # Not here, for the suite's 15 minutes: poisson_1024, burgers_1024 and poisson3d_128 (its 255^3 reference alone
    # is 75 s). Their keys and family checks run in test_shipped_configs_load; their steps at size in
    # benchmarks/memory.py (`--config configs/poisson3d.toml --grids 65 129`, and its 1024^2 rows).
])
def test_high_resolution_configs_train_here(tmp_path, config, extra):
    # One checkpointed training step on every level of the shipped multigrid schedule, up to
    # the full grid, then the evaluation against the reference and the grid's floor.
    cfg = load_config(ROOT / "configs" / config)
    levels = cfg.multigrid.levels
    ones = "[" + ",".join("1" for _ in levels) + "]"
    run_dir = tmp_path / "run"
    proc = run_cli("train", str(ROOT / "configs" / config), "--out", str(run_dir), "--set", "data.n_train=1",
                   "--set", "train.batch_size=1", "--set", f"multigrid.epochs={ones}",
                   "--set", f"multigrid.batch_size={ones}", "--set", "train.log_every=1",
                   "--set", "output.plots=false", *extra, timeout=540)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["grid"][0] for r in records] == list(levels)
    assert records[-1]["step"] == len(levels) and all(np.isfinite(r["loss"]) for r in records)
    grid = tuple(cfg.problem.resolution)
    with h5py.File(run_dir / "test_prediction.h5") as f:
        assert f["u"].shape == (1, *grid) and np.isfinite(f["u"][()]).all()
    report = json.loads((run_dir / "eval.json").read_text())
    assert len(report["rel_l2"]) == 1 and np.isfinite(report["rel_l2"][0])
    if cfg.model.polish:  # the product ends with the scheme's Newton sweeps (burgers_512_c16): at the floor from one step
        assert report["ratio_to_floor"] == pytest.approx(1.0, abs=0.05)
    else:  # a network of one step a level is far from its grid's best
        assert 0 < report["floor_rel_l2"][0] < report["rel_l2"][0]
