"""Launching from a benchmark script: ``deepfusion train`` on one rank (a process forked from a server
that has imported the libraries once) or under the venv's ``mpiexec``; with a thread count, in a fresh
interpreter with every thread pool sized before it starts."""

from __future__ import annotations

import multiprocessing
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


# What every single-rank run imports before its first step: 2-3 s of interpreter, torch (and its
# compiler stack, which torch.optim pulls in at the first optimizer) and numba/scipy/h5py per run,
# 45 s of the optimizer benchmark's 20 runs on 2 cores. A fork server imports them once;
# each run is then a fresh process forked from it, as clean as a new interpreter (the server runs
# no computation, so no thread pool or kernel cache is inherited).
_PRELOAD = ["numpy", "scipy.sparse", "h5py", "numba", "torch", "torch._dynamo", "deepfusion.cli",
            "deepfusion.commands.train", "deepfusion.configuration.run", "deepfusion.analysis.evaluate"]


def _forked(args: list[str], cwd: str, env: dict, quiet: bool) -> None:
    """``deepfusion ARGS`` in a process forked from the server: its environment, folder and output set first."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sink = os.open(os.devnull, os.O_WRONLY) if quiet else 2
    os.dup2(sink, 1)  # the benchmark's stdout carries its JSON alone
    if quiet:
        os.dup2(sink, 2)
    from deepfusion.cli import main

    status = main(args)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(status)


def train_run(config: str | Path, out: Path, ranks: int, overrides: list[str], *, threads: int | None = None,
              quiet: bool = False, timeout: float | None = None) -> None:
    """Train ``config`` into ``out`` with ``--set`` ``overrides`` on ``ranks`` ranks.

    Its output goes to stderr (or nowhere with ``quiet``), so the benchmark's stdout stays one
    JSON object; ``threads`` sizes each rank's thread pools through the environment. One rank runs
    in a process forked from a server that has imported the libraries (see ``_PRELOAD``), unless
    ``threads`` is given (BLAS and OpenMP read their sizes when they load, so those runs start a fresh
    interpreter, as more ranks do under ``mpiexec``). Raises ``subprocess.CalledProcessError`` when
    the run fails.
    """
    args = ["train", str(config), "--out", str(out)]
    for item in overrides:
        args += ["--set", item]
    cmd = [sys.executable, "-m", "deepfusion", *args]
    if ranks > 1:
        cmd = [mpiexec(), "-n", str(ranks), *cmd]
    print(f"$ {' '.join(cmd)}", file=sys.stderr, flush=True)
    if ranks > 1 or threads is not None:
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL if quiet else sys.stderr, cwd=ROOT,
                       env=thread_env(threads), timeout=timeout)
        return
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)
    sys.stderr.flush()
    child = context.Process(target=_forked, args=(args, str(ROOT), thread_env(threads), quiet))
    child.start()
    child.join(timeout)
    if child.exitcode is None:
        child.kill()
        child.join()
        raise subprocess.TimeoutExpired(cmd, timeout)
    if child.exitcode != 0:
        raise subprocess.CalledProcessError(child.exitcode, cmd)
