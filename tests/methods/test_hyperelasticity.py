"""The Neo-Hookean families (diffnet/families/hyperelasticity.py): the energy and its tangent stencil (against
autograd's exact Hessian-vector products, and linear elasticity at rest), the guard where an element inverts, the
Newton solve (against an independent scikit-fem assembly of the same energy), the coarse minimiser on a solid,
and bad input refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import ROOT, run_cli
from diffnet.discretisation.elasticity import elasticity_stencil
from diffnet.discretisation.hyperelasticity import J_GUARD, neo_hookean_energy, neo_hookean_stencil, smallest_jacobian
from diffnet.multigrid.stencil import apply_stencil
from diffnet.families.hyperelasticity import HyperelasticityFamily, Hyperelasticity3DFamily
from diffnet.solvers.hyperelasticity import NewtonStats

CONFIG = str(ROOT / "configs" / "hyperelasticity.toml")


def _exact_products(u, shear, nu, spacing, v):
    """H(u) v by differentiating the energy's gradient once more (autograd, exact)."""
    w = u.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(neo_hookean_energy(w, shear, nu, spacing).sum(), w, create_graph=True)
    (hv,) = torch.autograd.grad(g, w, grad_outputs=v)
    return hv


@pytest.mark.parametrize("grid", [(7, 6), (5, 4, 5)], ids=["2-D", "3-D"])
@pytest.mark.parametrize("size", [0.01, 2.0], ids=["moderate", "inverted"])
def test_the_tangent_stencil_is_the_energys_hessian(grid, size):
    dims = len(grid)
    g = torch.Generator().manual_seed(0)
    shear = torch.exp(0.3 * torch.randn(2, *grid, dtype=torch.float64, generator=g))
    nu = torch.tensor([0.3, 0.45], dtype=torch.float64)
    spacing = tuple(1.0 / (n - 1) for n in reversed(grid))
    u = size * torch.randn(2, dims, *grid, dtype=torch.float64, generator=g)
    if size > 1:  # the guard's region: elements inverted, the energy and its derivatives finite
        assert float(smallest_jacobian(u, spacing).max()) < 0
        assert torch.isfinite(neo_hookean_energy(u, shear, nu, spacing)).all()
    else:
        assert float(smallest_jacobian(u, spacing).min()) > J_GUARD
    v = torch.randn(2, dims, *grid, dtype=torch.float64, generator=g)
    exact = _exact_products(u, shear, nu, spacing, v)
    stencil = neo_hookean_stencil(u, shear, nu, spacing)
    assert torch.isfinite(exact).all()
    assert float((apply_stencil(stencil, v) - exact).abs().max()) <= 1e-12 * float(exact.abs().max())


@pytest.mark.parametrize("grid", [(7, 6), (5, 4, 5)], ids=["2-D", "3-D"])
def test_at_rest_the_solid_is_linear_elasticity(grid):
    dims = len(grid)
    shear = torch.exp(0.3 * torch.randn(2, *grid, dtype=torch.float64, generator=torch.Generator().manual_seed(1)))
    nu = torch.tensor([0.2, 0.4], dtype=torch.float64)
    spacing = tuple(1.0 / (n - 1) for n in reversed(grid))
    young = 2.0 * shear * (1.0 + nu.reshape(-1, *([1] * dims)))
    linear = elasticity_stencil(young, nu, spacing, "strain")
    rest = neo_hookean_stencil(torch.zeros(2, dims, *grid, dtype=torch.float64), shear, nu, spacing)
    assert float((rest - linear).abs().max()) <= 1e-13 * float(linear.abs().max())


