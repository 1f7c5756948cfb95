"""The generator's exact coarse-space correction (diffnet/multigrid/coarse.py, ``model.coarse_correction``): the
energy's minimiser over u~ + range(P), its gradient, the FEM solution left alone, and every command
that runs a model running it."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from deepfusion import InputError
from test_sensitivity import _agrees_with_central_differences
from helpers import ROOT, float32_atol, run_cli, run_cli_jobs
from diffnet.multigrid.hessian import hessian_of
from diffnet.multigrid.coarse import CoarseSpace, coarse_correction, coarse_grid
from diffnet.product.corrected import CoarseCorrected
from diffnet.families.elasticity import ElasticityFamily, Elasticity3DFamily
from diffnet.families.plate import PlateWithHoleFamily
from diffnet.families.poisson import PoissonFamily
from diffnet.families.poisson3d import Poisson3DFamily
from diffnet.families.reaction_diffusion import ReactionDiffusionFamily
from diffnet.families.torsion import StarTorsionFamily

POISSON = str(ROOT / "configs" / "poisson.toml")
RNG = np.random.default_rng(7)


def _kl(family, n):
    return torch.as_tensor(RNG.uniform(-3, 3, (n, 6)))


def _drawn(family, n):
    return torch.as_tensor(family.sample(n, "random", 3))


def _dense_minimiser(family, u_tilde: torch.Tensor, params: torch.Tensor, nodes: int) -> torch.Tensor:
    """u~ + P c with c minimising the family's summed loss over the coarse space, by a dense Newton step in c
    (autograd's Hessian in c; exact for a quadratic loss): an oracle that shares nothing with the code's A_c."""
    space = CoarseSpace.build(family, u_tilde, params, nodes)
    fields = tuple(u_tilde.shape[1 : u_tilde.ndim - len(family.resolution)])  # (C,) for C unknowns, () for one
    coarse, grid = fields + coarse_grid(family.resolution, nodes), tuple(u_tilde.shape[1:])
    n, out = int(np.prod(coarse)), []
    for k in range(len(params)):
        columns = []
        for j in range(n):  # P's column j of sample k: the prolonged unit vector
            e = torch.zeros(len(params), n, dtype=torch.float64)
            e[k, j] = 1.0
            columns.append(space.prolong(e.reshape(len(params), *coarse))[k].reshape(-1))
        P = torch.stack(columns, 1)  # (fine nodes, coarse nodes)

        def energy(c):
            v = (u_tilde[k].reshape(-1) + P @ c).reshape(1, *grid)
            return sum(t.sum() for t in family.loss_terms(v, params[k : k + 1]).values())

        c0 = torch.zeros(n, dtype=torch.float64)
        hessian = torch.autograd.functional.hessian(energy, c0)
        gradient = torch.autograd.functional.jacobian(energy, c0)
        used = P.abs().sum(0) > 0  # coarse nodes whose basis function lies on free nodes
        c = torch.zeros(n, dtype=torch.float64)
        c[used] = -torch.linalg.solve(hessian[used][:, used], gradient[used])
        out.append((u_tilde[k].reshape(-1) + P @ c).reshape(grid))
    return torch.stack(out)


@pytest.mark.parametrize("family, params, nodes", [
    (PoissonFamily((20, 20)), _kl, 7),  # 19 intervals on 6: grids that do not nest
    (PoissonFamily((17, 17)), _kl, 5),
    (Poisson3DFamily((11, 11, 11)), _kl, 4),
    (ReactionDiffusionFamily((17, 17)), _drawn, 5),
    (StarTorsionFamily((24, 24)), _drawn, 7),  # a cut domain: nodes outside are fixed
    (PlateWithHoleFamily((24, 24)), _drawn, 7),
    (ElasticityFamily((14, 13)), _drawn, 5),  # two unknowns: the block Hessian, P on each component
    (Elasticity3DFamily((7, 7, 6)), _drawn, 4),
    (Elasticity3DFamily((9, 9, 9)), _drawn, 5),  # grids that nest: A_c's band read one node apart
], ids=["poisson-20-7", "poisson-17-5", "poisson3d-11-4", "reaction_diffusion", "torsion", "plate", "elasticity",
        "elasticity3d", "elasticity3d-nested"])
def test_the_correction_is_the_energys_minimiser_over_the_coarse_space(family, params, nodes):
    p = params(family, 2)
    raw = torch.randn(2, len(family.unknowns), *family.resolution, dtype=torch.float64,
                      generator=torch.Generator().manual_seed(1))
    u_tilde = family.field(raw, p)
    corrected = coarse_correction(family, u_tilde, p, nodes)
    expected = _dense_minimiser(family, u_tilde, p, nodes)
    scale = float(expected.abs().max())
    assert float((corrected - expected).abs().max()) <= 1e-10 * scale
    assert not torch.allclose(corrected, u_tilde)  # it did something


def _example_family(module: str, name: str):
    """A family class of examples/families/MODULE, imported from its folder."""
    sys.path.insert(0, str(ROOT / "examples" / "families" / module))
    try:
        return getattr(__import__(module), name)
    finally:
        sys.path.pop(0)


def test_a_nonlinear_loss_gets_one_coarse_newton_step():
    family = _example_family("cubic_reaction", "CubicReaction")((17, 17))
    p = _drawn(family, 2)
    u_tilde = family.field(torch.randn(2, 1, 17, 17, dtype=torch.float64, generator=torch.Generator().manual_seed(2)), p)
    corrected = coarse_correction(family, u_tilde, p, 5)
    expected = _dense_minimiser(family, u_tilde, p, 5)  # one Newton step in c, the exact Hessian
    # The family's Hessian is probed by central differences: exact for a quadratic, O(step^2) for u^3.
    assert float((corrected - expected).abs().max()) <= 1e-6 * float(expected.abs().max())


def test_a_plugins_two_unknowns_take_the_probed_block_hessian():
    # docs/families.md's two coupled species declare `precondition` and write no `hessian`: the default
    # probes read the 2 x 2 block stencil off the loss, and the correction is the energy's coarse minimiser.
    family = _example_family("two_species", "TwoSpecies")((13, 13))
    p = torch.tensor([[2.0, 0.8], [7.0, 0.4]], dtype=torch.float64)
    u_tilde = family.field(torch.randn(2, 2, 13, 13, dtype=torch.float64, generator=torch.Generator().manual_seed(3)), p)
    assert not hasattr(family, "hessian")
    stencil = hessian_of(family, u_tilde, p)
    assert stencil.shape == (2, 2, 2, 9, 13, 13) and stencil[:, 0, 1].abs().max() > 0  # the species are coupled
    corrected = coarse_correction(family, u_tilde, p, 5)
    expected = _dense_minimiser(family, u_tilde, p, 5)
    assert float((corrected - expected).abs().max()) <= 1e-9 * float(expected.abs().max())
    fem = torch.as_tensor(family.reference(p.numpy()))  # and the grid's own solution is left alone
    assert float((coarse_correction(family, fem, p, 5) - fem).abs().max()) <= 1e-10 * float(fem.abs().max())


@pytest.mark.parametrize("family", [PoissonFamily((17, 17)), Poisson3DFamily((9, 9, 9))], ids=["2-D", "3-D"])
def test_the_fem_solution_is_left_unchanged(family):
    p = _kl(family, 2)
    fem = torch.as_tensor(family.reference(p.numpy(), method="direct"))
    assert float((coarse_correction(family, fem, p, 5) - fem).abs().max()) <= 1e-12 * float(fem.abs().max())


def test_the_gradient_is_the_transpose_of_the_corrections_jacobian():
    family = PoissonFamily((7, 7))
    p = _kl(family, 1)
    u = family.field(torch.randn(1, 1, 7, 7, dtype=torch.float64), p).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda v: coarse_correction(family, v, p, 4), (u,), eps=1e-6, atol=1e-8, rtol=1e-6)


def test_through_the_energy_the_gradient_is_the_energys_at_the_corrected_field():
    # P^T grad E(u) = 0 at the corrected u, so d E(u(u~)) / d u~ = grad E(u): no backward through the solve needed.
    family = PoissonFamily((33, 33))
    p = _kl(family, 3)
    u_tilde = family.field(torch.randn(3, 1, 33, 33, dtype=torch.float64), p).requires_grad_(True)
    corrected = coarse_correction(family, u_tilde, p, 9)
    (through,) = torch.autograd.grad(family.loss_terms(corrected, p)["energy"].sum(), u_tilde)
    at = corrected.detach().requires_grad_(True)
    (direct,) = torch.autograd.grad(family.loss_terms(at, p)["energy"].sum(), at)
    assert float((through - direct).abs().max()) <= 1e-12 * float(direct.abs().max())


def test_a_float32_field_is_corrected_in_float64_and_returned_in_float32():
    family = PoissonFamily((33, 33))
    p = _kl(family, 2)
    u64 = family.field(torch.randn(2, 1, 33, 33, dtype=torch.float64), p)
    out = coarse_correction(family, u64.float(), p.float(), 9)
    assert out.dtype == torch.float32
    exact = coarse_correction(family, u64.float().double(), p.float().double(), 9)
    # The same float64 computation from the same float32 inputs; only the result is rounded to float32.
    assert float((out.double() - exact).abs().max()) <= 2**-23 * float(exact.abs().max())


def test_the_wrapper_keeps_the_familys_fixed_nodes_and_members():
    family = PoissonFamily((17, 17))
    wrapped = CoarseCorrected(family, family, 9)
    p = _kl(family, 1)
    from diffnet.multigrid.hessian import fixed_nodes

    assert torch.equal(fixed_nodes(wrapped, p, torch.float64), fixed_nodes(family, p, torch.float64))
    assert wrapped.name == "poisson" and wrapped.resolution == (17, 17) and wrapped.coarse_text() == "9x9"
    assert wrapped.at_resolution((9, 9)).coarse_text() == "5x5"  # at most half the level's intervals
    assert coarse_grid((128, 128), 17) == (17, 17) and coarse_grid((16, 16), 17) == (8, 8)
    with pytest.raises(NotImplementedError, match="domain split"):
        wrapped.tile_loss_terms(None, p, None)


@pytest.mark.parametrize("overrides, message", [
    (["problem.family=burgers", "burgers.residual=sobel"],
     "model.coarse_correction: the burgers family (as configured): its loss is a loss of no declared kind (neither "
     "diffnet.Energy nor diffnet.Residual), and the coarse correction needs an energy (diffnet.Energy: its minimiser "
     "over u~ + range(P), one solve if quadratic, else damped Newton) or a residual's squares (diffnet.Residual: its "
     "least-squares minimiser over u~ + range(P), Gauss-Newton) (its lever against a smooth error is "
     "burgers.preconditioner); use 0"),
    (["problem.family=burgers", "train.loss=preconditioned"],
     "train.loss: the burgers family (as configured): its loss is a residual's squares (diffnet.Residual), and the "
     "preconditioned loss needs an energy"),
    (["parallel.domain=[2]"], "model.coarse_correction: needs each sample whole"),
    (["model.coarse_correction=2"], "model.coarse_correction: must be 0 (off) or at least 3"),
])
def test_what_cannot_take_the_correction_is_refused_in_one_line(tmp_path, overrides, message):
    config = POISSON if "problem.family=burgers" not in overrides else str(ROOT / "configs" / "burgers.toml")
    sets = [a for o in ["model.coarse_correction=9", "train.second_stage_epochs=0", "train.loss=family",
                        *[x for x in overrides if not x.startswith("problem.family")]] for a in ("--set", o)]
    proc = run_cli("train", config, "--out", str(tmp_path / "r"), *sets)
    assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "r").exists()


# A two-level 17^2 Poisson run with the correction on 5^2 (9^2 capped at half of 8 intervals on the coarse level).
RUN = ["--set", "problem.resolution=[17,17]", "--set", "multigrid.levels=[9,17]", "--set", "multigrid.epochs=[2,2]",
       "--set", "model.channels=[4,8]", "--set", "multigrid.top_channels=4", "--set", "data.n_train=16",
       "--set", "data.n_test=2", "--set", "train.batch_size=8", "--set", "train.log_every=1",
       "--set", "train.checkpoint_every=2", "--set", "parallel.threads_per_rank=1", "--set", "output.plots=false",
       "--set", "model.coarse_correction=5", "--set", "train.loss=family", "--set", "train.second_stage_epochs=0"]


@pytest.fixture(scope="module")
def corrected_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("coarse") / "run"
    proc = run_cli("train", POISSON, "--out", str(run_dir), *RUN)
    assert proc.returncode == 0, proc.stderr
    return run_dir, proc.stdout


def test_training_reports_the_corrections_share_and_evaluates_its_fields(corrected_run):
    run_dir, stdout = corrected_run
    # configs/poisson.toml's 8 sweeps, after the correction on 5x5 (9x9 capped at half of 8 intervals)
    chain = ("U-Net deepened by 1 level -> coarse correction on 5x5 (one kept solve) -> 8 symmetric Gauss-Seidel "
             "sweeps")
    assert f"product: {chain} (the first stage trains" in stdout and f"\nproduct: {chain}\n" in stdout
    assert "the coarse correction" in stdout.split("trained ", 1)[1].splitlines()[0]
    assert "the coarse correction and its sweeps" in stdout.split("\ninference ", 1)[1].splitlines()[0]
    from deepfusion import Surrogate
    from diffnet.product.product import Product
    import h5py

    with h5py.File(run_dir / "test_prediction.h5") as f:
        held, params = f["u"][()], f["a"][()]
    surrogate = Surrogate.load(run_dir)
    family = surrogate.family
    plain = Product(family, surrogate.product.model).fields(params)  # the network's own field, uncorrected
    expected = coarse_correction(family, torch.as_tensor(plain), torch.as_tensor(params), 5, sweeps=8).numpy()
    np.testing.assert_allclose(held, expected, rtol=0, atol=1e-6 * np.abs(expected).max())
    # The Python API runs it too (another thread count than the run's: float32 rounding apart, conftest).
    np.testing.assert_allclose(surrogate.fields(params), held, rtol=0, atol=float32_atol(run_dir, np.abs(held).max()))
    assert not np.allclose(plain, held, atol=1e-4)


def test_infer_uq_compare_and_polish_run_the_corrected_generator(corrected_run, tmp_path):
    run_dir, _ = corrected_run
    import h5py

    with h5py.File(run_dir / "test_prediction.h5") as f:
        held, params = f["u"][()], f["a"][()]
    np.save(tmp_path / "a.npy", params)
    proc = run_cli("infer", str(run_dir), "--param", "a=" + str(tmp_path / "a.npy"), "--out", str(tmp_path / "u.h5"))
    assert proc.returncode == 0, proc.stderr
    with h5py.File(tmp_path / "u.h5") as f:
        np.testing.assert_allclose(f["u"][()], held, rtol=0, atol=float32_atol(run_dir, np.abs(held).max()))
    proc = run_cli("compare", str(run_dir), "--samples", "2", "--threads", "1", "--polish", "1",
                   "--out", str(tmp_path / "c.json"))
    assert proc.returncode == 0, proc.stderr
    rows = json.loads((tmp_path / "c.json").read_text())["rows"]
    product = "DiffNet + coarse correction, 8 sweeps"  # configs/poisson.toml's sweeps (model.sweeps)
    assert [r["product"] for r in rows] == [product, f"{product} + 1 V-cycle"]
    assert rows[0]["diffnet_error"] == pytest.approx(json.loads((run_dir / "eval.json").read_text())["mean_rel_l2"],
                                                     rel=1e-6)
    proc = run_cli("uq", str(run_dir), "--samples", "8", "--batch", "4", "--out", str(tmp_path / "s.h5"))
    assert proc.returncode == 0, proc.stderr


def test_a_surrogate_forgets_its_kept_coarse_spaces_as_the_user_guide_times_it(corrected_run):
    import h5py

    import diffnet.multigrid.coarse as coarse
    from deepfusion import Surrogate

    run_dir, _ = corrected_run
    with h5py.File(run_dir / "test_prediction.h5") as f:
        a = f["a"][()][:3]
    poisson = Surrogate.load(run_dir)
    kept = poisson(a=a)
    assert len(coarse._SPACES) >= len(a)
    guide = (ROOT / "docs" / "user-guide.md").read_text()
    snippet = guide[guide.index("poisson.clear_caches()"):].split("```")[0]
    scope = {"poisson": poisson, "a": a}
    exec("import time\n" + snippet, scope)  # the user guide's lines, as written
    assert scope["seconds_per_instance"] > 0
    np.testing.assert_array_equal(scope["u"], kept)  # the fields are the same; only the set-up was paid again
    poisson.clear_caches()
    assert len(coarse._SPACES) == 0


def test_the_preconditioned_loss_and_a_second_stage_compose_with_it(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli("train", POISSON, "--out", str(run_dir), *RUN, "--set", "train.loss=preconditioned",
                   "--set", "train.second_stage_epochs=2")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((run_dir / "eval.json").read_text())
    assert np.isfinite(report["ratio_to_floor"]) and report["first_stage_ratio_to_floor"] > 0
    # Where the product's time went, part by part: both networks, the correction's parts, the V-cycle.
    parts = report["inference_parts_per_instance_s"]
    assert {"network", "fine Hessian", "coarse operator A_c", "factorisation", "coarse solves", "V-cycle"} <= set(parts)
    assert all(v > 0 for v in parts.values())
    # compare times the two-stage product and its first stage alone (one network, no V-cycle), each matched.
    proc = run_cli("compare", str(run_dir), "--samples", "2", "--threads", "1", "--polish", "1",
                   "--out", str(tmp_path / "c.json"))
    assert proc.returncode == 0, proc.stderr
    rows = json.loads((tmp_path / "c.json").read_text())["rows"]
    product = "DiffNet + coarse correction, 8 sweeps"
    assert [r["product"] for r in rows] == [product, f"{product} + 1 V-cycle", f"{product}, first stage alone",
                                            f"{product}, first stage alone + 1 V-cycle"]
    assert rows[2]["diffnet_error"] == pytest.approx(np.mean(report["first_stage_rel_l2"][:2]), rel=1e-5)
    assert "V-cycle" in rows[0]["parts_per_instance_s"] and "V-cycle" not in rows[2]["parts_per_instance_s"]


@pytest.mark.parametrize("config, extra", [
    ("poisson3d.toml", ["--set", "problem.resolution=[9,9,9]", "--set", "multigrid.levels=[]", "--set",
                        "model.channels=[4,8]", "--set", "model.coarse_correction=3"]),
    ("reaction_diffusion.toml", ["--set", "problem.resolution=[17,17]", "--set", "multigrid.levels=[]"]),
    ("torsion.toml", ["--set", "problem.resolution=[24,24]", "--set", "multigrid.levels=[]"]),
    ("plate.toml", ["--set", "problem.resolution=[24,24]", "--set", "multigrid.levels=[]"]),
])
def test_every_capable_built_in_family_trains_with_it(tmp_path, config, extra):
    quick = ["--set", "model.channels=[4,8]", "--set", "data.n_train=8", "--set", "train.batch_size=4",
             "--set", "train.epochs=1", "--set", "data.n_test=1", "--set", "parallel.threads_per_rank=1",
             "--set", "output.plots=false", "--set", "model.coarse_correction=5"]
    proc = run_cli("train", str(ROOT / "configs" / config), "--out", str(tmp_path / "r"), *quick, *extra)
    assert proc.returncode == 0, proc.stderr
    assert "-> coarse correction on" in proc.stdout
    assert np.isfinite(json.loads((tmp_path / "r" / "eval.json").read_text())["ratio_to_floor"])


@pytest.mark.needs_mpiexec
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_one_and_two_ranks_train_one_model_and_resume_bitwise(tmp_path):
    from deepfusion.files.checkpoint import checkpoint_files, load_checkpoint

    args = ["train", POISSON, *RUN, "--set", "train.dtype=float64"]
    one = run_cli(*args, "--out", str(tmp_path / "p1"))
    (two,) = run_cli_jobs(2, [*args, "--out", str(tmp_path / "p2")], timeout=250)
    for proc in (one, two):
        assert proc.returncode == 0, proc.stdout + proc.stderr

    def final(run):
        return load_checkpoint(checkpoint_files(run / "checkpoints")[0])

    a, b = final(tmp_path / "p1"), final(tmp_path / "p2")
    assert a.step == b.step == 8 and b.ranks == 2
    assert max(float(np.abs(a.model[k] - b.model[k]).max()) for k in a.model) < 1e-9
    # Resumed from the checkpoint inside the second level: bitwise the uninterrupted run.
    for path in checkpoint_files(tmp_path / "p1" / "checkpoints"):
        if load_checkpoint(path).step > 6:
            path.unlink()
    proc = run_cli(*args, "--out", str(tmp_path / "p1"))
    assert proc.returncode == 0 and "(step 6)" in proc.stdout, proc.stderr
    c = final(tmp_path / "p1")
    assert all(np.array_equal(a.model[k], c.model[k]) for k in a.model)


@pytest.mark.parametrize("declared", [
    "    capabilities = ScreenedPoisson.capabilities | {'precondition'}\n",  # the earlier way, as plugins have it
    "    def loss(self):\n        return Energy(self.loss_terms)\n",  # its loss as an object (docs/families.md)
])
def test_a_users_quadratic_family_trains_with_it_through_the_probed_hessian(tmp_path, declared):
    # docs/families.md's tutorial family declared an energy with nothing else, by the capability of before or by its
    # loss object: its Hessian is probed from its loss (diffnet.multigrid.hessian), checked against autograd before
    # training, and the correction runs on every level.
    from test_families import _tutorial

    config = _tutorial(tmp_path)
    (tmp_path / "capable.py").write_text("from diffnet import Energy\nfrom screened_poisson import ScreenedPoisson\n\n\n"
                                         "class Capable(ScreenedPoisson):\n" + declared)
    proc = run_cli("train", str(config), "--out", str(tmp_path / "run"), "--set", 'problem.family="capable:Capable"',
                   "--set", "multigrid.epochs=[2,1]", "--set", "data.n_train=16", "--set", "data.n_test=2",
                   "--set", "model.channels=[4,8]", "--set", "parallel.threads_per_rank=1", "--set", "output.plots=false",
                   "--set", "model.coarse_correction=5", path=[tmp_path])
    assert proc.returncode == 0, proc.stderr
    assert "-> coarse correction on 5x5 (one kept solve)" in proc.stdout and "discrete_optimum, hessian" in proc.stdout
    assert np.isfinite(json.loads((tmp_path / "run" / "eval.json").read_text())["ratio_to_floor"])


def test_a_constant_first_built_under_inference_mode_trains_afterwards():
    # The coarse correction's fixed nodes evaluate the family's field, which keeps its lift and mask
    # (diffnet.backend.constants); built first inside torch.inference_mode (an evaluation), they must still serve a
    # later training step in the same process.
    family = PoissonFamily((13, 11))
    p = _kl(family, 2)
    with torch.inference_mode():
        coarse_correction(family, family.field(torch.zeros(2, 1, 13, 11, dtype=torch.float64), p), p, 5)
    raw = torch.randn(2, 1, 13, 11, dtype=torch.float64, requires_grad=True)
    family.loss_terms(coarse_correction(family, family.field(raw, p), p, 5), p)["energy"].sum().backward()
    assert raw.grad is not None and torch.isfinite(raw.grad).all()


# -- each instance's coarse space built once (issue 65): kept, banded, its gradient one stencil product ----------
@pytest.mark.parametrize("family", [PoissonFamily((33, 33)), ElasticityFamily((17, 17)), Poisson3DFamily((17, 17, 17))],
                         ids=["2-D", "elasticity", "3-D"])
def test_each_instance_is_factorised_once_and_its_kept_space_gives_the_fresh_correction(family):
    from diffnet.backend.clock import FACTORISATION, HESSIAN, SOLVES, PartClock
    from diffnet.multigrid.coarse import forget_coarse_spaces

    forget_coarse_spaces()
    p = _drawn(family, 3)
    raw = torch.randn(3, len(family.unknowns), *family.resolution, dtype=torch.float64,
                      generator=torch.Generator().manual_seed(4))
    u_tilde = family.field(raw, p)
    fresh = coarse_correction(family, u_tilde, p, 9)  # the linearisation at u~, built for this batch alone
    clock = PartClock()
    first = coarse_correction(family, u_tilde, p, 9, clock, quadratic=True)
    built = dict(clock.seconds)
    assert built[FACTORISATION] > 0 and built[HESSIAN] > 0
    again = coarse_correction(family, family.field(raw[[2, 0]] * 0.5, p[[2, 0]]), p[[2, 0]], 9, clock, quadratic=True)
    # The kept spaces serve other fields of the same instances: no Hessian, operator or factorisation again.
    assert {k: v for k, v in clock.seconds.items() if k != SOLVES and k != "loss gradient"} == \
        {k: v for k, v in built.items() if k != SOLVES and k != "loss gradient"}
    scale = float(first.abs().max())
    assert float((first - fresh).abs().max()) <= 1e-12 * scale
    expected = coarse_correction(family, family.field(raw[[2, 0]] * 0.5, p[[2, 0]]), p[[2, 0]], 9)
    assert float((again - expected).abs().max()) <= 1e-12 * float(expected.abs().max())
    forget_coarse_spaces()


def test_a_coarse_operator_couples_nodes_one_apart_where_the_grids_nest():
    from diffnet.multigrid.coarse import coupling_reach
    from diffnet.multigrid.vcycle import dense_interpolation

    like = torch.zeros(1, dtype=torch.float64)
    assert [coupling_reach([dense_interpolation(n, m, like)]) for n, m in ((17, 9), (65, 17), (64, 17), (32, 9))] \
        == [1, 1, 2, 2]
    family = Elasticity3DFamily((9, 9, 9))
    p = _drawn(family, 1)
    space = CoarseSpace.build(family, family.field(torch.zeros(1, 3, 9, 9, 9, dtype=torch.float64), p), p, 5)
    every = space._coarse_operator(space.hessian, reach=2)
    offsets = torch.cartesian_prod(*[torch.arange(-2, 3)] * 3).abs().amax(dim=1)
    assert float(every[..., offsets == 2].abs().max()) == 0.0 < float(every[..., offsets == 1].abs().max())
    nested = space._coarse_operator(space.hessian, reach=1)
    assert float((nested - every[..., offsets <= 1]).abs().max()) <= 1e-13 * float(every.abs().max())


def test_banded_factors_of_a_coarse_stencil_solve_as_its_dense_operator():
    from diffnet.multigrid.factor import BandedFactor, factorise_stencil, solve_factors

    rng = np.random.default_rng(5)
    coarse, c = (7, 6), 2
    n = int(np.prod(coarse))
    values = torch.as_tensor(-rng.uniform(0, 0.1, (2, c, c, n, 25)))  # couplings two nodes apart along each axis
    # The operator as a dense matrix, symmetrised, diagonally dominant: the oracle.
    dense = np.zeros((2, c * n, c * n))
    index = np.arange(n).reshape(coarse)
    offsets = [(i, j) for i in range(-2, 3) for j in range(-2, 3)]
    for a in range(c):
        for b in range(c):
            for k, (oy, ox) in enumerate(offsets):
                for y in range(coarse[0]):
                    for x in range(coarse[1]):
                        if 0 <= y + oy < coarse[0] and 0 <= x + ox < coarse[1]:
                            dense[:, a * n + index[y, x], b * n + index[y + oy, x + ox]] = values[:, a, b, index[y, x], k]
    dense = 0.5 * (dense + dense.transpose(0, 2, 1))
    shift = np.abs(dense).sum(2) + 1.0
    for a in range(c):  # the centre entries carry the dominance
        values[:, a, a, :, 12] += torch.as_tensor(shift[:, a * n:(a + 1) * n])
    dense[:, np.arange(c * n), np.arange(c * n)] += shift
    values = values.clone()
    for a in range(c):  # the stencil of the symmetrised operator (each coupling as the oracle holds it)
        for b in range(c):
            for k, (oy, ox) in enumerate(offsets):
                for y in range(coarse[0]):
                    for x in range(coarse[1]):
                        if 0 <= y + oy < coarse[0] and 0 <= x + ox < coarse[1]:
                            values[:, a, b, index[y, x], k] = torch.as_tensor(
                                dense[:, a * n + index[y, x], b * n + index[y + oy, x + ox]])
    keep = torch.ones(2, c * n, dtype=torch.bool)
    keep[1, 5] = False  # a coarse unknown without a free node under it: an identity row
    dense[1, 5, :] = dense[1, :, 5] = 0.0
    dense[1, 5, 5] = 1.0
    factors = factorise_stencil(values, keep, coarse, "A")
    assert all(isinstance(f, BandedFactor) for f in factors) and factors[0].band.shape[0] < c * n // 2
    rhs = torch.as_tensor(rng.normal(size=(2, c * n, 1)))
    expected = np.linalg.solve(dense, rhs.numpy())
    np.testing.assert_allclose(solve_factors(factors, rhs).numpy(), expected, rtol=0, atol=1e-12 * np.abs(expected).max())
    with pytest.raises(ValueError, match=r"^A is not positive definite for instance\(s\) \[1\]$"):
        factorise_stencil(torch.stack([values[0], -values[0]]), keep[[0, 0]], coarse, "A")


def test_a_batch_larger_than_the_cache_is_served_whole(monkeypatch):
    # The least recently used spaces go first when the budget is full, this batch's own hits among them: the batch
    # is assembled from what it holds, never read back from the cache (a KeyError ended a training run once).
    import diffnet.multigrid.coarse as coarse

    family = PoissonFamily((17, 17))
    coarse.forget_coarse_spaces()
    p = _kl(family, 4)
    u = family.field(torch.zeros(4, 1, 17, 17, dtype=torch.float64), p)
    coarse_correction(family, u[:2], p[:2], 5, quadratic=True)  # two kept
    one = next(iter(coarse._SPACES.values())).nbytes
    from diffnet.backend import budget

    # room for two in the coarse spaces' share, and the batch brings four
    monkeypatch.setattr(budget, "_BUDGET", [int(2.5 * one / budget.SHARES["coarse spaces"])])
    corrected = coarse_correction(family, u, p, 5, quadratic=True)
    expected = coarse_correction(family, u, p, 5)
    assert float((corrected - expected).abs().max()) <= 1e-12 * float(expected.abs().max())
    assert len(coarse._SPACES) <= 2
    coarse.forget_coarse_spaces()


@pytest.mark.slow  # a process of its own (torch's import) and twelve arms' inference and truths: about 5 s
def test_the_sweeps_benchmark_measures_each_design_on_a_trained_run(corrected_run, tmp_path):
    """benchmarks/sweeps.py end to end at its smoke size, as the user guide runs it: one row per arm (sweep counts,
    cycles, a finer coarse grid), each with the field's, the energy norm's and every derived field's ratio to its floor
    and the product's time; with --from-lift the same arms again from the boundary data's lift, no network."""
    import subprocess

    run_dir, _ = corrected_run
    out = tmp_path / "sweeps.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sweeps.py"), str(run_dir), "--sweeps", "0", "2",
                           "--cycles", "1", "2", "--coarse", "7", "--from-lift", "--samples", "2", "--batch", "2",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    arms = ["coarse 5, 0 sweeps", "coarse 5, 2 sweeps", "coarse 5, 2 sweeps x 2",
            "coarse 7, 0 sweeps", "coarse 7, 2 sweeps", "coarse 7, 2 sweeps x 2"]
    assert [r["arm"] for r in rows] == arms + [f"lift: {arm}" for arm in arms]
    by_arm = {r["arm"]: r["ratios_to_floor"]["field"] for r in rows}
    assert by_arm["coarse 5, 0 sweeps"] != by_arm["lift: coarse 5, 0 sweeps"]  # the network's field, then none
    for row in rows:
        assert {"field", "energy norm", "flux_x", "flux_y"} <= set(row["ratios_to_floor"]) and row["ms_per_instance"] > 0
    # The floor and the truth are the same for every arm: only the product changed.
    assert len({r["ratios_to_floor"]["floor"] for r in rows}) == 1


@pytest.fixture(scope="module")
def float64_surrogate(corrected_run):
    from deepfusion import Surrogate

    s = Surrogate.load(corrected_run[0])
    s.product.model.double()  # float64 weights: central differences to 1e-6 (the product runs in the weights' dtype)
    return s


def test_a_trained_runs_product_is_differentiable_in_its_instances(float64_surrogate):
    assert float64_surrogate.product.finished.sweeps == 8  # the correction and its sweeps are in the product
    points = [[0.3, 0.6], [0.71, 0.22], [0.5, 0.5]]
    a0 = torch.as_tensor(np.random.default_rng(0).uniform(-2, 2, (2, 6)))
    w = torch.as_tensor(np.random.default_rng(1).standard_normal((2, 3)))
    f = lambda a: (float64_surrogate.evaluate(a, points=points) * w).sum()  # noqa: E731
    a = a0.clone().requires_grad_(True)
    f(a).backward()
    _agrees_with_central_differences(f, a0, a.grad)
    # The values are the numpy call's, read at the points.
    np.testing.assert_allclose(float64_surrogate.evaluate(a0, points=points).detach().numpy(),
                               float64_surrogate.at(points, a=a0.numpy()), rtol=0, atol=1e-12)
    # The Jacobian: each row the gradient of one value.
    jac = float64_surrogate.jacobian(a0.numpy(), points=points)
    assert jac.shape == (2, 3, 6)
    np.testing.assert_allclose(np.einsum("spm,sp->sm", jac, w.numpy()), a.grad.numpy(), rtol=1e-10, atol=1e-14)


def test_evaluate_refuses_what_it_cannot_differentiate_in_one_line(float64_surrogate):
    with pytest.raises(InputError, match="evaluate takes a torch tensor"):
        float64_surrogate.evaluate(np.zeros((1, 6)))
    with pytest.raises(InputError, match="each instance must have shape"):
        float64_surrogate.evaluate(torch.zeros(1, 5, dtype=torch.float64))
    with pytest.raises(InputError, match="points"):
        float64_surrogate.evaluate(torch.zeros(1, 6, dtype=torch.float64), points=[[1.5, 0.5]])
    # A tensor that requires grad goes to evaluate, and the numpy call says so.
    with pytest.raises(InputError, match="Surrogate.evaluate"):
        float64_surrogate(a=torch.zeros(1, 6, requires_grad=True))
