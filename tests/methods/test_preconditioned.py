"""The preconditioned loss: the batched torch V-cycle against the numpy multigrid, B's symmetry, the
families' Hessian stencils, the loss at the FEM solution, and training with it (P = 1 and 2, resume)."""

import numpy as np
import pytest
import torch

from helpers import PLAIN, ROOT, run_cli, run_cli_jobs
from deepfusion.parallel.runtime import find_mpiexec
from diffnet.protocol.family import Family
from diffnet.multigrid.preconditioned import PreconditionedLoss, error_estimate
from diffnet.families.poisson import PoissonFamily
from diffnet.families.poisson3d import Poisson3DFamily
from diffnet.families.reaction_diffusion import ReactionDiffusionFamily
from diffnet.solvers.gmg import GMGSolver
from diffnet.solvers.fem import FEMSystem, assemble, poisson_system
from diffnet.multigrid.hessian import probe_stencil
from diffnet.multigrid.vcycle import VCycle, coarse_grids

MPIEXEC = find_mpiexec()
POISSON = str(ROOT / "configs" / "poisson.toml")


def _instances(family, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    params = torch.rand(n, 6, dtype=torch.float64, generator=g) * 6 - 3
    raw = torch.randn(n, 1, *family.resolution, dtype=torch.float64, generator=g)
    return params, family.field(raw, params)


def _numpy_levels(family: PoissonFamily, params: np.ndarray) -> GMGSolver:
    """The numpy multigrid on the same rediscretised levels, each scaled as the loss is (by the lift's energy)."""
    systems = []
    for grid in coarse_grids(family.resolution):
        nu = family.at_resolution(grid).diffusivity_numpy(params[None])[0]
        system = poisson_system(nu)
        A, _ = assemble(nu, (1 / (grid[1] - 1), 1 / (grid[0] - 1)))
        lift = np.broadcast_to(1 - np.linspace(0, 1, grid[1]), grid).ravel()
        stencil = system.stencil.copy()
        stencil[~system.fixed.reshape(grid)] /= 0.5 * lift @ (A @ lift)
        systems.append(FEMSystem(stencil, system.rhs, system.fixed, system.values, system.shape))
    return GMGSolver.from_systems(systems, smoother="jacobi")


@pytest.mark.parametrize("n, cycles", [(33, 1), (40, 2)])  # nested grids, and ceil(N / 2) coarsening
def test_torch_vcycle_is_the_numpy_multigrids_vcycle(n, cycles):
    family = PoissonFamily((n, n))
    params, u = _instances(family, 3)
    B = VCycle.build(family, u, params, cycles=cycles)
    assert [tuple(level.free.shape[2:]) for level in B.levels] == coarse_grids((n, n))
    r = torch.randn(3, n, n, dtype=torch.float64) * B.free
    got = B(r)
    for s in range(3):
        expected = _numpy_levels(family, params[s].numpy()).precondition(r[s].numpy(), cycles)
        assert np.abs(got[s].numpy() - expected).max() <= 1e-10 * np.abs(expected).max()


@pytest.mark.parametrize("family", [PoissonFamily((40, 40)), ReactionDiffusionFamily((33, 33)), Poisson3DFamily((17, 17, 17))],
                         ids=["poisson", "reaction_diffusion", "poisson3d"])
def test_b_is_symmetric_and_the_hessians_are_the_losses(family):
    params, u = _instances(family, 2)
    # The analytic stencil is what 3^d probes of the loss read off (the engine's default where a family writes no hessian).
    analytic, probed = family.hessian(u, params), probe_stencil(family, u, params)
    assert (analytic - probed).abs().max() <= 1e-10 * analytic.abs().max()
    B = VCycle.build(family, u, params)
    x, y = (torch.randn_like(u) * B.free for _ in range(2))
    assert abs(float((B(x) * y).sum() - (x * B(y)).sum())) <= 1e-12 * float((B(x) * y).sum().abs())
    # An approximate inverse: B A reduces the error of A e = r by more than half per cycle.
    e = torch.randn_like(u) * B.free
    left = e - B(B.operator(e))
    assert float(left.norm()) < 0.5 * float(e.norm())


@pytest.mark.parametrize("form", ["target", "loss"])
def test_the_loss_vanishes_with_its_gradient_at_the_fem_solution(form):
    family = PoissonFamily((33, 33))
    params, _ = _instances(family, 2)
    solution = torch.as_tensor(np.stack([family.fem_system(p).solve(tol=1e-13) for p in params.numpy()]))
    loss = PreconditionedLoss(family, form=form)
    u = solution.clone().requires_grad_(True)
    value = loss.loss_terms(u, params)["preconditioned"]
    (grad,) = torch.autograd.grad(value.sum(), u)
    assert float(value.detach().max()) < 1e-20 and float(grad.abs().max()) < 1e-9
    # Off it, the value is 1/2 (estimated relative error)^2, and the estimate is within a factor 2 of the
    # error of a smooth perturbation (the plateau's kind) against the grid's own solution.
    bump = 1e-3 * torch.sin(torch.pi * torch.linspace(0, 1, 33, dtype=torch.float64)).expand(2, 33, 33)
    off = solution + bump
    true = ((off - solution).square().sum((1, 2)) / off.square().sum((1, 2))).sqrt()
    estimate = error_estimate(family, off, params)
    assert torch.allclose(loss.loss_terms(off, params)["preconditioned"], 0.5 * estimate.square(), rtol=1e-12)
    assert ((estimate / true > 0.5) & (estimate / true < 2.0)).all(), (estimate, true)
    # The gradient of either form points along B g (about the error): descent reduces the error.
    u = off.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(loss.loss_terms(u, params)["preconditioned"].sum(), u)
    assert float((grad * (off - solution)).sum()) > 0


def test_a_family_without_the_capability_is_refused_in_one_line(tmp_path):
    proc = run_cli("train", str(ROOT / "configs" / "burgers.toml"), "--out", str(tmp_path / "r"),
                   "--set", "train.loss=preconditioned")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "and the preconditioned loss needs an energy (diffnet.Energy" in proc.stderr
    proc = run_cli("train", POISSON, "--out", str(tmp_path / "r"), "--set", "train.loss=preconditioned",
                   "--set", "parallel.domain=[2]")
    assert proc.returncode == 2 and "needs each sample whole" in proc.stderr
    assert not Family.capabilities and PoissonFamily((9, 9)).loss().kind == "energy"


RUN = ["--set", "problem.resolution=[16,16]", "--set", "multigrid.levels=[8,16]", "--set", "multigrid.epochs=[2,2]",
       "--set", "model.channels=[4,8]", "--set", "multigrid.top_channels=4", "--set", "data.n_train=16",
       "--set", "data.n_test=2", "--set", "train.batch_size=8", "--set", "train.log_every=1",
       "--set", "train.checkpoint_every=2", "--set", "parallel.threads_per_rank=1", "--set", "output.plots=false",
       "--set", "train.dtype=float64", "--set", "train.loss=preconditioned",
       "--set", "model.coarse_correction=0", "--set", "model.sweeps=0", "--set", "train.second_stage_epochs=0"]


def _final(run_dir):
    from deepfusion.files.checkpoint import checkpoint_files, load_checkpoint

    return load_checkpoint(checkpoint_files(run_dir / "checkpoints")[0])


@pytest.mark.needs_mpiexec
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_training_on_one_and_two_ranks_gives_one_model_and_resumes_bitwise(tmp_path):
    # Both forms: P = 1 in this process, P = 2 one MPI job of both (conftest.run_cli_jobs).
    from deepfusion.files.checkpoint import checkpoint_files, load_checkpoint

    forms = ("target", "loss")

    def args(form, ranks):
        return ["train", POISSON, "--out", str(tmp_path / f"{form}-p{ranks}"), *RUN,
                "--set", f"train.precondition_form={form}"]

    procs = {(form, 1): run_cli(*args(form, 1)) for form in forms}
    procs.update(zip([(form, 2) for form in forms], run_cli_jobs(2, *(args(form, 2) for form in forms), timeout=250)))
    for (form, ranks), proc in procs.items():
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "estimated by |B g| / |u - B g|" in proc.stdout
    for form in forms:
        one = tmp_path / f"{form}-p1"
        a, b = _final(one), _final(tmp_path / f"{form}-p2")
        assert a.step == b.step == 8
        assert max(float(np.abs(a.model[k] - b.model[k]).max()) for k in a.model) < 1e-9, form
        # Resumed from the checkpoint inside the second level: bitwise the uninterrupted run.
        for path in checkpoint_files(one / "checkpoints"):
            if load_checkpoint(path).step > 6:
                path.unlink()
        proc = run_cli(*args(form, 1))
        assert proc.returncode == 0, proc.stderr
        c = _final(one)
        assert c.step == 8 and all(np.array_equal(a.model[k], c.model[k]) for k in a.model), form
