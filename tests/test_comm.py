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
    import time

    # An abort that does nothing (as if MPI_Abort could not get through): the hard exit still ends it.
    code = ("import time\nfrom deepfusion.parallel.watchdog import Watchdog\n"
            "dog = Watchdog(0.3, 1, abort=lambda status: None)\ndog.where = 'step 7'\n"
            "dog.arm('an Allreduce'); dog.disarm()\n"  # a collective that returned in time
            "time.sleep(0.6)\ndog.arm('the gradient sum')\ntime.sleep(30)\n")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 4 and time.monotonic() - t0 < 10
    assert proc.stderr.count("\n") == 1 and "rank 1" in proc.stderr
    assert "the gradient sum at step 7 did not complete within parallel.collective_timeout_s = 0.3 s" in proc.stderr


def test_an_aborting_rank_waits_until_its_last_lines_are_read():
    # MPI_Abort makes the launcher's proxy kill the ranks and close their pipes: a message still
    # unread in a pipe then never reaches the user (a job that ended with status 4 and an empty
    # stderr). drain_stdio holds the rank until the reader has taken every byte, for at most its
    # timeout; here the reader waits 1 s before reading, and the child reports how long it waited.
    import subprocess
    import sys
    import time

    from conftest import child_env

    child = ("import sys, time\nfrom deepfusion.parallel.comm import drain_stdio\n"
             "sys.stderr.write('deepfusion: the last words\\n' * 200)\n"
             "t = time.monotonic(); drain_stdio(5.0); waited = time.monotonic() - t\n"
             "sys.stdout.write(f'waited {waited:.2f}\\n'); sys.stdout.flush()\n")
    proc = subprocess.Popen([sys.executable, "-c", child], env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(1.0)
    err = proc.stderr.read().decode()
    out = proc.stdout.read().decode()
    assert proc.wait(timeout=30) == 0
    assert err.count("the last words") == 200
    assert 0.7 < float(out.split()[1]) < 5.0, out
    # A reader that never reads (until the child has ended): the rank goes on after the timeout.
    stuck = subprocess.Popen([sys.executable, "-c", child.replace("5.0", "0.5")], env=child_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert stuck.wait(timeout=30) == 0
    assert 0.4 < float(stuck.stdout.read().split()[1]) < 2.0
