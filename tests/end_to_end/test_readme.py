"""The README is short and its quick start works as written: every command of the quick-start block and
the Python snippet run here, on a tiny config, in a fresh directory."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, TINY, child_env

README = (ROOT / "README.md").read_text()


def _block(language: str, after: str) -> str:
    start = README.index(after)
    match = re.compile(rf"```{language}\n(.*?)```", re.S).search(README, start)
    return match.group(1)


def test_readme_is_short_and_its_links_exist():
    assert len(README.splitlines()) <= 150  # a newcomer's page: the rest lives in docs/
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        assert (ROOT / target).exists(), target


@pytest.mark.needs_mpiexec
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_start_runs_as_written(tmp_path):
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    bindir = Path(sys.executable).parent
    env = child_env(PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    tiny = " ".join(shlex.quote(a) for a in [*TINY, "--set", "train.epochs=2", "--set", "output.plots=false"])
    commands = [line.split("  #")[0].strip() for line in _block("bash", "## Quick start").splitlines()]
    assert len(commands) >= 5
    for command in filter(None, commands):
        if " train " in command:  # the same command on a config small enough for a test
            command = command.replace(" --out ", f" {tiny} --out ")
        proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    assert (tmp_path / "runs" / "burgers" / "new.h5").is_file()
    assert (tmp_path / "runs" / "burgers" / "compare.json").is_file()
    assert (tmp_path / "runs" / "burgers" / "uq.h5").is_file()
    assert "#SBATCH" in (tmp_path / "job.slurm").read_text()
    proc = subprocess.run([sys.executable, "-c", _block("python", "From Python")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("(3, 16, 16) (3.0, 6.0)")
