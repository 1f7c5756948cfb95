"""Distributed L-BFGS: two-loop recursion, convergence, P-independence under mpiexec, checkpoint and resume (the
phase after Adam: deepfusion/training/lbfgs_phase.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from helpers import ROOT, TINY_POISSON, run_cli, run_cli_jobs
from deepfusion.files.checkpoint import load_checkpoint
from deepfusion.parallel.comm import SerialCommunicator
from deepfusion.parallel.runtime import find_mpiexec
from deepfusion.training.lbfgs import GlobalObjective, MultiBatchLBFGS, multibatch_indices, two_loop

POISSON = str(ROOT / "configs" / "poisson.toml")
# A few-second Poisson run on 16 x 16 nodes in float64.
SMALL = [*TINY_POISSON, "--set", "train.dtype=float64"]


def test_two_loop_satisfies_the_secant_equation():
    rng = np.random.default_rng(0)
    A = torch.as_tensor(rng.normal(size=(6, 6)))
    A = A @ A.T + 6 * torch.eye(6, dtype=torch.float64)
    s_hist = [torch.as_tensor(rng.normal(size=6)) for _ in range(4)]
    y_hist = [A @ s for s in s_hist]
    # H y_k = s_k for the newest pair (the BFGS update is built to satisfy it).
    np.testing.assert_allclose(two_loop(y_hist[-1], s_hist, y_hist), s_hist[-1], rtol=1e-10, atol=1e-12)
    g = torch.as_tensor(rng.normal(size=6))
    assert float(g.dot(two_loop(g, s_hist, y_hist))) > 0  # H stays positive definite
    np.testing.assert_array_equal(two_loop(g, [], []), g)


def _rosenbrock_objective(x: torch.Tensor) -> GlobalObjective:
    """Extended Rosenbrock, one 'sample' per term: l_i = 100 (x_{2i+1} - x_{2i}^2)^2 + (1 - x_{2i})^2."""

    def local_sum(idx: np.ndarray) -> torch.Tensor:
        i = torch.as_tensor(idx, dtype=torch.long)
        a, b = x[2 * i], x[2 * i + 1]
        return (100 * (b - a * a) ** 2 + (1 - a) ** 2).sum()

    return GlobalObjective([x], local_sum, SerialCommunicator(), chunk=3)


def test_full_batch_lbfgs_converges_on_rosenbrock():
    x = torch.tensor([-1.2, 1.0] * 5, dtype=torch.float64, requires_grad=True)
    objective = _rosenbrock_objective(x)
    opt = torch.optim.LBFGS([x], lr=1, max_iter=1, max_eval=20, history_size=10, line_search_fn="strong_wolfe",
                            tolerance_grad=1e-12, tolerance_change=0)
    idx = np.arange(5)

    def closure():
        return torch.tensor(objective(idx)[0])

    for _ in range(200):
        opt.step(closure)
    np.testing.assert_allclose(x.detach().numpy(), 1.0, atol=1e-6)
    assert objective(idx, grad=False)[0] < 1e-12


def test_multibatch_lbfgs_converges_on_a_consistent_least_squares_problem():
    rng = np.random.default_rng(1)
    X = torch.as_tensor(rng.normal(size=(256, 5)))
    w_star = torch.as_tensor(rng.normal(size=5))
    y = X @ w_star
    w = torch.zeros(5, dtype=torch.float64, requires_grad=True)

    def local_sum(idx):
        i = torch.as_tensor(idx, dtype=torch.long)
        return 0.5 * ((X[i] @ w - y[i]) ** 2).sum()

    objective = GlobalObjective([w], local_sum, SerialCommunicator(), chunk=64)
    opt = MultiBatchLBFGS(objective, history=5, overlap=16)
    order = np.random.default_rng(2).permutation(256)
    for k in range(40):
        stats = opt.step(multibatch_indices(order, k, 64, 16))
    np.testing.assert_allclose(w.detach().numpy(), w_star.numpy(), atol=1e-8)
    assert stats["pairs"] == 5 and opt.skipped_pairs == 0


def test_multibatch_batches_overlap():
    order = np.arange(100)[::-1].copy()
    b0, b1 = multibatch_indices(order, 0, 20, 5), multibatch_indices(order, 1, 20, 5)
    np.testing.assert_array_equal(b0[-5:], b1[:5])
    assert len(set(b0) | set(b1)) == 35
    np.testing.assert_array_equal(multibatch_indices(order, 6, 20, 5)[-10:], order[:10])  # wraps around


@pytest.mark.parametrize("mode", ["full", "multibatch"])
def test_checkpointed_lbfgs_run_resumes_to_the_same_iterates(tmp_path, mode):
    import shutil

    args = [*SMALL, "--set", "train.optimizer=adam+lbfgs", "--set", "train.epochs=2", "--set",
            f"train.lbfgs_mode={mode}", "--set", "train.lbfgs_iterations=6", "--set", "train.checkpoint_every=2",
            "--set", "train.lbfgs_overlap=2"]
    run = tmp_path / "run"
    proc = run_cli("train", POISSON, "--out", str(run), *args)
    assert proc.returncode == 0, proc.stderr
    assert f"L-BFGS ({mode}, float64) iteration 6/6" in proc.stdout
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    lbfgs = [r for r in records if r["optimizer"] == "lbfgs"]
    assert len(lbfgs) == 6 and lbfgs[-1]["loss"] < records[0]["loss"]
    final = load_checkpoint(run / "checkpoints" / "step-00000010.h5")
    assert final.attrs["optimizer"] == "lbfgs" and final.optimizer_state[0]
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    for step in (8, 10):  # as if the job died just after step 6, mid-L-BFGS
        (copy / "checkpoints" / f"step-{step:08d}.h5").unlink()
    proc = run_cli("train", POISSON, "--out", str(copy), *args, "--resume")
    assert proc.returncode == 0, proc.stderr
    assert "(step 6)" in proc.stdout
    again = load_checkpoint(copy / "checkpoints" / "step-00000010.h5")
    for name, value in final.model.items():
        np.testing.assert_array_equal(again.model[name], value, err_msg=name)


def test_bad_lbfgs_config(tmp_path):
    proc = run_cli("train", POISSON, "--out", str(tmp_path / "r"), *SMALL, "--set", "train.optimizer=lbfgs",
                   "--set", "train.lbfgs_mode=multibatch", "--set", "train.lbfgs_overlap=4")
    assert proc.returncode == 2 and "train.lbfgs_overlap" in proc.stderr
    proc = run_cli("train", POISSON, "--out", str(tmp_path / "r"), *SMALL, "--set", "train.optimizer=rmsprop")
    assert proc.returncode == 2 and "train.optimizer" in proc.stderr


MPIEXEC = find_mpiexec()


@pytest.mark.needs_mpiexec
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lbfgs_iterates_do_not_depend_on_p(tmp_path):
    """10 L-BFGS iterations from the same start: P = 2 and 4 match P = 1 to 1e-6 (float64).

    Every iteration also compares the parameters' SHA-1 across ranks; a difference would
    end the run with status 3, so status 0 means the ranks stayed bitwise identical.
    """
    def args(mode, n):
        return ["train", POISSON, "--out", str(tmp_path / f"{mode}-{n}"), *SMALL, "--set", "train.optimizer=lbfgs",
                "--set", f"train.lbfgs_mode={mode}", "--set", "train.lbfgs_iterations=10",
                "--set", "train.lbfgs_overlap=2"]

    # P = 1 in this process; P = 2 (both modes) and P = 4 (full batch) one MPI job each.
    procs = {(mode, 1): run_cli(*args(mode, 1)) for mode in ("full", "multibatch")}
    procs.update(zip([("full", 2), ("multibatch", 2)], run_cli_jobs(2, args("full", 2), args("multibatch", 2))))
    procs["full", 4], = run_cli_jobs(4, args("full", 4))
    finals = {}
    for (mode, n), proc in procs.items():
        assert proc.returncode == 0, proc.stderr
        finals[mode, n] = load_checkpoint(tmp_path / f"{mode}-{n}" / "checkpoints" / "step-00000010.h5").model
    for mode, n in [("full", 2), ("full", 4), ("multibatch", 2)]:
        for name, ref in finals[mode, 1].items():
            rel = np.abs(finals[mode, n][name] - ref).max() / max(np.abs(ref).max(), 1e-300)
            assert rel < 1e-6, (mode, n, name, rel)
