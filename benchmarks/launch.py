"""Launching ``deepfusion train`` from a benchmark script, on one rank or under the venv's ``mpiexec``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def train_run(config: str | Path, out: Path, ranks: int, overrides: list[str]) -> None:
    """Train ``config`` into ``out`` with ``--set`` ``overrides`` on ``ranks`` ranks; its output goes to stderr,
    so the benchmark's stdout stays one JSON object. Exits with a message when ranks > 1 and no mpiexec is found."""
    from deepfusion.runtime import find_mpiexec

    cmd = [sys.executable, "-m", "deepfusion", "train", str(config), "--out", str(out)]
    if ranks > 1:
        mpiexec = find_mpiexec()
        if mpiexec is None:
            sys.exit(f"{Path(sys.argv[0]).name}: --ranks > 1 needs mpiexec (pip install mpich)")
        cmd = [mpiexec, "-n", str(ranks), *cmd]
    for item in overrides:
        cmd += ["--set", item]
    print(f"$ {' '.join(cmd)}", file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, stdout=sys.stderr, cwd=ROOT)
