"""The scripts in examples/ run on a tiny trained run, as a user would start from them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import ROOT, child_env


@pytest.fixture(scope="module")
def burgers(tiny_runs):
    return tiny_runs["burgers"]


def _run(script: str, *args: str, cwd) -> subprocess.CompletedProcess:
    env = child_env()
    return subprocess.run([sys.executable, str(ROOT / "examples" / script), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.timeout(300)
def test_evaluate_family(burgers, tmp_path):
    proc = _run("evaluate_family.py", str(burgers), "--samples", "3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip().split()[:1] in (["0"], ["1"], ["2"])]
    assert len(rows) == 3 and all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows)
    assert "mean" in proc.stdout and "Godunov" in proc.stdout


@pytest.mark.timeout(120)
def test_sweep_plot(burgers, tmp_path):
    proc = _run("sweep_plot.py", str(burgers), "--out", str(tmp_path / "sweep.png"), "--count", "6", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "for 6 values of c in [3, 6]" in proc.stdout
