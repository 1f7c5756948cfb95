"""What the tests share: the repository root, small training settings, running the CLI as a user would (a
subprocess, or in process), float32 bounds. Imported by name (``from helpers import run_cli``); the fixtures and
the suite's hooks are in tests/conftest.py."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

# A training run that takes a few seconds: 16 x 16 nodes, a two-level U-Net, one grid (the
# shipped configs train multigrid; tests/end_to_end/test_multigrid.py covers that), the Sobel residual.
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



# The plain generator and loss: the Q1 configs ship the coarse correction, the preconditioned loss and a
# second stage (docs/results.md, issue 53); the tests of the engine's other parts train without them
# (tests/methods/test_coarse.py, test_preconditioned.py and test_stages.py train with them).
PLAIN = [
    "--set", "model.coarse_correction=0",
    "--set", "model.sweeps=0",
    "--set", "train.loss=family",
    "--set", "train.second_stage_epochs=0",
]


def tiny(config: str) -> list[str]:
    """TINY for a shipped config, plain (PLAIN): the Sobel residual is a Burgers key, refused by the other families."""
    return TINY if Path(config).name.startswith("burgers") else [*TINY[2:], *PLAIN]


# A few-second Poisson run for the optimiser tests: 16 x 16 nodes, one grid, 16 instances.
TINY_POISSON = [
    *PLAIN,
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


UNIT32 = 2.0**-24  # float32's unit roundoff
_MARGIN32 = 4.0  # the probabilistic bound below is an estimate, not a guarantee


def float32_atol(run_dir: Path, scale: float = 1.0) -> float:
    """How far two float32 evaluations of the run's network may differ, for fields of size ``scale``.

    Inference at another batch shape, chunking, thread count or number of ranks is another float32
    computation, not the same one: oneDNN picks its kernels, and so its summation order, per shape
    and per CPU (AMD EPYC with AVX-512, the Intel machines and ``ONEDNN_MAX_CPU_ISA`` caps all
    differ). A sum of n float32 terms rounded in any order lies within about sqrt(n) u of its exact
    value, relative to the terms' size (Higham & Mary's probabilistic bound, u = 2**-24): every
    convolution sums its fan-in, every GroupNorm its group's channels times the grid's points. The
    layers' errors add (the normalised layers pass them on at about unit gain); two evaluations
    lie twice that apart, and a margin of 4 covers the estimate.
    """
    import torch

    from deepfusion.configuration.config import load_config
    from deepfusion.configuration.run import Run

    run = Run.from_config(load_config(run_dir / "config.toml"))
    problem, model = run.family, run.build_model()
    points = math.prod(problem.resolution)
    terms = []
    for layer in model.modules():
        if isinstance(layer, torch.nn.modules.conv._ConvNd):
            terms.append(layer.in_channels // layer.groups * math.prod(layer.kernel_size))
        elif isinstance(layer, torch.nn.GroupNorm):
            terms.append(layer.num_channels // layer.num_groups * points)
    return _MARGIN32 * 2 * sum(math.sqrt(n) for n in terms) * UNIT32 * scale


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child process of a test: this checkout importable first, plus ``extra``."""
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 300, ranks: int | None = None,
            path: Sequence[Path] = (), process: bool = False) -> subprocess.CompletedProcess:
    """The command line ``deepfusion ARGS``, its status and output captured as text.

    By default it runs in this interpreter (:func:`in_process`): the CLI's own ``main``, as the
    console script calls it, without paying a fresh interpreter, torch's import and numba's cache
    load again for every call. With ``ranks`` (under ``mpiexec -n ranks``; the caller skips without
    one) or ``process=True`` it runs as ``python -m deepfusion ARGS`` in a fresh interpreter, for the
    tests where the process is the point (signals, exit statuses of a job, a launcher, memory caps).
    ``path`` is importable too (a user's family module).
    """
    if ranks is None and not process:
        return in_process(*args, cwd=cwd, path=path)
    from deepfusion.parallel.runtime import find_mpiexec

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


def run_cli_jobs(ranks: int, *commands: Sequence[str], timeout: float = 300,
                 path: Sequence[Path] = ()) -> list[subprocess.CompletedProcess]:
    """The commands ``deepfusion ARGS`` one after another in ONE job of ``ranks`` MPI ranks
    (tests/mpi_scripts/cli_runs.py), each as ``mpiexec -n ranks deepfusion ARGS`` would report it:
    the largest status of any rank, the ranks' output. The job's start (interpreters, torch, MPI) is
    paid once instead of once per command; the caller skips without mpiexec."""
    import json
    import tempfile

    from deepfusion.parallel.runtime import find_mpiexec

    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([*map(str, path), env["PYTHONPATH"]])
    with tempfile.TemporaryDirectory() as work:
        listing, report = Path(work) / "commands.json", Path(work) / "report.json"
        listing.write_text(json.dumps([[str(a) for a in c] for c in commands]))
        proc = subprocess.run([find_mpiexec(), "-n", str(ranks), sys.executable, str(ROOT / "tests" / "mpi_scripts" /
                               "cli_runs.py"), str(listing), str(report)], env=env, capture_output=True, text=True,
                              timeout=timeout)
        assert proc.returncode == 0 and report.is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
        return [subprocess.CompletedProcess(["mpiexec", "-n", str(ranks), "deepfusion", *map(str, c)], r["status"],
                                            r["stdout"], r["stderr"])
                for c, r in zip(commands, json.loads(report.read_text()))]


