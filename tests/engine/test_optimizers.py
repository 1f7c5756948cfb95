"""SGD with momentum, the float64 L-BFGS phase of a float32 run, and the L-BFGS diagnostics."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from helpers import ROOT, TINY_POISSON, run_cli, run_cli_jobs
from deepfusion.files.checkpoint import load_checkpoint
from deepfusion.parallel.comm import SerialCommunicator
from deepfusion.parallel.runtime import find_mpiexec
from deepfusion.training.lbfgs import GlobalObjective

POISSON = str(ROOT / "configs" / "poisson.toml")
SMALL = TINY_POISSON  # trained in float32, the default
HYBRID = [*SMALL, "--set", "train.optimizer=adam+lbfgs", "--set", "train.epochs=2",
          "--set", "train.lbfgs_iterations=6", "--set", "train.checkpoint_every=2"]
MPIEXEC = find_mpiexec()


def records(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def resume_from(run, tmp_path, step: int, args: list[str]):
    """A copy of ``run`` cut back to its checkpoint at ``step``, resumed with ``args``."""
    copy = tmp_path / f"resumed-{step}"
    shutil.copytree(run, copy)
    for path in (copy / "checkpoints").glob("step-*.h5"):
        if int(path.stem.split("-")[1]) > step:
            path.unlink()
    proc = run_cli("train", POISSON, "--out", str(copy), *args, "--resume")
    assert proc.returncode == 0, proc.stderr
    assert f"(step {step})" in proc.stdout
    return copy


def test_sgd_trains_and_resumes_bitwise(tmp_path):
    args = [*SMALL, "--set", "train.optimizer=sgd", "--set", "train.lr=0.003", "--set", "train.momentum=0.9",
            "--set", "train.epochs=6", "--set", "train.checkpoint_every=4"]
    run = tmp_path / "run"
    proc = run_cli("train", POISSON, "--out", str(run), *args)
    assert proc.returncode == 0, proc.stderr
    rec = records(run)
    assert {r["optimizer"] for r in rec} == {"sgd"} and rec[-1]["loss"] < rec[0]["loss"]
    final = load_checkpoint(run / "checkpoints" / "step-00000012.h5")
    assert final.attrs["optimizer"] == "sgd"
    assert any("momentum_buffer" in entry for entry in final.optimizer_state.values())
    again = load_checkpoint(resume_from(run, tmp_path, 4, args) / "checkpoints" / "step-00000012.h5")
    for name, value in final.model.items():
        np.testing.assert_array_equal(again.model[name], value, err_msg=name)


def test_bad_momentum(tmp_path):
    proc = run_cli("train", POISSON, "--out", str(tmp_path / "r"), *SMALL, "--set", "train.optimizer=sgd",
                   "--set", "train.momentum=1.5")
    assert proc.returncode == 2 and "train.momentum: must be in [0, 1)" in proc.stderr


@pytest.mark.parametrize("mode", ["full", "multibatch"])
def test_float64_phase_of_a_float32_run_resumes_bitwise(tmp_path, mode):
    """The phase runs on a float64 copy; checkpoints hold float32 parameters plus that copy."""
    args = [*HYBRID, "--set", f"train.lbfgs_mode={mode}", "--set", "train.lbfgs_overlap=2",
            "--set", "train.lbfgs_dtype=float64"]
    run = tmp_path / "run"
    proc = run_cli("train", POISSON, "--out", str(run), *args)
    assert proc.returncode == 0, proc.stderr
    assert f"L-BFGS ({mode}, float64) iteration 6/6" in proc.stdout
    final = load_checkpoint(run / "checkpoints" / "step-00000010.h5")
    assert all(v.dtype == np.float32 for v in final.model.values())
    master = final.optimizer_state[0]["master"]
    assert master.dtype == np.float64
    # The stored float32 model is the float64 copy rounded (the U-Net has no buffers; the
    # file lists its tensors by name, not in parameter order, so the values are compared sorted).
    flat32 = np.sort(np.concatenate([value.ravel() for value in final.model.values()]))
    assert flat32.size == master.size
    np.testing.assert_array_equal(flat32, np.sort(master.astype(np.float32)))
    assert not np.array_equal(master, master.astype(np.float32))  # not merely float32 values widened
    again = load_checkpoint(resume_from(run, tmp_path, 6, args) / "checkpoints" / "step-00000010.h5")
    np.testing.assert_array_equal(again.optimizer_state[0]["master"], master)
    for name, value in final.model.items():
        np.testing.assert_array_equal(again.model[name], value, err_msg=name)


def test_lbfgs_diagnostics_are_recorded(tmp_path):
    run = tmp_path / "run"
    proc = run_cli("train", POISSON, "--out", str(run), *HYBRID)
    assert proc.returncode == 0, proc.stderr
    assert "evaluations/iteration" in proc.stdout and "stopped: train.lbfgs_iterations done" in proc.stdout
    lbfgs = [r for r in records(run) if r["optimizer"] == "lbfgs"]
    assert len(lbfgs) == 6
    for r in lbfgs:
        assert r["dtype"] == "float32" and r["evaluations_per_iteration"] >= 1  # train.dtype's, by default
        assert r["line_search_failures"] >= 0 and r["skipped_pairs"] >= 0
    assert [r.get("stop_reason") for r in lbfgs] == [None] * 5 + ["train.lbfgs_iterations done"]
    # Each iteration re-evaluates nothing the line search already evaluated: the first
    # iteration costs its own start plus the line search, later ones the line search alone.
    assert lbfgs[0]["evaluations_per_iteration"] >= 2
    assert sum(r["evaluations_per_iteration"] for r in lbfgs[1:]) < 2 * 5
    # A converged stop says which test ended it.
    proc = run_cli("train", POISSON, "--out", str(tmp_path / "tol"), *HYBRID, "--set", "train.lbfgs_tolerance_grad=10")
    assert proc.returncode == 0, proc.stderr
    assert "stopped: gradient below train.lbfgs_tolerance_grad" in proc.stdout
    assert records(tmp_path / "tol")[-1]["stop_reason"] == "gradient below train.lbfgs_tolerance_grad"


def test_objective_reuses_its_last_evaluation_only_at_the_same_point():
    torch.manual_seed(0)
    w = torch.randn(5, dtype=torch.float64, requires_grad=True)
    data = torch.randn(8, 5, dtype=torch.float64)
    calls = []

    def local_sum(idx):
        calls.append(len(idx))
        return ((data[idx] @ w) ** 2).sum()

    f = GlobalObjective([w], local_sum, SerialCommunicator(), chunk=8)
    idx = np.arange(8)
    loss, g = f(idx)
    again, g2 = f(idx)
    assert (again, f.evaluations, f.reused) == (loss, 1, 1) and torch.equal(g, g2) and torch.equal(w.grad, g)
    f(idx[:4])  # other indices: evaluated
    f.assign(f.flat() + 1e-3)  # another point: evaluated
    f(idx)
    assert f.evaluations == 3 and len(calls) == 3


@pytest.mark.needs_mpiexec
@pytest.mark.timeout(300)
@pytest.mark.slow
def test_float64_phase_does_not_depend_on_p(tmp_path):
    """10 float64 L-BFGS iterations of a float32 run from the same start: P = 2 equals P = 1 to 1e-9."""
    def args(mode, n):
        return ["train", POISSON, "--out", str(tmp_path / f"{mode}-{n}"), *SMALL, "--set", "train.optimizer=lbfgs",
                "--set", f"train.lbfgs_mode={mode}", "--set", "train.lbfgs_iterations=10",
                "--set", "train.lbfgs_overlap=2", "--set", "train.lbfgs_dtype=float64"]

    # P = 1 in this process, P = 2 one MPI job of both modes.
    procs = {(mode, 1): run_cli(*args(mode, 1)) for mode in ("full", "multibatch")}
    procs.update(zip([("full", 2), ("multibatch", 2)], run_cli_jobs(2, args("full", 2), args("multibatch", 2))))
    masters = {}
    for (mode, n), proc in procs.items():
        assert proc.returncode == 0, proc.stderr
        masters[mode, n] = load_checkpoint(tmp_path / f"{mode}-{n}" / "checkpoints" /
                                           "step-00000010.h5").optimizer_state[0]["master"]
    for mode in ("full", "multibatch"):
        ref = masters[mode, 1]
        rel = np.abs(masters[mode, 2] - ref).max() / np.abs(ref).max()
        assert rel < 1e-9, (mode, rel)


def test_an_adam_run_gains_an_lbfgs_finish(tmp_path):
    """Continuing a finished Adam run with train.optimizer = 'adam+lbfgs' runs the L-BFGS phase on its weights."""
    adam = [*SMALL, "--set", "train.epochs=2"]
    run = tmp_path / "run"
    proc = run_cli("train", POISSON, "--out", str(run), *adam)
    assert proc.returncode == 0, proc.stderr
    finish = [*adam, "--set", "train.optimizer=adam+lbfgs", "--set", "train.lbfgs_iterations=3",
              "--set", "train.lbfgs_batch=8"]
    proc = run_cli("train", POISSON, "--out", str(run), *finish)
    assert proc.returncode == 0, proc.stderr
    assert "continuing with a longer schedule: train.optimizer adam -> adam+lbfgs" in proc.stdout
    assert "(4 -> 7 steps)" in proc.stdout and "L-BFGS (full, float32) iteration 3/3" in proc.stdout
    rec = records(run)
    assert [r["optimizer"] for r in rec] == ["adam"] * 4 + ["lbfgs"] * 3
    assert load_checkpoint(run / "checkpoints" / "step-00000007.h5").attrs["optimizer"] == "lbfgs"
    # Once the phase has begun, its settings are fixed (only its length may change) ...
    proc = run_cli("train", POISSON, "--out", str(run), *finish, "--set", "train.lbfgs_history=5")
    assert proc.returncode == 2 and "train.lbfgs_history: the L-BFGS phase of this run began" in proc.stderr
    proc = run_cli("train", POISSON, "--out", str(run), *finish, "--set", "train.lbfgs_iterations=5")
    assert proc.returncode == 0, proc.stderr
    assert "L-BFGS (full, float32) iteration 5/5" in proc.stdout
    # ... and no other optimiser may take over.
    proc = run_cli("train", POISSON, "--out", str(tmp_path / "other"), *adam)
    proc = run_cli("train", POISSON, "--out", str(tmp_path / "other"), *adam, "--set", "train.optimizer=sgd")
    assert proc.returncode == 2 and "may only add an L-BFGS finish ('adam' -> 'adam+lbfgs')" in proc.stderr
