"""Launching from a benchmark script: ``deepfusion train`` on one rank or under the venv's ``mpiexec``,
with every thread pool sized before it starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def mpiexec() -> str:
    """The venv's (or the PATH's) mpiexec; exits with a message naming the script when there is none."""
    from deepfusion.parallel.runtime import find_mpiexec

    found = find_mpiexec()
    if found is None:
        sys.exit(f"{Path(sys.argv[0]).name}: this needs mpiexec (pip install mpich)")
    return found


def thread_env(threads: int | None = None, **extra: str) -> dict:
    """The environment for a child process: this checkout importable and, with ``threads``, every
    thread pool (torch/OpenMP, OpenBLAS, MKL) given that count before it starts."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    if threads is not None:
        env.update({k: str(threads) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
    env.update(extra)
    return env


def train_run(config: str | Path, out: Path, ranks: int, overrides: list[str], *, threads: int | None = None,
              quiet: bool = False, timeout: float | None = None) -> None:
    """Train ``config`` into ``out`` with ``--set`` ``overrides`` on ``ranks`` ranks.

    Its output goes to stderr (or nowhere with ``quiet``), so the benchmark's stdout stays one
    JSON object; ``threads`` sizes each rank's thread pools through the environment.
    """
    cmd = [sys.executable, "-m", "deepfusion", "train", str(config), "--out", str(out)]
    if ranks > 1:
        cmd = [mpiexec(), "-n", str(ranks), *cmd]
    for item in overrides:
        cmd += ["--set", item]
    print(f"$ {' '.join(cmd)}", file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL if quiet else sys.stderr, cwd=ROOT,
                   env=thread_env(threads), timeout=timeout)