def _forget_modules(path: Sequence[Path]) -> None:
    """Drop the modules and packages that live at the top of the folders ``path`` from the import
    system, so the next import reads the files there now."""
    names = {f.stem if f.suffix == ".py" else f.name for folder in path for f in Path(folder).iterdir()
             if f.suffix == ".py" or (f / "__init__.py").is_file()}
    for name in list(sys.modules):
        if name.partition(".")[0] in names:
            del sys.modules[name]


def in_process(*args: str, cwd: Path | None = None, path: Sequence[Path] = ()) -> subprocess.CompletedProcess:
    """``deepfusion.cli.main(ARGS)`` in this interpreter, as a finished process would report it.

    Its standard output and error are captured; an exception it lets through becomes status 1
    with the traceback on the captured standard error, as the interpreter would end. What a
    command sets for its own process is put back afterwards: the working directory, the
    environment (``OMP_NUM_THREADS``), torch's thread count, default dtype and random state,
    numpy's random state, the signal handlers, warning filters, and the modules imported from
    ``path`` (another test may write another module of the same name).
    """
    import contextlib
    import io
    import signal
    import traceback
    import warnings

    import numpy as np
    import torch

    from deepfusion.cli import main

    out, err = io.StringIO(), io.StringIO()
    here, environ = os.getcwd(), dict(os.environ)
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    torch_rng, numpy_rng = torch.get_rng_state(), np.random.get_state()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    extra = [str(p) for p in path]
    _forget_modules(path)  # an earlier test's module of the same name must not stand in for this one's
    sys.path[:0] = extra
    try:
        if cwd is not None:
            os.chdir(cwd)
        with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main([str(a) for a in args])
            except SystemExit as exc:
                status = exc.code if isinstance(exc.code, int) else (exc.code is not None)
                if isinstance(exc.code, str):
                    print(exc.code, file=sys.stderr)
            except Exception:  # noqa: BLE001 - what the interpreter would print before exiting with 1
                traceback.print_exc()
                status = 1
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(environ)
        torch.set_num_threads(threads)
        torch.set_default_dtype(dtype)
        torch.set_rng_state(torch_rng)
        np.random.set_state(numpy_rng)
        for s, handler in handlers.items():
            signal.signal(s, handler)
        for p in extra:
            sys.path.remove(p)
        _forget_modules(path)
    return subprocess.CompletedProcess(["deepfusion", *map(str, args)], int(status), out.getvalue(), err.getvalue())


def train_once(tmp_path_factory, config: str, name: str, *args: str) -> tuple[Path, str]:
    """Train ``config`` into a fresh temporary run directory; (run directory, stdout)."""
    run_dir = tmp_path_factory.mktemp("run") / name
    proc = run_cli("train", config, "--out", str(run_dir), *args)
    assert proc.returncode == 0, proc.stderr
    return run_dir, proc.stdout


def second_isa() -> str:
    """A oneDNN instruction-set cap other than the one this run uses, for ``ONEDNN_MAX_CPU_ISA``.

    Each cap makes oneDNN pick other float32 kernels, so other summation orders: a float32 bound
    that holds under two caps was not tuned to one kernel choice. AVX2 where the run is uncapped on
    an AVX-512 CPU (the EPYC and Xeon machines here), SSE41 otherwise.
    """
    current = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        flags = []
    if current in ("", "ALL", "DEFAULT") and "avx512f" in flags:
        return "AVX2"
    return "SSE41"


def network_like(problem, params: np.ndarray, rng) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The same-grid solution (the floor's field), a start like a trained network's output (a smooth error of
    about 1 % inside and, on a cut domain, arbitrary values on the active nodes outside, where the energy is
    nearly flat), and the nodes the error is measured at."""
    exact = problem.discrete_optimum(params)[0]
    grids = np.meshgrid(*(np.linspace(0, 1, n) for n in problem.resolution), indexing="ij")
    smooth = np.prod([np.sin(np.pi * g) for g in grids], axis=0)
    scale = np.abs(exact).max(axis=tuple(range(1, exact.ndim)), keepdims=True)
    start = exact + 0.01 * scale * smooth * rng.uniform(0.5, 1.5, (len(exact),) + (1,) * (exact.ndim - 1))
    measured = np.ones(exact.shape, dtype=bool)
    if problem.has("domain"):
        measured = problem.domain(params) <= 0
        active = np.stack([problem.discretised(p).active for p in params])
        start = np.where(active, np.where(measured, start, exact + 0.2 * scale * rng.normal(size=exact.shape)), 0.0)
    return exact, start, measured
