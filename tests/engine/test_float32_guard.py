"""The float32 rounding bounds hold under a second set of oneDNN kernels, not only this machine's.

Every test marked ``float32`` compares a float32 result to a bound from the arithmetic. oneDNN
picks its kernels per CPU (an AMD EPYC and an Intel Xeon with AVX-512 differ, and both differ from
an AVX2 machine), so a bound that was tuned on one machine can fail on a user's. Rerunning those
tests with ``ONEDNN_MAX_CPU_ISA`` capped at another instruction set changes the kernels here, and
catches such a bound on any one machine.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, child_env, second_isa


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_float32_bounds_hold_under_a_second_isa_cap():
    isa = second_isa()
    env = child_env(ONEDNN_MAX_CPU_ISA=isa)
    # The cap reaches oneDNN (its verbose mode names the instruction set it dispatches to).
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; torch.nn.functional.conv2d(torch.rand(2, 8, 64, 64), torch.rand(8, 8, 3, 3))"],
        env=dict(env, ONEDNN_VERBOSE="1"), capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    line = next(s for s in probe.stdout.splitlines() if ",isa:" in s)
    assert {"AVX2": "AVX2", "SSE41": "SSE4.1"}[isa] in line and "AVX-512" not in line, line
    # The files that mark tests float32 (collecting only those saves importing the rest); the child
    # session shares this session's reference cache (conftest.reference_cache).
    files = [str(f) for f in sorted((ROOT / "tests").rglob("test_*.py"))
             if f.name != Path(__file__).name and "mark.float32" in f.read_text()]
    assert len(files) >= 5, files
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "float32",
                           "-o", "addopts=", *files],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=840)
    assert proc.returncode == 0, f"under ONEDNN_MAX_CPU_ISA={isa}:\n" + proc.stdout[-6000:] + proc.stderr[-2000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert "failed" not in summary and " passed" in summary, summary
