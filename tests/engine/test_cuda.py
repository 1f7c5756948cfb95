"""The CUDA path, on a machine with an NVIDIA GPU; every test here skips cleanly without one."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from helpers import PLAIN, ROOT, TINY, run_cli
from deepfusion.files.checkpoint import load_checkpoint
from deepfusion.parallel.comm import SerialCommunicator
from deepfusion.parallel.runtime import find_mpiexec, select_device

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

CONFIG = str(ROOT / "configs" / "burgers.toml")
# 20 Adam steps of batch 8, as the multi-rank trajectory test.
RUN = [*TINY, "--set", "data.n_train=16", "--set", "train.batch_size=8", "--set", "output.plots=false"]


def _final(run_dir):
    return load_checkpoint(run_dir / "checkpoints" / "step-00000020.h5").model


def _train(tmp_path, name, *extra):
    out = tmp_path / name
    proc = run_cli("train", CONFIG, "--out", str(out), *RUN, *extra, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return out, proc.stdout


# (config, overrides, stage): each family and output basis as a one-level step on a small grid with the energy
# loss; then the preconditioned loss with the coarse correction, and the second stage (stage 1), on Poisson.
ENERGY = ["train.loss=family", "model.coarse_correction=0", "model.sweeps=0", "train.second_stage_epochs=0"]
CAPTURED = {
    "burgers": ("burgers.toml", ENERGY, 0),
    "poisson-multilevel": ("poisson_128.toml", ["problem.resolution=[33,33]", *ENERGY], 0),
    "poisson-nodal": ("poisson_128.toml", ["problem.resolution=[33,33]", "model.output=nodal", *ENERGY], 0),
    "reaction_diffusion": ("reaction_diffusion.toml", ["problem.resolution=[33,33]", *ENERGY], 0),
    "poisson3d": ("poisson3d.toml", ["problem.resolution=[17,17,17]", *ENERGY], 0),
    "elasticity": ("elasticity.toml", ["problem.resolution=[17,17]", *ENERGY], 0),
    "poisson-preconditioned-coarse": ("poisson_128.toml", ["problem.resolution=[33,33]", "model.coarse_correction=9",
                                                           "train.second_stage_epochs=0"], 0),
    "poisson-second-stage": ("poisson_128.toml", ["problem.resolution=[33,33]", "model.coarse_correction=9"], 1),
    "elasticity-preconditioned-coarse": ("elasticity.toml", ["problem.resolution=[17,17]", "model.coarse_correction=5",
                                                             "train.loss=preconditioned"], 0),
}


@pytest.mark.parametrize("case", list(CAPTURED))
def test_every_familys_step_captures_in_a_cuda_graph_and_replays_the_eager_step(case):
    # parallel.cuda_graphs: the step's forward and backward captured once and replayed (float64: the replay is
    # the eager step to rounding), for every family and output basis, or refused in one line by the config.
    from deepfusion.configuration.config import load_config
    from deepfusion.configuration.run import Run
    from deepfusion.parallel.gradsync import GradSync
    from deepfusion.training.stepper import make_local_step

    config, overrides, visit = CAPTURED[case]
    cfg = load_config(ROOT / "configs" / config, [*overrides, "multigrid.levels=[]", "parallel.device=cuda",
                                                  "train.dtype=float64"])
    run = Run.from_config(cfg)
    params = torch.as_tensor(run.training[:4], dtype=torch.float64, device="cuda")
    grads = []
    for graphed in (False, True):
        torch.manual_seed(0)
        whole = run.build_model()
        with torch.no_grad():
            for p in whole.parameters():  # the zero-initialised heads would make the gradients trivial
                p.add_(0.05 * torch.randn_like(p))
        target = run.schedule(whole.to("cuda")).target(run.visits[visit])
        model, problem = target.generator, target.family
        sync = GradSync(model, SerialCommunicator(), "flat")
        step = make_local_step(model, problem, sync, 4, cuda_graph=graphed, example=params)
        for _ in range(2):
            sums = step(params)
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]).cpu())
        grads.append({k: float(v) for k, v in sums.items()})
    assert grads[3] == pytest.approx(grads[1], rel=1e-10)
    assert float((grads[2] - grads[0]).abs().max()) <= 1e-10 * float(grads[0].abs().max())


@pytest.mark.timeout(600)
def test_graphs_train_the_two_stage_corrected_model_as_eager_steps_do(tmp_path):
    # The winning setting (coarse correction, preconditioned loss, a second stage) trained with parallel.cuda_graphs:
    # each stage's step captured once and replayed; in float64 the final model is the eager run's.
    args = ["--set", "problem.resolution=[33,33]", "--set", "multigrid.levels=[]", "--set", "train.epochs=2",
            "--set", "train.second_stage_epochs=2", "--set", "model.coarse_correction=9",
            "--set", "train.loss=preconditioned", "--set", "model.channels=[4,8]", "--set", "data.n_train=16",
            "--set", "data.n_test=2", "--set", "train.batch_size=8", "--set", "output.plots=false",
            "--set", "train.dtype=float64", "--set", "parallel.device=cuda", "--set", "train.checkpoint_every=100"]
    runs = {}
    for name, extra in (("eager", []), ("graph", ["--set", "parallel.cuda_graphs=true"])):
        proc = run_cli("train", str(ROOT / "configs" / "poisson.toml"), "--out", str(tmp_path / name), *args, *extra)
        assert proc.returncode == 0, proc.stderr
        runs[name] = load_checkpoint(sorted((tmp_path / name / "checkpoints").glob("step-*.h5"))[-1]).model
    for key, ref in runs["eager"].items():
        rel = np.abs(runs["graph"][key] - ref).max() / max(np.abs(ref).max(), 1e-300)
        assert rel < 1e-9, (key, rel)


def test_select_device_takes_the_gpu():
    assert select_device("cuda", 0, 1) == "cuda:0"


@pytest.mark.timeout(600)
def test_cuda_training_follows_the_cpu_trajectory(tmp_path):
    cpu, _ = _train(tmp_path, "cpu", "--set", "train.dtype=float64")
    gpu, stdout = _train(tmp_path, "gpu", "--set", "train.dtype=float64", "--set", "parallel.device=cuda")
    assert "device: cuda:0" in stdout
    for name, ref in _final(cpu).items():
        rel = np.abs(_final(gpu)[name] - ref).max() / max(np.abs(ref).max(), 1e-300)
        assert rel < 1e-8, (name, rel)
    report = json.loads((gpu / "eval.json").read_text())
    assert all(np.isfinite(report["rel_l2"]))


@pytest.mark.timeout(600)
def test_cuda_graph_step_equals_eager(tmp_path):
    eager, _ = _train(tmp_path, "eager", "--set", "train.dtype=float64", "--set", "parallel.device=cuda")
    graph, _ = _train(tmp_path, "graph", "--set", "train.dtype=float64", "--set", "parallel.device=cuda",
                      "--set", "parallel.cuda_graphs=true")
    for name, ref in _final(eager).items():
        rel = np.abs(_final(graph)[name] - ref).max() / max(np.abs(ref).max(), 1e-300)
        assert rel < 1e-10, (name, rel)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("extra", [["--set", "parallel.autocast='bf16'"], ["--set", "parallel.tf32=true"]],
                         ids=["bf16", "tf32"])
def test_mixed_precision_trains(tmp_path, extra):
    out, _ = _train(tmp_path, "amp", "--set", "parallel.device=cuda", "--set", "train.epochs=20", *extra)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    first, last = records[0]["loss"], np.mean([r["loss"] for r in records[-3:]])
    assert np.isfinite(last) and last < 0.7 * first, (first, last)


@pytest.mark.timeout(300)
@pytest.mark.needs_mpiexec
def test_gpu_gradients_summed_on_two_ranks():
    # Both ranks share the one GPU here; the staged transport (and CUDA-aware MPI where
    # the library says it is) must give the serial gradient to 1e-12 in float64.
    # "auto" must see that the ranks share the GPU and not pick NCCL (which refuses that).
    transports = ["staged", "auto"]
    # Open MPI refuses root without these (GPU machines often run tests as root).
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    probe = subprocess.run([sys.executable, "-c", "from mpi4py import MPI; from deepfusion.parallel.reducers import "
                            "cuda_aware_mpi; print(cuda_aware_mpi())"], capture_output=True, text=True, env=env)
    if probe.stdout.strip() == "True":
        transports.append("mpi")
    proc = subprocess.run([find_mpiexec(), "-n", "2", sys.executable, str(ROOT / "tests" / "mpi_scripts" / "gradients.py"),
                           "cuda", *transports], capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("OK ") == 3 * len(transports) + 3, proc.stdout  # and drift, two Poisson outputs
    assert "transport=nccl" not in proc.stdout


@pytest.mark.timeout(300)
@pytest.mark.needs_mpiexec
def test_a_sample_split_over_two_ranks_on_the_gpu_is_the_whole_grid():
    # A domain split on CUDA tensors: the halos, the tile gather and the domain sums are staged through host
    # memory (no CUDA-aware MPI needed); every float64 case of tiles.py equals the whole grid to 1e-10.
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    proc = subprocess.run([find_mpiexec(), "-n", "2", sys.executable, str(ROOT / "tests" / "mpi_scripts" / "tiles.py"),
                           "float64", "cuda"], capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("OK ") == 12, proc.stdout


def test_nccl_rendezvous_over_the_communicator():
    # One rank (this machine has one GPU; NCCL refuses two ranks on one device): the
    # address travels through the communicator, the group forms and a sum is the identity.
    import torch.distributed as dist

    from deepfusion.parallel.reducers import NCCLReducer

    if not dist.is_nccl_available():
        pytest.skip("torch without NCCL")
    buffer = torch.arange(6, dtype=torch.float32, device="cuda")
    try:
        reducer = NCCLReducer(SerialCommunicator(), buffer)
        handles = [reducer.start(0, 3), reducer.start(3, 6)]
        reducer.wait(handles)
        reducer.allreduce()
        assert torch.equal(buffer.cpu(), torch.arange(6, dtype=torch.float32))
        assert dist.get_backend() == "nccl" and dist.get_world_size() == 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.timeout(600)
def test_compare_adds_a_labelled_gpu_row(tmp_path):
    run_dir, _ = _train(tmp_path, "cmp")
    out = tmp_path / "report.json"
    proc = run_cli("compare", str(run_dir), "--samples", "2", "--threads", "1", "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [r["device"].split(":")[0] for r in rows] == ["cpu", "cuda"]
    # The same network on either device: the same error, measured once.
    assert rows[0]["diffnet_error"] == rows[1]["diffnet_error"] and rows[1]["diffnet_s_batched"] > 0
    assert "a different machine's figure" in proc.stdout


@pytest.mark.parametrize("case", ["2-D", "3-D", "elasticity3d"])
def test_the_vcycle_on_cuda_is_the_cpu_vcycle(case):
    # The preconditioner of train.loss = "preconditioned" runs on the batch's device: float64 on
    # the GPU gives the CPU's B r to float64 rounding (three unknowns: the block V-cycle).
    from diffnet.families.elasticity import Elasticity3DFamily
    from diffnet.families.poisson import PoissonFamily
    from diffnet.families.poisson3d import Poisson3DFamily
    from diffnet.multigrid.vcycle import VCycle

    family = {"2-D": PoissonFamily((40, 40)), "3-D": Poisson3DFamily((17, 17, 17)), "elasticity3d": Elasticity3DFamily((13, 13, 13))}[case]
    params = torch.as_tensor(family.sample(2, "random", 0)) if case == "elasticity3d" else torch.rand(2, 6, dtype=torch.float64) * 6 - 3
    u = family.field(torch.randn(2, len(family.unknowns), *family.resolution, dtype=torch.float64), params)
    cpu = VCycle.build(family, u, params)
    r = torch.randn_like(u) * cpu.free
    gpu = VCycle.build(family, u.cuda(), params.cuda())
    expected = cpu(r)
    assert torch.allclose(gpu(r.cuda()).cpu(), expected, rtol=0, atol=1e-10 * float(expected.abs().max()))


@pytest.mark.parametrize("case", ["2-D", "3-D", "elasticity"])
def test_the_coarse_correction_on_cuda_is_the_cpus(case):
    # model.coarse_correction runs in float64 on the field's device: the GPU's corrected field and the
    # gradient through it are the CPU's to float64 rounding (two unknowns: the block Hessian's).
    from diffnet.multigrid.coarse import coarse_correction
    from diffnet.families.elasticity import ElasticityFamily
    from diffnet.families.poisson import PoissonFamily
    from diffnet.families.poisson3d import Poisson3DFamily

    family = {"2-D": PoissonFamily((65, 65)), "3-D": Poisson3DFamily((17, 17, 17)), "elasticity": ElasticityFamily((33, 33))}[case]
    params = torch.as_tensor(family.sample(2, "random", 0)) if case == "elasticity" else torch.rand(2, 6, dtype=torch.float64) * 6 - 3
    u = family.field(torch.randn(2, len(family.unknowns), *family.resolution, dtype=torch.float64), params)
    results = []
    for device in ("cpu", "cuda"):
        v = u.to(device).requires_grad_(True)
        out = coarse_correction(family, v, params.to(device), 9)
        (grad,) = torch.autograd.grad((out**2).sum(), v)
        results.append((out.detach().cpu(), grad.cpu()))
    for a, b in zip(*results):
        assert torch.allclose(b, a, rtol=0, atol=1e-10 * float(a.abs().max()))


@pytest.mark.timeout(600)
def test_a_vector_family_trains_on_cuda_as_on_the_cpu(tmp_path):
    # Several unknown fields (configs/elasticity.toml: two output channels, the vector energy) on the GPU in
    # float64: the CPU's model after the same steps, and the field files per component.
    import h5py

    config = str(ROOT / "configs" / "elasticity.toml")
    quick = ["--set", "problem.resolution=[17,17]", "--set", "multigrid.levels=[9,17]", "--set", "multigrid.epochs=[2,2]",
             "--set", "model.channels=[4,8]", "--set", "multigrid.top_channels=4", "--set", "data.n_train=16",
             "--set", "data.n_test=2", "--set", "train.batch_size=8", "--set", "output.plots=false",
             "--set", "train.dtype=float64", "--set", "train.checkpoint_every=100", *PLAIN]
    runs = {}
    for device in ("cpu", "cuda"):
        proc = run_cli("train", config, "--out", str(tmp_path / device), *quick, "--set", f"parallel.device={device}")
        assert proc.returncode == 0, proc.stderr
        runs[device] = load_checkpoint(sorted((tmp_path / device / "checkpoints").glob("step-*.h5"))[-1]).model
    for name, ref in runs["cpu"].items():
        rel = np.abs(runs["cuda"][name] - ref).max() / max(np.abs(ref).max(), 1e-300)
        assert rel < 1e-8, (name, rel)
    with h5py.File(tmp_path / "cuda" / "test_prediction.h5") as f:
        assert f.attrs["unknowns"] == "u_x,u_y" and f["u_x"].shape == (2, 17, 17)