def test_newton_agrees_with_scikit_fem_on_the_same_energy():
    # An independent assembly: scikit-fem's vector Q1 basis on a quad mesh, the Neo-Hookean first Piola-Kirchhoff
    # stress and its tangent written from the formulas, Newton to 1e-11; against the family's solution on 17x17.
    skfem = pytest.importorskip("skfem")
    from skfem.helpers import ddot, det, grad, inv, transpose

    n = 17
    family = HyperelasticityFamily((n, n))
    p = np.array([0.5, -0.4, 0.3, -0.2, 0.18])
    ours = family.reference(p[None])[0]  # (2, n, n), [y, x]
    mu_grid = family.shear_modulus(torch.as_tensor(p[None]))[0].numpy()
    lam_ratio = 2 * family.nu / (1 - 2 * family.nu)

    mesh = skfem.MeshQuad.init_tensor(np.linspace(0, 1, n), np.linspace(0, 1, n))
    basis = skfem.Basis(mesh, skfem.ElementVector(skfem.ElementQuad1()), intorder=3)
    scalar = basis.with_element(skfem.ElementQuad1())
    index = np.rint(mesh.p * (n - 1)).astype(int)  # each mesh node's (x, y) grid index
    mu = scalar.interpolate(mu_grid[index[1], index[0]][scalar.nodal_dofs[0].argsort().argsort()])

    def piola(F, mu_q):
        J, Finv_T = det(F), transpose(inv(F))
        return mu_q * (F - Finv_T) + lam_ratio * mu_q * np.log(J) * Finv_T

    @skfem.LinearForm
    def residual(v, w):
        F = grad(w["u"]) + np.eye(2)[:, :, None, None]
        return ddot(piola(F, w["mu"]), grad(v))

    @skfem.BilinearForm
    def tangent(du, v, w):
        F = grad(w["u"]) + np.eye(2)[:, :, None, None]
        Finv = inv(F)
        J, Finv_T, G = det(F), transpose(Finv), grad(du)
        lam = lam_ratio * w["mu"]
        # dP[dF] = mu dF + (mu - lam ln J) F^-T dF^T F^-T + lam (F^-T : dF) F^-T
        dP = (w["mu"] * G + (w["mu"] - lam * np.log(J)) * np.einsum("ij...,kj...,kl...->il...", Finv_T, G, Finv_T)
              + lam * ddot(Finv_T, G) * Finv_T)
        return ddot(dP, grad(v))

    right = skfem.FacetBasis(mesh, basis.elem, facets=mesh.facets_satisfying(lambda x: np.isclose(x[0], 1.0)),
                             intorder=3)

    @skfem.LinearForm
    def traction(v, w):
        return p[-1] * (v[0] - v[1])

    clamped = basis.get_dofs(lambda x: np.isclose(x[0], 0.0)).all()
    load = skfem.asm(traction, right)
    x = np.zeros(basis.N)
    for _ in range(30):
        u = basis.interpolate(x)
        r = skfem.asm(residual, basis, u=u, mu=mu) - load
        dx = skfem.solve(*skfem.condense(skfem.asm(tangent, basis, u=u, mu=mu), -r, D=clamped))
        x += dx
        if np.abs(dx).max() < 1e-12:
            break
    nodes = basis.nodal_dofs  # (2, nodes): the x and y displacement dofs at each mesh node
    theirs = np.zeros_like(ours)
    for c in range(2):
        theirs[c, index[1], index[0]] = x[nodes[c]]
    assert np.abs(theirs - ours).max() <= 1e-7 * np.abs(ours).max()
    assert np.abs(ours).max() > 0.1  # a large deformation: the linear answer is off by 10 % or more here


def test_a_nonlinear_answer_where_the_linear_one_is_wrong():
    family = HyperelasticityFamily((17, 17))
    p = np.array([0.0, 0.0, 0.0, 0.0, family.load_range[0]])
    stats = NewtonStats()
    nonlinear = family.solve(p, stats=stats)
    shear = family.shear_modulus(torch.as_tensor(p[None]))[0].numpy()
    from diffnet.solvers.elasticity import elasticity_system

    linear = elasticity_system(2 * shear * (1 + family.nu), family.nu, family.boundaries, "strain")
    linear = type(linear)(linear.K, p[-1] * linear.load, linear.fixed, linear.values, linear.shape).solve("direct")
    assert np.linalg.norm(linear - nonlinear) >= 0.1 * np.linalg.norm(nonlinear)
    assert 3 <= stats.newton_steps <= 15 and stats.load_steps == 1


def test_the_coarse_minimiser_of_a_solid_is_the_dense_oracles():
    from oracles import dense_newton
    from diffnet.multigrid.minimiser import coarse_minimiser

    family = HyperelasticityFamily((9, 9))
    p = torch.as_tensor(family.sample(2, "random", 1))
    u = family.field(0.005 * torch.randn(2, 2, 9, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(3)), p)
    corrected = coarse_minimiser(family, u, p, 5)
    expected = dense_newton(family, u, p, 5)
    assert float((corrected - expected).abs().max()) <= 1e-9 * float(expected.abs().max())
    assert bool(family.admissible(corrected, p).all())


