"""Navier–Stokes on cut cells (diffnet.discretisation.immersed_flow) and the DFG 2D-1 channel's Newton solve
(diffnet.solvers.cylinder): the Nitsche wall's pressure term is consistent, the coloured Jacobian is the residual's,
mass is conserved through the channel, the extension past the wall gives a root's own values back, and the drag
converges to Schäfer & Turek's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from diffnet.discretisation.immersed_flow import immersed_flow_residual, wall_force
from diffnet.instances.cutcell import cut_cells
from diffnet.solvers.cylinder import (BENCHMARK, HEIGHT, LENGTH, NU, SCHAEFER_TUREK, U_MAX, channel, channel_boundary,
                                      channel_residual, coefficients, cylinder_solve, discretised, extended)
from diffnet.solvers.newton import sparse_jacobian

COARSE = (17, 89)  # cells 0.0256 x 0.025: the benchmark's cylinder 4 cells across


@pytest.fixture(scope="module")
def solution():
    return cylinder_solve(BENCHMARK, COARSE)


def test_the_channel_is_cut_on_its_own_box():
    cells = cut_cells(channel(BENCHMARK), COARSE, (LENGTH, HEIGHT))
    assert cells.spacing == pytest.approx((LENGTH / 88, HEIGHT / 16))
    # The cylinder's reconstructed section: the polygon inscribed in the circle, a few percent short on 4 cells across
    # (2.8 % measured), O(h²).
    hole = LENGTH * HEIGHT - cells.area()
    assert 0.96 * np.pi * 0.05**2 < hole < np.pi * 0.05**2
    # Γ's outward normals (out of the fluid) point into the cylinder, towards its centre.
    towards = np.asarray(BENCHMARK[:2]) - cells.b_points
    assert (np.einsum("bd,bd->b", cells.b_normals, towards) > 0).all()


def test_a_constant_pressure_at_rest_exerts_no_force_and_leaves_only_the_finite_cell_term():
    data = [discretised(BENCHMARK, COARSE)]
    fields = torch.zeros(1, 3, *COARSE, dtype=torch.float64)
    fields[:, 2] = 2.0
    assert np.abs(wall_force(fields, torch.tensor([NU], dtype=torch.float64), data).numpy()).max() < 1e-14
    r = immersed_flow_residual(fields, torch.tensor([NU], dtype=torch.float64), data)[0]
    # Γ's term ∫ p n N_a balances the volume's -∫ p ∇N_a on the reconstructed domain; what is left is the finite-cell
    # term α ∫ p ∇N_a over the cut elements (α = 1e-4, h 0.025: ~1e-6), and the channel's own sides.
    inner = r[:, 1:-1, 1:-1]
    assert float(inner.abs().max()) < 1e-5 and float(r[2].abs().max()) < 1e-14


def test_the_coloured_jacobian_through_the_cut_cells_is_the_residuals_derivative():
    grid = (9, 45)
    data = discretised(BENCHMARK, grid)
    fixed, values = (torch.as_tensor(a) for a in channel_boundary(grid, data.active))
    fn = lambda f: channel_residual(f, [data] * len(f), fixed, values)  # noqa: E731
    torch.manual_seed(0)
    x = torch.rand(3, *grid, dtype=torch.float64) * 0.3
    jac = sparse_jacobian(fn, x, 1, components=True)
    for _ in range(2):
        v = torch.randn_like(x)
        _, jv = torch.autograd.functional.jvp(lambda y: fn(y[None])[0], x, v)
        np.testing.assert_allclose(jac @ v.reshape(-1).numpy(), jv.reshape(-1).numpy(), rtol=0,
                                   atol=1e-10 * float(jv.abs().max()))


def test_newton_reaches_the_root_and_mass_is_conserved_through_the_channel(solution):
    data = discretised(BENCHMARK, COARSE)
    fixed, values = (torch.as_tensor(a) for a in channel_boundary(COARSE, data.active))
    r = channel_residual(torch.as_tensor(solution)[None], [data], fixed, values)
    assert float(r.abs().max()) < 1e-8
    # What enters at x = 0 (U_mean H = 2/3 U_max H) leaves at x = 2.2: the PSPG term moves mass by O(h²) only
    # (2.2e-5 of it measured on 17 x 89, 1.1e-6 on 33 x 177, 2026-12-07).
    y = np.linspace(0.0, HEIGHT, COARSE[0])
    inflow, outflow = (np.trapezoid(solution[0][:, k], y) for k in (0, -1))
    assert inflow == pytest.approx(2.0 / 3.0 * U_MAX * HEIGHT, rel=5e-3)  # the trapezoid rule on the parabola
    assert abs(outflow - inflow) < 5e-5 * inflow


def test_the_extension_past_the_wall_gives_the_roots_own_values_back(solution):
    fluid = discretised(BENCHMARK, COARSE).cells.sdf <= 0.0
    masked = solution * fluid
    assert np.abs(masked - solution).max() > 1e-3  # the cut elements' nodes in the cylinder hold values
    np.testing.assert_allclose(extended(BENCHMARK, masked), solution, rtol=0, atol=1e-9)
    assert coefficients(BENCHMARK, extended(BENCHMARK, masked))["drag"] == pytest.approx(
        coefficients(BENCHMARK, solution)["drag"], rel=1e-9)


def test_the_benchmarks_drag_on_four_cells_across(solution):
    c = coefficients(BENCHMARK, solution)
    # 6.3239 measured on 2026-12-07 (Schäfer-Turek 5.5795); 5.844 on 33 x 177, 5.649 on 65 x 353, 5.596 on 129 x 705.
    assert c["drag"] == pytest.approx(SCHAEFER_TUREK["drag"], rel=0.14)
    assert c["pressure_drop"] == pytest.approx(SCHAEFER_TUREK["pressure_drop"], rel=0.13)


@pytest.mark.slow
def test_the_drag_and_pressure_drop_converge_to_schaefer_turek():
    off = []
    for grid in ((33, 177), (65, 353)):
        c = coefficients(BENCHMARK, cylinder_solve(BENCHMARK, grid))
        off.append([abs(c[k] / SCHAEFER_TUREK[k] - 1.0) for k in ("drag", "pressure_drop")])
    # Measured 2026-12-07: drag 4.7 % -> 1.25 %, pressure drop 7.2 % -> 3.7 % (129 x 705: 0.29 %, 1.9 %).
    assert off[1][0] < 0.015 and off[1][1] < 0.04 and off[1][0] < off[0][0] / 3 and off[1][1] < off[0][1]
