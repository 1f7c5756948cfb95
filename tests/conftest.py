"""Shared helpers: run the CLI in a subprocess, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A training run that takes a few seconds: 16 x 16 nodes, a two-level U-Net, one grid (the
# shipped configs train multigrid; tests/test_multigrid.py covers that), the Sobel residual.
TINY = [
    "--set", "burgers.residual=sobel",
    "--set", "multigrid.levels=[]",
    "--set", "problem.resolution=[16,16]",
    "--set", "model.channels=[8,16]",
    "--set", "data.n_train=16",
    "--set", "train.batch_size=4",
    "--set", "train.epochs=10",
    "--set", "train.lr=5e-3",
    "--set", "train.log_every=4",
    "--set", "train.checkpoint_every=20",
    "--set", "parallel.threads_per_rank=1",
]



def tiny(config: str) -> list[str]:
    """TINY for a shipped config: the Sobel residual is a Burgers key, refused by the other families."""
    return TINY if Path(config).name.startswith("burgers") else TINY[2:]


# A few-second Poisson run for the optimiser tests: 16 x 16 nodes, one grid, 16 instances.
TINY_POISSON = [
    "--set", "problem.resolution=[16,16]",
    "--set", "multigrid.levels=[]",
    "--set", "model.channels=[4,8]",
    "--set", "data.n_train=16",
    "--set", "data.n_test=2",
    "--set", "train.batch_size=8",
    "--set", "train.log_every=1",
    "--set", "parallel.threads_per_rank=1",
    "--set", "output.plots=false",
]


# Inference at another batch shape, chunking, thread count or number of ranks is another float32
# computation, not the same one: oneDNN picks its convolution kernels per shape and CPU (measured on
# AMD EPYC: 37 instances at once against chunks of 8 differ by one float32 ulp, 6e-8 relative; on
# the Intel machines they happened to agree bitwise). Such fields are compared to float32 rounding:
# 128 ulps (2**-23 each at 1.0) of the fields' O(1) scale, ample for the one to a few ulps seen.
# Bitwise comparisons are kept where the computation is the same (same chunk, threads and P).
FLOAT32_ATOL = 128 * 2.0**-23


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child process of a test: this checkout importable first, plus ``extra``."""
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 300,
            ranks: int | None = None, path: Sequence[Path] = ()) -> subprocess.CompletedProcess:
    """``python -m deepfusion ARGS`` in a fresh interpreter (under ``mpiexec -n ranks`` when
    ``ranks`` is given; the caller skips without one), with ``path`` importable too (a user's
    family module); output captured as text."""
    from deepfusion.runtime import find_mpiexec

    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([*map(str, path), env["PYTHONPATH"]])
    launcher = [] if ranks is None else [find_mpiexec(), "-n", str(ranks)]
    return subprocess.run(
        [*launcher, sys.executable, "-m", "deepfusion", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def train_once(tmp_path_factory, config: str, name: str, *args: str) -> tuple[Path, str]:
    """Train ``config`` into a fresh temporary run directory; (run directory, stdout)."""
    run_dir = tmp_path_factory.mktemp("run") / name
    proc = run_cli("train", config, "--out", str(run_dir), *args)
    assert proc.returncode == 0, proc.stderr
    return run_dir, proc.stdout


@pytest.fixture
def cli():
    return run_cli
