"""Discretisation floors: the direct solvers behind them, on cases with known answers."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from deepfusion.analysis.inference import against_floor, relative_l2
from diffnet.discretisation.finite_difference import central_residual as residual
from diffnet.discretisation.finite_volume import conservative_residual
from diffnet.families.burgers import BurgersFamily
from diffnet.families.poisson import PoissonFamily
from diffnet.solvers.conservative import solve_scheme
from diffnet.solvers.newton import least_squares_solve, newton_solve, sparse_jacobian
from diffnet.solvers.sobel import solve_sobel


def _dense_jacobian(fn, x):
    return torch.autograd.functional.jacobian(lambda v: fn(v[None])[0], x).reshape(x.numel(), x.numel()).numpy()


def test_sparse_jacobian_equals_autograd_for_both_burgers_residuals():
    rng = np.random.default_rng(0)
    u = torch.as_tensor(rng.uniform(0, 1, (9, 11)))

    def sobel(v):
        return residual(F.pad(v, (1, 0, 1, 0)) + u[0], 0.02, 0.1, 0.01, "sobel")

    v = torch.as_tensor(rng.uniform(-0.2, 0.2, (8, 10)))
    np.testing.assert_allclose(sparse_jacobian(sobel, v, 2).toarray(), _dense_jacobian(sobel, v), rtol=0, atol=1e-12)

    def row(w):  # one implicit row of the second-order conservative scheme
        window = torch.cat([u[:2].expand(len(w), 2, 11), torch.cat([u[2:3, :1].expand(len(w), 1), w], 1)[:, None]], 1)
        return conservative_residual(window, 0.02, 0.1, 0.01, 2, "godunov")[:, -1]

    w = u[2, 1:] + 0.1
    np.testing.assert_allclose(sparse_jacobian(row, w, 2).toarray(), _dense_jacobian(row, w), rtol=0, atol=1e-12)


def test_newton_and_levenberg_marquardt_find_a_known_root():
    # r_i(x) = x_i^3 + x_{i-1} + x_{i+1} - b_i: a local system with the root x = 1.
    def fn(x):
        padded = F.pad(x, (1, 1))
        return x**3 + padded[:, :-2] + padded[:, 2:] - torch.as_tensor([2.0] + [3.0] * 18 + [2.0])

    start = torch.full((20,), 1.5, dtype=torch.float64)
    np.testing.assert_allclose(newton_solve(fn, start, reach=1, tol=1e-12).numpy(), 1.0, atol=1e-12)
    x, worst = least_squares_solve(fn, start, reach=1, tol=1e-12)
    np.testing.assert_allclose(x.numpy(), 1.0, atol=1e-10)
    assert worst < 1e-12


@pytest.mark.parametrize("viscosity", [0.0, 0.01])
def test_sobel_floor_converges_at_second_order_to_a_known_solution(viscosity):
    # u0 = x with u(0, t) = 0: u = x / (1 + t) solves Burgers for any nu (u_xx = 0).
    errors = []
    for n in (17, 33, 65):
        x, t = np.linspace(0, 1, n), np.linspace(0, 1 / 3, n)
        u, worst = solve_sobel(x, 1 / 3, n, viscosity)
        assert worst < 1e-9  # a root, not a least-squares optimum
        errors.append(np.abs(u - x[None] / (1 + t[:, None])).max())
    rates = [math.log2(a / b) for a, b in zip(errors, errors[1:])]
    assert all(r > 1.9 for r in rates), (errors, rates)


@pytest.mark.parametrize("order, rate", [(1, 0.9), (2, 1.8)])
def test_conservative_floor_converges_to_a_known_solution(order, rate):
    # Inviscid, u0 = x^2 (no shock: characteristics spread): u = (1 + 2xt - sqrt(1 + 4xt)) / (2 t^2).
    # Measured on x <= 3/4: the zero-gradient outflow ghost is first order at x = 1, and
    # with the flow to the right its error stays in the last cells.
    errors = []
    for n in (17, 33, 65, 129):
        x, t = np.linspace(0, 1, n), np.linspace(0, 1 / 3, n)[1:, None]
        exact = (1 + 2 * x * t - np.sqrt(1 + 4 * x * t)) / (2 * t**2)
        u = solve_scheme(x**2, 1 / 3, n, 0.0, order)
        errors.append(np.abs(u[1:] - exact)[:, x <= 0.75].max())
    rates = [math.log2(a / b) for a, b in zip(errors, errors[1:])]
    assert min(rates) > rate, (errors, rates)


def test_burgers_floor_fields_have_zero_residual():
    for stencil in ("conservative", "sobel"):
        problem = BurgersFamily((32, 32), viscosity=0.01, stencil=stencil)
        c = np.array([3.3])
        u, roots = problem.discrete_optimum(c, initial=problem.truth(c))
        assert roots.all()
        terms = problem.loss_terms(torch.as_tensor(u), torch.as_tensor(c))
        assert float(terms["residual"]) < 1e-18, stencil


def test_poisson_truth_and_floor_against_an_exact_solution():
    # A nodal diffusivity varying in x only is piecewise linear between the nodes (that
    # is how the elements read it), nu = nu_j + (nu_{j+1} - nu_j) s / h. Then
    # -(nu u')' = 0 with u(0) = 1, u(1) = 0 has nu u' constant, and u falls across node
    # gap j by the share of integral 1/nu = h ln(nu_{j+1} / nu_j) / (nu_{j+1} - nu_j).
    n = 33
    problem = PoissonFamily((n, n))
    x = np.linspace(0, 1, n)
    nodal = (1 + x) ** 2
    gaps = np.diff(x) * np.log(nodal[1:] / nodal[:-1]) / np.diff(nodal)
    exact = np.broadcast_to(1 - np.concatenate([[0], np.cumsum(gaps)]) / gaps.sum(), (1, n, n))
    nu = np.broadcast_to(nodal, (1, n, n)).copy()
    truth = problem.truth(nu)
    same_grid, roots = problem.discrete_optimum(nu)
    assert roots.all()
    floor_exact = relative_l2(same_grid, exact)[0]
    # Q1 with 2x2 Gauss quadrature is second order here, so the 4x finer truth's own error
    # is about 1/16 of the floor, and the floor read off against it is the floor.
    assert 1e-5 < floor_exact < 1e-3
    assert relative_l2(truth, exact)[0] < floor_exact / 10
    report = against_floor(problem, nu, same_grid)
    assert report.floor[0] == pytest.approx(floor_exact, rel=0.1)
    assert report.ratio == pytest.approx(1.0)  # the floor field itself sits on the floor
    assert report.error[0] == report.floor[0]


def test_poisson_floor_vanishes_where_q1_is_exact():
    problem = PoissonFamily((17, 17), constant=2.0)  # u = 1 - x, bilinear: no discretisation error
    report = against_floor(problem, np.zeros((1, 6)), problem.discrete_optimum(np.zeros((1, 6)))[0])
    assert report.floor[0] < 1e-9  # the AMG solves' tolerance
