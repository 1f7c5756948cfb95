"""The second stage (train.second_stage_epochs): u = u1 + eps v on the first stage's correction,
trained with the first network frozen, the same model on one and two ranks, resumed bitwise, and
run by every inference path."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from helpers import ROOT, child_env, run_cli
from deepfusion.parallel.runtime import find_mpiexec
from diffnet.generators.networks import UNet
from diffnet.multigrid.preconditioned import preconditioned_residual
from diffnet.families.poisson import PoissonFamily
from diffnet.generators.two_stage import SecondNetwork, SecondStage, TwoStage

MPIEXEC = find_mpiexec()
POISSON = str(ROOT / "configs" / "poisson.toml")


class _MinusCorrection(nn.Module):
    """A stand-in second network whose output is minus its last input channel (the scaled correction)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return -x[:, -1:]


def test_the_second_stage_can_represent_the_first_stages_v_cycle_correction():
    torch.manual_seed(0)
    family = PoissonFamily((17, 17))
    first = UNet(family.in_channels, 1, (4, 8)).double()
    params = torch.rand(3, 6, dtype=torch.float64) * 6 - 3
    problem = SecondStage(family, first)
    x = problem.inputs(params)
    assert problem.in_channels == family.in_channels + 1 and x.shape[1] == family.in_channels + 3
    u1 = family.field(first(family.inputs(params)), params).detach()
    # v = -(B g1 / eps): u = u1 - B g1, the first stage's field improved by one V-cycle, exactly.
    u = problem.field(SecondNetwork(_MinusCorrection())(x), params)
    _, d = preconditioned_residual(family, u1, params, 1)
    assert float((u - (u1 - d)).abs().max()) <= 1e-12 * float(u1.abs().max())
    # A zero correction leaves the first stage's field as it was.
    zero = problem.field(torch.cat([torch.zeros_like(x[:, :1]), x[:, -2:]], dim=1), params)
    assert torch.equal(zero, u1)
    with pytest.raises(TypeError, match="pair"):
        TwoStage(first, SecondNetwork(_MinusCorrection()))(x)


def test_a_family_without_the_capability_or_with_lbfgs_is_refused_in_one_line(tmp_path):
    proc = run_cli("train", str(ROOT / "configs" / "burgers.toml"), "--out", str(tmp_path / "r"),
                   "--set", "train.second_stage_epochs=2")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "and a second stage needs an energy (diffnet.Energy" in proc.stderr
    proc = run_cli("train", POISSON, "--out", str(tmp_path / "r"), "--set", "train.second_stage_epochs=2",
                   "--set", "train.optimizer=adam+lbfgs")
    assert proc.returncode == 2 and "not an L-BFGS phase" in proc.stderr and proc.stderr.count("\n") == 1
    assert not (tmp_path / "r").exists()


RUN = ["--set", "problem.resolution=[16,16]", "--set", "multigrid.levels=[8,16]", "--set", "multigrid.epochs=[2,2]",
       "--set", "model.channels=[4,8]", "--set", "multigrid.top_channels=4", "--set", "data.n_train=16",
       "--set", "data.n_test=2", "--set", "train.batch_size=8", "--set", "train.log_every=1",
       "--set", "train.checkpoint_every=2", "--set", "train.keep_checkpoints=0", "--set", "parallel.threads_per_rank=1",
       "--set", "output.plots=false", "--set", "train.dtype=float64", "--set", "train.loss=preconditioned",
       "--set", "train.second_stage_epochs=2"]


def _checkpoint(run_dir, step: int):
    from deepfusion.files.checkpoint import load_checkpoint

    return load_checkpoint(run_dir / "checkpoints" / f"step-{step:08d}.h5")


@pytest.mark.needs_mpiexec
@pytest.mark.timeout(300)
@pytest.mark.slow
def test_two_stages_train_one_model_on_one_and_two_ranks_with_the_first_frozen_and_resume_bitwise(tmp_path):
    runs = {}
    for ranks in (1, 2):
        runs[ranks] = tmp_path / f"p{ranks}"
        proc = run_cli("train", POISSON, "--out", str(runs[ranks]), *RUN, ranks=None if ranks == 1 else ranks,
                       timeout=250)  # P = 1 in this process
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "second stage 16x16 epoch 2/2 step 12/12" in proc.stdout
    assert "the first stage alone: error" in proc.stdout
    a, b = _checkpoint(runs[1], 12), _checkpoint(runs[2], 12)
    assert max(float(np.abs(a.model[k] - b.model[k]).max()) for k in a.model) < 1e-9
    # The second stage trains the second network only: the first is the first stage's, bitwise.
    end_of_first = _checkpoint(runs[1], 8)
    first = [k for k in a.model if k.startswith("first.")]
    second = [k for k in a.model if k.startswith("second.")]
    assert first and second and len(first) + len(second) == len(a.model)
    assert all(np.array_equal(a.model[k], end_of_first.model[k]) for k in first)
    assert not all(np.array_equal(a.model[k], end_of_first.model[k]) for k in second)
    # Resumed inside the second stage: bitwise the uninterrupted run.
    for step in (12,):
        (runs[1] / "checkpoints" / f"step-{step:08d}.h5").unlink()
    proc = run_cli("train", POISSON, "--out", str(runs[1]), *RUN, timeout=250)
    assert proc.returncode == 0, proc.stderr
    assert "resuming from" in proc.stdout and "step 10" in proc.stdout
    c = _checkpoint(runs[1], 12)
    assert all(np.array_equal(a.model[k], c.model[k]) for k in a.model)
    # Every inference path runs both stages: the Surrogate gives the evaluation's held-out fields.
    import h5py

    from deepfusion import Surrogate

    with h5py.File(runs[1] / "test_prediction.h5") as f:
        fields, coeffs = f["u"][...], f["a"][...]
    assert np.array_equal(Surrogate.load(runs[1]).fields(coeffs), fields)


@pytest.mark.needs_mpiexec
@pytest.mark.timeout(300)
@pytest.mark.slow
def test_the_user_guides_second_stage_command_runs_as_written(tmp_path):
    guide = (ROOT / "docs" / "user-guide.md").read_text()
    block = re.search(r"```bash\n(.*?)```", guide[guide.index("## A second stage"):], re.S).group(1)
    command = block.replace("\\\n", " ")
    assert command.startswith("mpiexec -n 2 deepfusion train") and "train.second_stage_epochs" in command
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    skip = ("train.dtype", "train.checkpoint_every", "train.second_stage_epochs")  # the guide's own settings
    tiny = " ".join(shlex.quote(a) for key, value in zip(RUN[::2], RUN[1::2]) if not value.startswith(skip)
                    for a in (key, value))
    command = command.replace("mpiexec", shlex.quote(MPIEXEC)).replace(" --out ", f" {tiny} --out ")
    env = child_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=250)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "second stage 16x16 epoch 10/10" in proc.stdout
    report = json.loads((tmp_path / "runs" / "poisson_two_stages" / "eval.json").read_text())
    assert report["first_stage_ratio_to_floor"] > 0 and report["ratio_to_floor"] > 0
