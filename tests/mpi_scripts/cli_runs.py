"""Several ``deepfusion`` commands in one MPI job (tests/helpers.py's ``run_cli_jobs``).

Run under mpiexec with a JSON file of argument lists and the path of a JSON report: every rank
runs ``deepfusion.cli.main`` on each list in turn, as ``mpiexec -n P deepfusion ARGS`` would, its
standard output and error captured per command; rank 0 writes, per command, the largest status of
any rank and the ranks' output in rank order. A job pays the interpreters' start and torch's import
once for all its commands instead of once per command.
"""

import contextlib
import io
import json
import sys
import traceback
from pathlib import Path

from deepfusion.cli import main
from deepfusion.parallel.comm import world


def run(args: list[str]) -> dict:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(args)
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
        except Exception:  # noqa: BLE001 - as the interpreter would end: the traceback, status 1
            traceback.print_exc()
            status = 1
    return {"status": int(status), "stdout": out.getvalue(), "stderr": err.getvalue()}


if __name__ == "__main__":
    commands = json.loads(Path(sys.argv[1]).read_text())
    comm = world()
    mine = []
    for args in commands:
        mine.append(run(args))
        comm.barrier()  # the next command starts on every rank together, as a new job would
    every = comm.allgather(mine)
    if comm.rank == 0:
        report = [{"status": max(rank[i]["status"] for rank in every),
                   "stdout": "".join(rank[i]["stdout"] for rank in every),
                   "stderr": "".join(rank[i]["stderr"] for rank in every)} for i in range(len(commands))]
        Path(sys.argv[2]).write_text(json.dumps(report))
