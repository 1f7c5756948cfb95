"""The Godunov reference: consistency, agreement with characteristics, convergence."""

import math

import numpy as np
import pytest

from diffnet.solvers.burgers import characteristics_solution, godunov_flux, solve, solve_on_grid


def test_flux_consistent_and_monotone():
    u = np.linspace(-2, 2, 41)
    np.testing.assert_allclose(godunov_flux(u, u), 0.5 * u**2)
    a, b = np.meshgrid(u, u, indexing="ij")
    f = godunov_flux(a, b)
    assert np.all(np.diff(f, axis=0) >= -1e-15)  # non-decreasing in the left state
    assert np.all(np.diff(f, axis=1) <= 1e-15)  # non-increasing in the right state


@pytest.mark.parametrize("c", [3.0, 4.7, 6.0])
@pytest.mark.parametrize("order,tol", [(1, 0.03), (2, 0.004)])
def test_matches_characteristics_before_first_shock(c, order, tol):
    t = 0.8 / (math.pi * c)
    centres, u = solve(c, 2048, np.array([0.0, t]), viscosity=0.0, order=order)
    exact = characteristics_solution(c, centres, t)
    assert np.abs(u[1] - exact).max() < tol
    assert np.sqrt(np.mean((u[1] - exact) ** 2)) < tol / 3


def test_characteristics_refuse_after_shock():
    with pytest.raises(ValueError, match="first shock"):
        characteristics_solution(4.0, np.linspace(0, 1, 5), 1.0 / (math.pi * 4.0))


@pytest.mark.parametrize("nu", [0.0, 0.01])
def test_converges_under_refinement(nu):
    # Past the shocks: the nodal fields from successively finer grids approach the finest.
    res, T = (33, 65), 1.0 / 3.0
    finest = solve_on_grid(4.77, res, nu, T, cells=16384)
    errs = [
        np.linalg.norm(solve_on_grid(4.77, res, nu, T, cells=m) - finest) / np.linalg.norm(finest)
        for m in (512, 1024, 2048, 4096)
    ]
    assert all(b < a for a, b in zip(errs, errs[1:])), errs
    assert errs[-1] < 0.01


def test_boundary_and_initial_values():
    u = solve_on_grid(5.5, (17, 33), 0.01, 1 / 3)
    x = np.linspace(0, 1, 33)
    np.testing.assert_allclose(u[0], 0.5 * (1 - np.cos(2 * math.pi * 5.5 * x)), atol=1e-14)
    np.testing.assert_allclose(u[:, 0], 0.0, atol=1e-14)
    assert u.min() >= -1e-12 and u.max() <= 1.0 + 1e-12  # maximum principle
