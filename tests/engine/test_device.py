"""Device selection, the CUDA-only settings, and the staged gradient transport on CPU tensors."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from helpers import ROOT, TINY, run_cli
from deepfusion.configuration.schema import ConfigError
from deepfusion.configuration.config import load_config
from deepfusion.configuration.run import Run
from deepfusion.parallel.comm import SerialCommunicator
from deepfusion.parallel.reducers import MPIReducer, StagedReducer, make_reducer
from deepfusion.parallel.runtime import DeviceError, select_device

CONFIG = str(ROOT / "configs" / "burgers.toml")


def test_cpu_is_cpu_whatever_the_gpus():
    assert select_device("cpu", 3, 4, cuda_available=True, gpu_count=8) == "cpu"


@pytest.mark.parametrize("local_rank, local_size, gpus, expected", [
    (0, 1, 1, "cuda:0"),
    (1, 2, 2, "cuda:1"),
    (3, 4, 8, "cuda:3"),
    (2, 4, 1, "cuda:0"),  # the launcher gave each rank its own GPU (CUDA_VISIBLE_DEVICES per rank)
])
def test_one_gpu_per_local_rank(local_rank, local_size, gpus, expected):
    assert select_device("cuda", local_rank, local_size, cuda_available=True, gpu_count=gpus) == expected


def test_cuda_asked_and_absent_is_a_clear_error():
    with pytest.raises(DeviceError, match="no CUDA device is usable here"):
        select_device("cuda", 0, 1, cuda_available=False, gpu_count=0)
    with pytest.raises(DeviceError, match="4 ranks on this node but 2 GPUs"):
        select_device("cuda", 0, 4, cuda_available=True, gpu_count=2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_train_on_cuda_without_cuda_exits_2_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("train", CONFIG, "--out", str(out), *TINY, "--set", "parallel.device=cuda")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device is usable here" in lines[0]
    assert not out.exists()


@pytest.mark.parametrize("override, message", [
    ("parallel.cuda_graphs=true", "parallel.cuda_graphs: applies to parallel.device = 'cuda' only"),
    ("parallel.tf32=true", "parallel.tf32: applies to parallel.device = 'cuda' only"),
    ("parallel.gpu_reduce='nccl'", "parallel.gpu_reduce: applies to parallel.device = 'cuda' only"),
    ("parallel.autocast='fp16'", "parallel.autocast: must be one of"),
    ("parallel.device='tpu'", "parallel.device: must be one of"),
])
def test_cuda_settings_validated(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(CONFIG, [override])


def test_cuda_graphs_refuse_a_hessian_that_lives_on_the_host():
    # The cut-cell families give B g from their assembled numpy system: nothing a CUDA graph can capture.
    with pytest.raises(ConfigError, match="the torsion family gives B g from its assembled system .* which a CUDA "
                                          "graph cannot capture"):
        Run.from_config(load_config(ROOT / "configs" / "torsion.toml", [
            "multigrid.levels=[]", "problem.resolution=[33,33]", "parallel.device='cuda'", "parallel.cuda_graphs=true"]))


def test_cuda_graphs_need_adam():
    with pytest.raises(ConfigError, match="parallel.cuda_graphs: the graphed step is a first-order one"):
        load_config(CONFIG, ["multigrid.levels=[]", "parallel.device='cuda'", "parallel.cuda_graphs=true", "train.optimizer='lbfgs'"])


class _Doubling(SerialCommunicator):
    """A stand-in for two ranks holding equal buffers: the sum doubles every value."""

    size = 2

    def allreduce_(self, buf):
        buf *= 2
        return buf

    def iallreduce_(self, buf):
        buf *= 2
        return "request"

    def waitall(self, requests):
        assert all(r == "request" for r in requests)


def test_staged_transport_on_cpu_tensors_sums_through_the_host_copy():
    buffer = torch.arange(10, dtype=torch.float64)
    staged = make_reducer("staged", _Doubling(), buffer)
    assert isinstance(staged, StagedReducer) and staged.host.data_ptr() != buffer.data_ptr()
    handles = [staged.start(0, 4), staged.start(4, 10)]
    staged.poke(handles)
    # Until wait() the device-side buffer is untouched: the sum happened in the host copy.
    np.testing.assert_array_equal(buffer.numpy(), np.arange(10))
    staged.wait(handles)
    np.testing.assert_array_equal(buffer.numpy(), 2 * np.arange(10))
    staged.allreduce()
    np.testing.assert_array_equal(buffer.numpy(), 4 * np.arange(10))


def test_host_buffers_go_straight_to_mpi():
    assert type(make_reducer("auto", _Doubling(), torch.zeros(3))) is MPIReducer
    assert type(make_reducer("nccl", _Doubling(), torch.zeros(3))) is MPIReducer
    with pytest.raises(ValueError, match="unknown gradient transport"):
        make_reducer("gloo", _Doubling(), torch.zeros(3))


def test_mpi_library_is_asked_about_cuda():
    # The mpich wheel's libmpi answers MPIX_Query_cuda_support, and it is built without CUDA.
    pytest.importorskip("mpi4py")
    code = "from mpi4py import MPI; from deepfusion.parallel.reducers import mpi_cuda_support; print(mpi_cuda_support())"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() in ("False", "True")  # None would mean the query was not found
