"""The benchmark scripts start (argument parsing, imports), use the library rather than the command line,
and the FLOP/s benchmark runs the trainer's own step end to end on a small grid."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if p.name != "launch.py")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_help_runs_and_the_command_line_is_not_imported(script):
    assert "deepfusion.cli" not in script.read_text()
    out = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage:")


def test_flops_benchmark_times_a_training_step(tmp_path):
    out = subprocess.run([sys.executable, str(BENCH / "flops.py"), "--grids", "32", "--batch", "1", "--steps", "1",
                          "--repeats", "1", "--gemm", "256", "--threads", "1"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["gemm_gflops"] > 0
    assert {r["layout"] for r in report["rows"]} == {"contiguous", "channels_last"}
    for row in report["rows"]:
        assert row["grid"] == 32 and row["step_s"] > 0 and row["step_gflop"] > 0
        assert 0 < row["ratio_vs_gemm"] < 2


def test_scaling_benchmark_trains_on_one_two_and_four_ranks(tmp_path):
    from deepfusion.runtime import find_mpiexec

    if find_mpiexec() is None:
        pytest.skip("needs mpiexec (pip install mpich)")
    out = subprocess.run([sys.executable, str(BENCH / "scaling.py"), "--resolutions", "32", "--epochs", "2",
                          "--samples", "8", "--batch", "4"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert [(m["resolution"], m["ranks"]) for m in report["measured"]] == [(32, 1), (32, 2), (32, 4)]
    for m in report["measured"]:
        assert m["strong"]["epoch_s"] > 0 and m["weak"]["epoch_s"] > 0
    assert report["allreduce_fit"]["bandwidth_gb_s"] > 0
