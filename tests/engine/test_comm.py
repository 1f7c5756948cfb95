"""Communicator selection without a launcher, and the serial communicator's identities."""

import numpy as np

from deepfusion.parallel.comm import SerialCommunicator, launched_under_mpi, world


def test_launcher_detection():
    assert not launched_under_mpi({})
    assert launched_under_mpi({"PMI_SIZE": "2", "PMI_RANK": "0"})
    assert launched_under_mpi({"OMPI_COMM_WORLD_SIZE": "4"})
    assert not launched_under_mpi({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"})  # a plain batch script
    assert launched_under_mpi({"SLURM_PROCID": "1", "SLURM_NTASKS": "8"})


def test_serial_world_without_launcher(monkeypatch):
    for var in ("PMI_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    comm = world()
    assert isinstance(comm, SerialCommunicator) and (comm.rank, comm.size) == (0, 1)
    buf = np.arange(4.0)
    assert comm.allreduce_(buf) is buf and buf.tolist() == [0, 1, 2, 3]
    assert comm.allgather("x") == ["x"]


def test_watchdog_ends_the_process_when_a_collective_overstays():
    import subprocess
    import sys

    # An abort that does nothing (as if MPI_Abort could not get through): the hard exit still ends it
    # (status 4; left alone the child would sleep out its 60 s and end with 0).
    code = ("import time\nfrom deepfusion.parallel.watchdog import Watchdog\n"
            "dog = Watchdog(1.0, 1, abort=lambda status: None)\ndog.where = 'step 7'\n"
            "dog.arm('an Allreduce'); dog.disarm()\n"  # a collective that returned in time
            "time.sleep(1.5)\ndog.arm('the gradient sum')\ntime.sleep(60)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert proc.returncode == 4
    assert proc.stderr.count("\n") == 1 and "rank 1" in proc.stderr
    assert "the gradient sum at step 7 did not complete within parallel.collective_timeout_s = 1 s" in proc.stderr


def test_an_aborting_rank_waits_until_its_last_lines_are_read():
    # MPI_Abort makes the launcher's proxy kill the ranks and close their pipes: a message still
    # unread in a pipe then never reaches the user (a job that ended with status 4 and an empty
    # stderr). drain_stdio holds the rank until the reader has taken every byte, for at most its
    # timeout. The test orders the events instead of timing them: the child says on a side pipe
    # when it starts to drain and when the drain has returned; the parent reads the child's stderr
    # only after a pause, and the drain may return only after that read.
    import os
    import select
    import subprocess
    import sys

    from helpers import child_env

    lines = "deepfusion: the last words\n" * 200
    child = ("import os, sys, time\nfrom deepfusion.parallel.comm import drain_stdio\n"
             "side = int(sys.argv[1]); timeout = float(sys.argv[2])\n"
             f"sys.stderr.write({lines!r})\n"
             "os.write(side, b'draining\\n')\n"
             "t = time.monotonic(); drain_stdio(timeout); waited = time.monotonic() - t\n"
             "os.write(side, f'returned {waited!r}\\n'.encode())\n")

    def start(timeout: float):
        read, write = os.pipe()
        proc = subprocess.Popen([sys.executable, "-c", child, str(write), str(timeout)], env=child_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(write,))
        os.close(write)
        side = os.fdopen(read, "rb")
        assert side.readline() == b"draining\n"
        return proc, side

    # A reader that reads late: the drain returns only after every byte was taken.
    proc, side = start(600.0)
    assert select.select([side], [], [], 0.5)[0] == []  # still draining: nothing has read its stderr yet
    assert proc.stderr.read(len(lines)).decode() == lines
    assert side.readline().startswith(b"returned ")
    assert proc.wait(timeout=60) == 0
    # A reader that never reads (until the child has ended): the rank goes on after the timeout.
    proc, side = start(0.5)
    waited = float(side.readline().split()[1])
    assert waited >= 0.5 and proc.wait(timeout=60) == 0
    assert proc.stderr.read().decode() == lines
