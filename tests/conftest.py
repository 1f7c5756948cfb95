"""Shared helpers: run the CLI in a subprocess, as a user would."""

from __future__ import annotations

import math
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
    from deepfusion.configuration.wiring import build_model, build_problem

    cfg = load_config(run_dir / "config.toml")
    problem = build_problem(cfg)
    model = build_model(cfg, problem)
    points = math.prod(problem.resolution)
    terms = []
    for layer in model.modules():
        if isinstance(layer, torch.nn.modules.conv._ConvNd):
            terms.append(layer.in_channels // layer.groups * math.prod(layer.kernel_size))
        elif isinstance(layer, torch.nn.GroupNorm):
            terms.append(layer.num_channels // layer.num_groups * points)
    return _MARGIN32 * 2 * sum(math.sqrt(n) for n in terms) * UNIT32 * scale


@pytest.fixture(scope="session", autouse=True)
def reference_cache(tmp_path_factory):
    """One reference cache for the session (deepfusion.analysis.reference_cache): the many small runs
    that evaluate the same family, grid and held-out instances solve their references once. In a
    temporary directory, so no entry outlives the session's code; the children inherit it."""
    from deepfusion.analysis.reference_cache import ENV

    before = os.environ.get(ENV)
    os.environ[ENV] = str(tmp_path_factory.mktemp("reference-cache"))
    yield os.environ[ENV]
    if before is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = before


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child process of a test: this checkout importable first, plus ``extra``."""
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 300,
            ranks: int | None = None, path: Sequence[Path] = ()) -> subprocess.CompletedProcess:
    """``python -m deepfusion ARGS`` in a fresh interpreter (under ``mpiexec -n ranks`` when
    ``ranks`` is given; the caller skips without one), with ``path`` importable too (a user's
    family module); output captured as text."""
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


def train_once(tmp_path_factory, config: str, name: str, *args: str) -> tuple[Path, str]:
    """Train ``config`` into a fresh temporary run directory; (run directory, stdout)."""
    run_dir = tmp_path_factory.mktemp("run") / name
    proc = run_cli("train", config, "--out", str(run_dir), *args)
    assert proc.returncode == 0, proc.stderr
    return run_dir, proc.stdout


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory) -> dict[str, Path]:
    """Two tiny trained runs, Burgers and Poisson at 16^2 (two epochs, no plots), trained once per session
    for the tests that only read a run (the API, the examples, bad input): {"burgers": dir, "poisson": dir}.
    Tests must not write into them."""
    quiet = ["--set", "train.epochs=2", "--set", "output.plots=false"]
    burgers, _ = train_once(tmp_path_factory, str(ROOT / "configs" / "burgers.toml"), "burgers", *TINY, *quiet,
                            "--set", "burgers.test_c=[4.1]")
    poisson, _ = train_once(tmp_path_factory, str(ROOT / "configs" / "poisson.toml"), "poisson",
                            *tiny("poisson.toml"), *quiet, "--set", "data.n_test=2")
    return {"burgers": burgers, "poisson": poisson}


@pytest.fixture
def cli():
    return run_cli


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