def test_the_3d_family_solves_and_corrects():
    from diffnet.multigrid.minimiser import minimise_on_coarse_space

    family = Hyperelasticity3DFamily((5, 5, 5))
    p = torch.as_tensor(family.sample(1, "random", 2))
    floor = torch.as_tensor(family.reference(p.numpy()))
    assert floor.shape == (1, 3, 5, 5, 5) and float(floor.abs().max()) > 0.01
    w, _, iterations = minimise_on_coarse_space(family, floor, p, 3)
    assert float((w - floor).abs().max()) <= 1e-9 * float(floor.abs().max()) and int(iterations.max()) <= 1


@pytest.mark.parametrize("settings, message", [
    (["hyperelasticity.nu=0.5"], "hyperelasticity.nu: need -1 < nu < 0.5"),
    (["hyperelasticity.shear=-1.0"], "hyperelasticity.shear"),
    # pushed (not pulled) at x = 1 ten times harder than the configs: the body buckles and crushes
    (["hyperelasticity.x1=traction=-1,0", "hyperelasticity.load_range=[0.1,2.0]"],
     "hyperelasticity.load_range: the largest load 2 on the mean body: Newton did not converge"),
], ids=["incompressible", "negative modulus", "crushing load"])
def test_bad_input_is_one_line_and_writes_nothing(settings, message, tmp_path):
    sets = [arg for setting in settings for arg in ("--set", setting)]
    proc = run_cli("train", CONFIG, *sets, "--out", str(tmp_path / "run"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_tiny_run_is_compared_and_studied_with_newton_counted(tmp_path):
    # Train the family a few steps with the coarse minimiser, then `compare` (the classical side: Newton with AMG-CG,
    # its steps in the row and the table) and `uq --classical` on it.
    import json

    run = tmp_path / "run"
    proc = run_cli("train", CONFIG, "--out", str(run), "--set", "problem.resolution=[17,17]",
                   "--set", "multigrid.levels=[9,17]", "--set", "multigrid.epochs=[2,1]", "--set", "model.channels=[8,16]",
                   "--set", "multigrid.top_channels=8", "--set", "model.coarse_correction=5", "--set", "data.n_train=16",
                   "--set", "data.n_test=2", "--set", "train.batch_size=8", "--set", "output.plots=false",
                   "--set", "parallel.threads_per_rank=1", timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "coarse Newton" in proc.stdout  # the iterations per instance, in the training line and the evaluation
    out = tmp_path / "cmp" / "report.json"
    proc = run_cli("compare", str(run), "--samples", "2", "--threads", "1", "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    row = report["rows"][0]
    assert row["coarse_newton_steps"] >= 1 and row["classical_newton_steps"] >= 1
    assert all(point["newton_steps"] >= 1 for point in report["search"])
    assert "Newton steps)" in out.with_suffix(".md").read_text()
    proc = run_cli("uq", str(run), "--samples", "4", "--classical", "--out", str(tmp_path / "uq.h5"), timeout=600)
    assert proc.returncode == 0, proc.stderr


def test_a_start_newton_cannot_finish_from_falls_back_to_the_load_steps_from_rest():
    """A warm start (a neighbour's solution) far from this instance's: Newton at the full load fails from it, and the
    solve goes on from rest by load steps (an inverse problem's chain met a start Newton could not leave), reaching the
    same minimiser; a good start is taken as it is."""
    family = HyperelasticityFamily((9, 9))
    body = family.body(np.array([0.615, 0.193, -0.496, -0.942, 0.2]))
    u = body.solve(1e-10, 1e-10, linear="cholesky")
    stats = NewtonStats()
    far = body.solve(1e-10, 1e-10, start=5 * u, linear="cholesky", stats=stats)
    assert stats.failed_fractions == [1.0] and stats.load_steps >= 2
    np.testing.assert_allclose(far, u, rtol=0, atol=1e-9 * np.abs(u).max())
    near = NewtonStats()
    body.solve(1e-10, 1e-10, start=u, linear="cholesky", stats=near)
    assert near.failed_fractions == [] and near.load_steps == 1 and near.newton_steps <= 1
