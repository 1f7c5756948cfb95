"""The suite's fixtures and hooks: one reference cache per session, two tiny trained runs shared by the tests that
only read a run, and the cost rule (a test over SLOW_S seconds not marked slow is named in the summary).

tests/ mirrors the code: science/ (diffnet), engine/ (deepfusion's subsystems), end_to_end/ (what a user runs);
each folder's conftest.py says what it holds. Shared helpers are in tests/helpers.py; mpi_scripts/ holds the
programs the MPI tests launch, data/ their fixed inputs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import ROOT, TINY, run_cli, tiny, train_once

_SHARED_CACHE = "DEEPFUSION_TESTS_REFERENCE_CACHE"  # a test session's cache, handed to the test sessions it starts


@pytest.fixture(scope="session", autouse=True)
def reference_cache(tmp_path_factory):
    """One reference cache for the session (deepfusion.analysis.reference_cache): the many small runs
    that evaluate the same family, grid and held-out instances solve their references once. In a
    temporary directory, so no entry outlives the session's code; the children inherit it, and a
    test session started by a test (the float32 guard) uses its parent's."""
    from deepfusion.analysis.reference_cache import ENV

    before = {name: os.environ.get(name) for name in (ENV, _SHARED_CACHE)}
    # Under xdist the workers share one (its entries are written atomically): each truth is solved once per session.
    shared = tmp_path_factory.getbasetemp().parent / "reference-cache" if os.environ.get("PYTEST_XDIST_WORKER") else None
    if shared is not None:
        shared.mkdir(exist_ok=True)
    os.environ[ENV] = os.environ[_SHARED_CACHE] = (before[_SHARED_CACHE] or str(shared or tmp_path_factory.mktemp(
        "reference-cache")))
    yield os.environ[ENV]
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory) -> dict[str, Path]:
    """Two tiny trained runs, Burgers and Poisson at 16^2 (two epochs, no plots), trained once per session
    for the tests that only read a run (the API, the examples, bad input): {"burgers": dir, "poisson": dir}.
    Tests must not write into them."""
    quiet = ["--set", "train.epochs=2", "--set", "output.plots=false"]
    commands = {"burgers": [str(ROOT / "configs" / "burgers.toml"), *TINY, *quiet, "--set", "burgers.test_c=[4.1]"],
                "poisson": [str(ROOT / "configs" / "poisson.toml"), *tiny("poisson.toml"), *quiet,
                            "--set", "data.n_test=2"]}
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return {name: train_once(tmp_path_factory, args[0], name, *args[1:])[0] for name, args in commands.items()}
    # Under xdist the first worker to ask trains them, the others wait on the lock and read them.
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent / "tiny-runs"
    shared.mkdir(exist_ok=True)
    with FileLock(shared / "lock"):
        for name, args in commands.items():
            if not (shared / name / "eval.json").is_file():
                proc = run_cli("train", args[0], "--out", str(shared / name), *args[1:])
                assert proc.returncode == 0, proc.stderr
    return {name: shared / name for name in commands}


@pytest.fixture
def cli():
    return run_cli


# --- the cost rule (DEVELOPING.md) -----------------------------------------------------------------
SLOW_S = 10.0  # a test above this (setup, call and teardown together) runs in the whole suite only: mark it slow
_seconds: dict[str, float] = {}
_slow: set[str] = set()


def pytest_configure(config):
    """Under xdist (DEVELOPING.md) each worker computes on one thread: two workers share the two cores, not four."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    # The one marker of the tests that start mpiexec: skipped, with the reason, where there is none (or none that
    # belongs to mpi4py's MPI).
    launching = [item for item in items if item.get_closest_marker("needs_mpiexec")]
    if launching:
        from deepfusion.parallel.runtime import find_mpiexec, mpiexec_mismatch

        if find_mpiexec() is None:
            skip = pytest.mark.skip(reason=mpiexec_mismatch() or "no mpiexec (install the mpich extra)")
            for item in launching:
                item.add_marker(skip)


def pytest_runtest_logreport(report):
    # Read off the report, not the collection: under xdist the controller collects nothing.
    _seconds[report.nodeid] = _seconds.get(report.nodeid, 0.0) + report.duration
    if "slow" in report.keywords:
        _slow.add(report.nodeid)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Name the tests that took more than SLOW_S and are not marked slow (a report, never a failure:
    a test's outcome must not depend on the machine's speed)."""
    unmarked = sorted(((t, n) for n, t in _seconds.items() if t > SLOW_S and n not in _slow), reverse=True)
    if unmarked:
        terminalreporter.write_sep("-", f"over {SLOW_S:g} s and not marked slow: mark them or make them smaller")
        for seconds, nodeid in unmarked:
            terminalreporter.write_line(f"{seconds:7.1f}s {nodeid}")
