"""Multi-rank behaviour under a real mpiexec (2 ranks, and 4 oversubscribed on 2 cores)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from helpers import ROOT, TINY, child_env, run_cli, run_cli_jobs
from deepfusion.files.checkpoint import load_checkpoint
from deepfusion.parallel.runtime import find_mpiexec

SCRIPTS = ROOT / "tests" / "mpi_scripts"
CONFIG = str(ROOT / "configs" / "burgers.toml")


MPIEXEC = find_mpiexec()
pytestmark = [
    pytest.mark.needs_mpiexec,
]


def mpirun(n: int, *args: str, timeout: float = 180, **extra_env: str) -> subprocess.CompletedProcess:
    env = child_env(**extra_env)
    return subprocess.run(
        [MPIEXEC, "-n", str(n), *args], env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize("n, nodes", [(2, 1), pytest.param(4, 1, marks=pytest.mark.slow),
                                      pytest.param(4, 2, marks=pytest.mark.slow)])
@pytest.mark.timeout(200)
def test_allreduced_gradient_equals_serial(n, nodes):
    # MPICH splits one machine's ranks into "nodes" (cliques) on request: their own shared-memory
    # groups, the inter-node path between them, so the node-by-node sum runs for real.
    proc = mpirun(n, sys.executable, str(SCRIPTS / "gradients.py"), MPIR_CVAR_NUM_CLIQUES=str(nodes))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("OK ") == 15, proc.stdout  # printed once, by rank 0
    assert proc.stdout.count("transport=staged") == 3 and proc.stdout.count("transport=mpi") == 3
    assert proc.stdout.count("transport=hierarchical") == 6


@pytest.mark.timeout(60)
def test_failure_on_one_rank_ends_the_job():
    proc = mpirun(2, sys.executable, str(SCRIPTS / "fail_one_rank.py"), timeout=45)  # no hang: it ends
    assert proc.returncode != 0
    assert "error on rank 1" in proc.stderr and "injected failure on rank 1" in proc.stderr


def _train(n: int, out: Path, *extra: str) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "deepfusion", "train", CONFIG, "--out", str(out), *_tiny(extra)]
    return mpirun(n, *args)


def _tiny(extra) -> list[str]:
    return [*TINY, "--set", "data.n_train=16", "--set", "train.batch_size=8", "--set", "train.epochs=10",
            "--set", "output.plots=false", "--set", "burgers.test_c=[4.1]", *extra]


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_same_trajectory_for_any_p(tmp_path):
    # 20 Adam steps of batch 8 (4 per rank at P = 2, 2 per rank at P = 4). P = 1 in this process;
    # P = 2 and P = 4 each one MPI job of several runs (conftest.run_cli_jobs).
    dtypes = ("float64", "float32")
    runs = {(dtype, n): ["train", CONFIG, "--out", str(tmp_path / f"{dtype}-{n}"), *_tiny(["--set", f"train.dtype={dtype}"])]
            for n in (1, 2, 4) for dtype in dtypes}
    # Activation checkpointing on two ranks with many small buckets: recomputation must
    # not disturb the bucketed reduction, whose hooks then fire during the recomputed
    # backward.
    runs["float64", "2c"] = ["train", CONFIG, "--out", str(tmp_path / "float64-2-checkpointed"),
                             *_tiny(["--set", "train.dtype=float64", "--set", "model.checkpoint_activations=true",
                                     "--set", "parallel.bucket_mb=0.01"])]
    procs = {key: run_cli(*runs[key]) for key in [(d, 1) for d in dtypes]}
    for n, keys in ((2, [("float64", 2), ("float32", 2), ("float64", "2c")]), (4, [(d, 4) for d in dtypes])):
        procs.update(zip(keys, run_cli_jobs(n, *(runs[k] for k in keys))))
    finals, preds = {}, {}
    for (dtype, n), proc in procs.items():
        out = Path(runs[dtype, n][3])
        ranks = 2 if n == "2c" else n
        assert proc.returncode == 0, proc.stderr
        assert f"ranks {ranks} x 1 threads" in proc.stdout
        assert proc.stdout.count("deepfusion: training") == 1  # rank 0 alone prints
        finals[dtype, n] = load_checkpoint(out / "checkpoints" / "step-00000020.h5").model
        with h5py.File(out / "test_prediction.h5") as f:
            preds[dtype, n] = f["u"][()]
        records = (out / "metrics.jsonl").read_text().splitlines()
        assert f'"ranks": {ranks}' in records[-1]
    for n in (2, 4, "2c"):
        for name, ref in finals["float64", 1].items():
            got = finals["float64", n][name]
            rel = np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-300)
            assert rel < 1e-9, (n, name, rel)
    # float32 on other P: the same sums in another order, then Adam's division by sqrt(v) turns the
    # rounding of near-zero gradient entries into whole steps, for 20 steps. The bound is loose on
    # purpose (nothing wildly off: a wrong reduction is off by O(1)); the float64 case is the claim.
    for n in (2, 4):
        scale = np.abs(preds["float32", 1]).max()
        assert np.abs(preds["float32", n] - preds["float32", 1]).max() / scale < 1e-4


@pytest.mark.timeout(120)
def test_bad_config_under_mpi_reported_once_status_2(tmp_path):
    proc = _train(2, tmp_path / "r", "--set", "burgers.viscosity=-1")
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == [lines[0]] and "burgers.viscosity" in lines[0]
    assert not (tmp_path / "r").exists()


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory) -> dict:
    """One job of 3 ranks (conftest.run_cli_jobs) for the two batch-against-ranks cases: a global batch
    of 2 (smaller than the ranks) and one of 8 (not divisible by them)."""
    work = tmp_path_factory.mktemp("three")
    small, uneven = run_cli_jobs(3, ["train", CONFIG, "--out", str(work / "small"), *_tiny(["--set", "train.batch_size=2"])],
                                 ["train", CONFIG, "--out", str(work / "uneven"), *_tiny(["--set", "train.epochs=1"])],
                                 timeout=150)
    return {"small": (small, work / "small"), "uneven": (uneven, work / "uneven")}


@pytest.mark.timeout(200)
@pytest.mark.slow
def test_batch_smaller_than_ranks_refused_before_writing(three_ranks):
    proc, out = three_ranks["small"]
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "smaller than the 3 ranks" in lines[0], proc.stderr
    assert not out.exists()


@pytest.mark.timeout(200)
@pytest.mark.slow
def test_batch_not_divisible_warns(three_ranks):
    proc, out = three_ranks["uneven"]
    assert proc.returncode == 0, proc.stderr
    assert "not divisible by 3 ranks; each step uses 6 samples (2 per rank)" in proc.stderr
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["ranks"] == 3
