"""Communicator selection without a launcher, and the serial communicator's identities."""

import numpy as np

from deepfusion.comm import SerialCommunicator, launched_under_mpi, world


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
    code = ("import time\nfrom deepfusion.watchdog import Watchdog\n"
            "dog = Watchdog(0.3, 1, abort=lambda status: None)\ndog.where = 'step 7'\n"
            "dog.arm('an Allreduce'); dog.disarm()\n"  # a collective that returned in time
            "time.sleep(0.6)\ndog.arm('the gradient sum')\ntime.sleep(30)\n")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 4 and time.monotonic() - t0 < 10
    assert proc.stderr.count("\n") == 1 and "rank 1" in proc.stderr
    assert "the gradient sum at step 7 did not complete within parallel.collective_timeout_s = 0.3 s" in proc.stderr
