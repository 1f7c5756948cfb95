"""The KL diffusivity family and the Poisson / reaction-diffusion problems (boundaries, losses, sampling)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from diffnet.protocol.family import sample_box
from diffnet.instances.kl import kl_basis
from diffnet.instances.kl import kl_modes, kl_roots
from diffnet.families.poisson import PoissonFamily
from diffnet.families.reaction_diffusion import ReactionDiffusionFamily


def test_kl_roots_match_the_tabulated_values():
    w = kl_roots(0.5, 6)
    np.testing.assert_allclose(w, [1.7207, 4.0575, 6.8512, 9.8264, 12.8746, 15.9573], atol=1e-4)


@pytest.mark.parametrize("eta", [0.1, 0.5, 1.0, 3.0])
def test_kl_roots_solve_the_equation_for_any_eta(eta):
    w = kl_roots(eta, 10)
    assert np.all(np.diff(w) > 0) and w[0] > 0
    # One root in each interval (k pi, (k + 1) pi).
    np.testing.assert_array_equal(np.floor(w / np.pi), np.arange(10))
    lhs = (eta**2 * w**2 - 1) * np.sin(w)
    rhs = 2 * eta * w * np.cos(w)
    np.testing.assert_allclose(lhs, rhs, atol=1e-9 * (1 + np.abs(rhs).max()))


def test_kl_modes_are_orthogonal_eigenfunctions():
    """phi_i are orthogonal on [0,1] (they are eigenfunctions of the exponential kernel)."""
    s = np.linspace(0, 1, 20001)
    lam, phi = kl_modes(0.5, 5, s)
    gram = np.trapezoid(phi[:, None, :] * phi[None, :, :], s, axis=-1)
    off = gram - np.diag(np.diag(gram))
    assert np.abs(off).max() < 1e-6 * np.abs(np.diag(gram)).max()
    assert np.all(lam > 0) and np.all(np.diff(lam) < 0)


def test_sampling_shapes_ranges_and_errors():
    # The KL family samples through the one sampler every family uses (diffnet.protocol.family.sample_box).
    family = PoissonFamily((9, 9))
    for sampling in ("random", "sobol"):
        a = family.sample(64, sampling, seed=1)
        assert a.shape == (64, 6) and a.min() >= -3 and a.max() <= 3
        np.testing.assert_array_equal(a, sample_box(-3.0, 3.0, (6,), 64, sampling, seed=1))
    grid = sample_box(-1.0, 1.0, (2,), 9, "uniform", seed=0)
    assert sorted(set(grid[:, 0])) == [-1.0, 0.0, 1.0] and len({tuple(r) for r in grid}) == 9
    with pytest.raises(ValueError, match="k\\^6"):
        family.sample(100, "uniform", seed=0)


def test_kl_basis_is_the_product_of_the_modes_in_2d_and_3d():
    y, x, z = np.linspace(0, 1, 9), np.linspace(0, 1, 7), np.linspace(0, 1, 5)
    lam, phi_x = kl_modes(0.5, 4, x)
    _, phi_y = kl_modes(0.5, 4, y)
    _, phi_z = kl_modes(0.5, 4, z)
    # Bitwise: the same products in the same order as the families' fields before kl_basis.
    assert np.array_equal(kl_basis(0.5, 4, [y, x], 1.0), lam[:, None, None] * phi_y[:, :, None] * phi_x[:, None, :])
    assert np.array_equal(kl_basis(0.5, 4, [z, y, x], 1.5), lam[:, None, None, None] ** 1.5 * phi_z[:, :, None, None]
                          * phi_y[:, None, :, None] * phi_x[:, None, None, :])


def test_diffusivity_spans_the_expected_decades():
    problem = PoissonFamily((64, 64))
    a = torch.as_tensor(sample_box(-3.0, 3.0, (6,), 256, "sobol", 0))
    log10 = torch.log10(problem.diffusivity(a))
    assert float(log10.max() - log10.min()) > 5  # "about seven decades" over the family
    # Fields passed instead of coefficients are used as they are.
    nu = torch.rand(2, 64, 64, dtype=torch.float64) + 0.1
    assert problem.diffusivity(nu) is nu


def test_poisson_field_imposes_dirichlet_values_for_any_output():
    problem = PoissonFamily((12, 10))
    raw = torch.randn(3, 1, 12, 10)
    u = problem.field(raw, None)
    np.testing.assert_array_equal(u[:, :, 0].numpy(), 1.0)
    np.testing.assert_array_equal(u[:, :, -1].numpy(), 0.0)
    inputs = problem.inputs(torch.zeros(3, 6))
    assert inputs.shape == (3, 3, 12, 10)
    np.testing.assert_allclose(inputs[:, 0].numpy(), 0.0, atol=1e-7)  # log nu of a = 0


def test_poisson_loss_is_minimal_at_the_fem_solution():
    problem = PoissonFamily((17, 17))
    a = np.random.default_rng(0).uniform(-3, 3, size=(2, 6))
    u_fem = torch.as_tensor(problem.reference(a))
    at = torch.as_tensor(a)
    best = problem.loss_terms(u_fem, at)["energy"]
    lift = problem.loss_terms((1 - torch.linspace(0, 1, 17, dtype=torch.float64)).expand(2, 17, 17), at)["energy"]
    np.testing.assert_allclose(lift.numpy(), 1.0)  # normalised by the lift's own energy
    assert torch.all(best < lift)
    bump = torch.zeros_like(u_fem)
    bump[:, 5:12, 5:12] = 0.01
    assert torch.all(problem.loss_terms(u_fem + bump, at)["energy"] > best)


def test_reaction_diffusion_zero_boundary_and_negative_minimum():
    problem = ReactionDiffusionFamily((17, 17), coeff_range=(-1.0, 1.0), kappa=2.0, source=3.0)
    raw = torch.randn(2, 1, 17, 17, dtype=torch.float64)
    u = problem.field(raw, None)
    for edge in (u[:, 0], u[:, -1], u[:, :, 0], u[:, :, -1]):
        assert torch.all(edge == 0)
    a = np.random.default_rng(1).uniform(-1, 1, size=(2, 6))
    u_fem = torch.as_tensor(problem.reference(a))
    e = problem.loss_terms(u_fem, torch.as_tensor(a))["energy"]
    # J at the minimiser is -1/2 b.u < 0, and the scale makes it of order one.
    assert torch.all(e < 0) and torch.all(e > -10)
    assert torch.all(problem.loss_terms(1.01 * u_fem, torch.as_tensor(a))["energy"] > e)


def test_constant_diffusivity_option():
    problem = ReactionDiffusionFamily((9, 9), constant=0.5)
    nu = problem.diffusivity(torch.zeros(3, 6, dtype=torch.float64))
    assert nu.shape == (3, 9, 9) and torch.all(nu == 0.5)


def test_conditions_per_side_are_imposed_and_the_fem_system_is_the_energys_minimiser():
    """x0: u = 1, x1: outward flux q, y sides insulated, constant nu: u = 1 + q x exactly (Q1 holds
    linear fields); the field keeps the Dirichlet values, the loss's gradient vanishes at the FEM
    solution, and a flux side's work enters the energy."""
    from diffnet.families.kl_family import KLFamily

    q = 0.75
    family = PoissonFamily((9, 13), x0="u=1", x1=f"flux={q}", y0="flux=0", y1="flux=0")
    params = torch.zeros(2, 6, dtype=torch.float64)  # a = 0: nu = 1
    u = family.fem_system(params[0].numpy()).solve("direct")
    x = np.linspace(0.0, 1.0, 13)
    np.testing.assert_allclose(u, np.broadcast_to(1.0 + q * x, (9, 13)), atol=1e-12)
    raw = torch.randn(2, 1, 9, 13, dtype=torch.float64)
    field = family.field(raw, params)
    assert torch.all(field[:, :, 0] == 1.0)  # only x = 0 is Dirichlet
    v = torch.as_tensor(np.stack([u, u])).requires_grad_(True)
    grad = torch.autograd.grad(family.loss_terms(v, params)["energy"].sum(), v)[0]
    assert grad[:, :, 1:].abs().max() < 1e-12  # stationary on the free nodes
    # Dirichlet on y sides instead: the lift follows y, corners take the x sides' values.
    other = PoissonFamily((5, 5), x0="flux=0", x1="flux=0", y0="u=0", y1="u=2")
    lift = other.field(torch.zeros(1, 1, 5, 5, dtype=torch.float64), params[:1])[0]
    torch.testing.assert_close(lift[:, 2], torch.linspace(0, 2, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="at least one side needs a Dirichlet value"):
        PoissonFamily((5, 5), x0="flux=1", x1="flux=0", y0="flux=0", y1="flux=0")
    assert issubclass(PoissonFamily, KLFamily)


def test_tensor_kl_modes_break_the_diagonal_basis_point_symmetry():
    # The diagonal basis phi_i(x) phi_i(y) makes every head point-symmetric, h(x, y) + h(1 - x, 1 - y) = 1 (x0 held
    # at 1, x1 at 0): 25 wells would carry 13 values. The tensor basis phi_i(x) phi_j(y) does not.
    from diffnet.instances.kl import kl_basis, kl_modes
    from diffnet.families.poisson import PoissonFamily

    rows = np.random.default_rng(0).uniform(-3, 3, (2, 6))
    diagonal, tensor = PoissonFamily((17, 17), kl_terms=6), PoissonFamily((17, 17), kl_terms=6, kl_modes="tensor")
    u, _ = diagonal.discrete_optimum(rows)
    v, _ = tensor.discrete_optimum(rows)
    assert np.abs(u + u[:, ::-1, ::-1] - 1).max() < 1e-8
    assert np.abs(v + v[:, ::-1, ::-1] - 1).max() > 0.05
    # The modes: the m largest eigenvalue products in order; the first is the diagonal's first, weight and all.
    lam, _ = kl_modes(0.5, 6, np.zeros(1))
    axes = [np.linspace(0, 1, 9)] * 2
    basis, diag = kl_basis(0.5, 6, axes, 1.0, tensor=True), kl_basis(0.5, 6, axes, 1.0)
    np.testing.assert_array_equal(basis[0], diag[0])
    products = sorted((lam[i] * lam[j] for i in range(6) for j in range(6)), reverse=True)[:6]
    assert products[1] == products[2] == lam[0] * lam[1]  # (0, 1) and (1, 0): both, in index order
    np.testing.assert_allclose(basis[1], basis[2].T)
    assert tensor.describe().startswith("nu=KL(m=6, eta=0.5, tensor modes")
