"""Q1 energies as convolutions against the assembled FEM system, and the FEM solver against exact solutions."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.integrate import cumulative_trapezoid

from diffnet.discretisation.energy import dirichlet_energy, reaction_diffusion_energy
from diffnet.grid.element import gauss_basis
from diffnet.solvers.fem import assemble, poisson_fem, poisson_system, reaction_diffusion_fem


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(a, dtype=torch.float64)[None]


def test_gauss_basis_partition_of_unity():
    values, gx, gy, w = gauss_basis(0.1, 0.2)
    np.testing.assert_allclose(values.sum(axis=1), 1.0, atol=1e-15)
    np.testing.assert_allclose(gx.sum(axis=1), 0.0, atol=1e-13)
    np.testing.assert_allclose(gy.sum(axis=1), 0.0, atol=1e-13)
    assert w == pytest.approx(0.1 * 0.2 / 4)
    # A linear field x has gradient (1, 0) at every Gauss point.
    x_nodes = np.array([0.0, 0.1, 0.0, 0.1])
    np.testing.assert_allclose(gx @ x_nodes, 1.0)
    np.testing.assert_allclose(gy @ x_nodes, 0.0, atol=1e-14)


@pytest.mark.parametrize("shape", [(9, 13), (16, 7)])
def test_energy_equals_half_uKu(shape):
    rng = np.random.default_rng(1)
    ny, nx = shape
    hx, hy = 1 / (nx - 1), 1 / (ny - 1)
    nu = np.exp(rng.normal(size=shape))
    u = rng.normal(size=shape)
    K, _ = assemble(nu, (hx, hy))
    J = dirichlet_energy(_t(u), _t(nu), hx, hy).item()
    assert J == pytest.approx(0.5 * u.ravel() @ K @ u.ravel(), rel=1e-12)


def test_reaction_diffusion_energy_equals_quadratic_form():
    rng = np.random.default_rng(2)
    shape = (11, 12)
    hx, hy = 1 / 11, 1 / 10
    nu, u, f = np.exp(rng.normal(size=shape)), rng.normal(size=shape), rng.normal(size=shape)
    A, b = assemble(nu, (hx, hy), kappa=1.7, f=f)
    J = reaction_diffusion_energy(_t(u), _t(nu), 1.7, _t(f), hx, hy).item()
    assert J == pytest.approx(0.5 * u.ravel() @ A @ u.ravel() - b @ u.ravel(), rel=1e-12)
    # A constant source is the same as a constant nodal field.
    J_const = reaction_diffusion_energy(_t(u), _t(nu), 1.7, 0.8, hx, hy).item()
    J_field = reaction_diffusion_energy(_t(u), _t(nu), 1.7, _t(np.full(shape, 0.8)), hx, hy).item()
    assert J_const == pytest.approx(J_field, rel=1e-12)


def test_energy_gradients_are_the_assembled_operator():
    # The memory-lean backward recomputes the Gauss-point gradients: it must give
    # dJ/du = (K + kappa^2 M) u - b exactly, for a batch, and a correct dJ/dnu.
    rng = np.random.default_rng(5)
    shape = (9, 12)
    hx, hy = 1 / 11, 1 / 8
    nu = np.exp(rng.normal(size=(2, *shape)))
    u = rng.normal(size=(2, *shape))
    ut = torch.tensor(u, requires_grad=True)
    reaction_diffusion_energy(ut, torch.tensor(nu), 1.3, 0.7, hx, hy).sum().backward()
    for k in range(2):
        A, b = assemble(nu[k], (hx, hy), kappa=1.3, f=np.full(shape, 0.7))
        np.testing.assert_allclose(ut.grad[k].numpy().ravel(), A @ u[k].ravel() - b, rtol=1e-10, atol=1e-12)
    uu, nn = _t(u[0]).requires_grad_(), _t(nu[0]).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, c: dirichlet_energy(a, c, hx, hy), (uu, nn))


def test_stiffness_is_symmetric_with_constants_in_its_kernel():
    rng = np.random.default_rng(3)
    nu = np.exp(rng.normal(size=(10, 14)))
    K, _ = assemble(nu, (1 / 13, 1 / 9))
    assert abs(K - K.T).max() < 1e-12
    np.testing.assert_allclose(K @ np.ones(K.shape[0]), 0.0, atol=1e-10)
    # Constant nu on a square grid: the classic Q1 stencil (8 centre, -1 neighbours) / 3.
    K1, _ = assemble(np.ones((5, 5)), (0.25, 0.25))
    centre = 2 * 5 + 2
    row = K1.getrow(centre).toarray().reshape(5, 5)[1:4, 1:4]
    np.testing.assert_allclose(row * 3, [[-1, -1, -1], [-1, 8, -1], [-1, -1, -1]], atol=1e-12)


def test_minimising_energy_directly_recovers_fem():
    """The energy's minimiser over nodal values (no network) is the FEM solution."""
    from diffnet.families.poisson import PoissonFamily

    problem = PoissonFamily((17, 17))
    a = np.random.default_rng(4).uniform(-1.5, 1.5, size=(1, 6))
    u_fem = problem.reference(a)[0]
    nu = problem.diffusivity(torch.as_tensor(a))
    raw = torch.zeros(1, 1, 17, 17, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([raw], lr=1, max_iter=5000, tolerance_grad=1e-14, tolerance_change=0,
                            history_size=50, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        J = dirichlet_energy(problem.field(raw, None), nu, *problem.spacing).sum()
        J.backward()
        return J

    opt.step(closure)
    u = problem.field(raw, None)[0].detach().numpy()
    assert np.abs(u - u_fem).max() < 1e-6


def test_amg_and_direct_agree():
    rng = np.random.default_rng(5)
    nu = np.exp(rng.uniform(-3, 3, size=(40, 33)))
    u_amg = poisson_fem(nu, method="amg", tol=1e-12)
    u_lu = poisson_fem(nu, method="direct")
    assert np.abs(u_amg - u_lu).max() < 1e-8
    # Discrete maximum principle for the Dirichlet data 0 and 1 (holds here: nu positive,
    # square-ish elements), and the boundary values are exact.
    assert u_lu.min() > -1e-9 and u_lu.max() < 1 + 1e-9
    np.testing.assert_array_equal(u_lu[:, 0], 1.0)
    np.testing.assert_array_equal(u_lu[:, -1], 0.0)


def _exact_1d(nu_of_x, x: np.ndarray) -> np.ndarray:
    """u(x) = 1 - int_0^x 1/nu / int_0^1 1/nu, by a fine trapezoid rule."""
    fine = np.linspace(0, 1, 200001)
    cum = cumulative_trapezoid(1 / nu_of_x(fine), fine, initial=0)
    return 1 - np.interp(x, fine, cum) / cum[-1]


def test_fem_matches_exact_1d_solution_at_second_order():
    def nu_of_x(x):
        return np.exp(1.5 * np.sin(2 * np.pi * x) + x)

    errors = []
    for n in (17, 33, 65, 129):
        x = np.linspace(0, 1, n)
        nu = np.broadcast_to(nu_of_x(x), (9, n))  # varies in x only; 9 rows in y suffice
        u = poisson_fem(np.ascontiguousarray(nu), method="direct")
        # Exact in y: every row is the same 1-D solution.
        assert np.abs(u - u[0]).max() < 1e-10
        errors.append(np.sqrt(np.mean((u[0] - _exact_1d(nu_of_x, x)) ** 2)))
    rates = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    assert errors[-1] < 1e-3
    assert np.all(rates > 1.8) and np.all(rates < 2.3), rates


def test_reaction_diffusion_manufactured_solution_second_order():
    kappa = 2.0
    errors = []
    for n in (17, 33, 65):
        s = np.linspace(0, 1, n)
        y, x = np.meshgrid(s, s, indexing="ij")
        nu = 1.0 + 0.5 * x + 0.25 * y * y
        u_star = np.sin(math.pi * x) * np.sin(math.pi * y)
        ux = math.pi * np.cos(math.pi * x) * np.sin(math.pi * y)
        uy = math.pi * np.sin(math.pi * x) * np.cos(math.pi * y)
        # f = -div(nu grad u*) + kappa^2 u* = 2 pi^2 nu u* - grad(nu) . grad(u*) + kappa^2 u*
        f = 2 * math.pi**2 * nu * u_star - (0.5 * ux + 0.5 * y * uy) + kappa**2 * u_star
        u = reaction_diffusion_fem(nu, kappa, f, method="direct")
        errors.append(np.sqrt(np.mean((u - u_star) ** 2)))
    rates = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    assert errors[-1] < 2e-3
    assert np.all(rates > 1.8) and np.all(rates < 2.3), rates


def test_unknown_solver_method_is_refused():
    with pytest.raises(ValueError, match="unknown method"):
        poisson_system(np.ones((4, 4))).solve(method="jacobi")
