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
