"""The conservative Burgers residual: fluxes, the direct solver's zero-residual field, and its floor."""

import numpy as np
import pytest
import torch

from diffnet.discretisation.finite_volume import FLUXES, conservative_residual, face_states
from diffnet.families.burgers import BurgersFamily
from diffnet.solvers.burgers import solve_on_grid

T = 1.0 / 3.0


@pytest.mark.parametrize("name", sorted(FLUXES))
def test_flux_consistent_and_monotone(name):
    flux = FLUXES[name]
    u = torch.linspace(-2, 2, 81, dtype=torch.float64)
    torch.testing.assert_close(flux(u, u), 0.5 * u**2, rtol=0, atol=1e-15)
    a, b = torch.meshgrid(u, u, indexing="ij")
    f = flux(a, b)
    assert (f.diff(dim=0) >= -1e-15).all()  # non-decreasing in the left state
    assert (f.diff(dim=1) <= 1e-15).all()  # non-increasing in the right state


def test_godunov_flux_is_the_riemann_solution():
    from diffnet.solvers.burgers import godunov_flux

    rng = np.random.default_rng(0)
    a, b = rng.uniform(-2, 2, 500), rng.uniform(-2, 2, 500)
    np.testing.assert_allclose(FLUXES["godunov"](torch.as_tensor(a), torch.as_tensor(b)).numpy(), godunov_flux(a, b))


def test_face_states_exact_for_linear_rows_and_limited_at_extrema():
    u = torch.linspace(0.0, 1.0, 9, dtype=torch.float64)[None]
    left, right = face_states(u, 2)
    mid = (u[0, :-1] + u[0, 1:]) / 2
    # Interior faces of a linear row get the exact midpoint value from both sides.
    torch.testing.assert_close(left[0, 1:-1], mid[1:], atol=1e-15, rtol=0)
    torch.testing.assert_close(right[0, :-2], mid[:-1], atol=1e-15, rtol=0)
    hat = torch.tensor([[0.0, 1.0, 3.0, 1.0, 0.0]], dtype=torch.float64)
    left, right = face_states(hat, 2)
    assert left[0, 2] == 3.0 and right[0, 1] == 3.0  # no new extremum at the peak


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("viscosity", [0.0, 0.01])
def test_direct_solution_has_zero_residual(order, viscosity):
    problem = BurgersFamily((24, 24), viscosity=viscosity, stencil="conservative", scheme_order=order)
    u = torch.as_tensor(problem.scheme_solution(np.array([4.1, 5.5])))
    r = conservative_residual(u, problem.dt, problem.dx, viscosity, order)
    assert float(r.abs().max()) < 1e-9
    # ... and the problem's loss is the same residual: zero there, not zero for a perturbed field.
    c = torch.tensor([4.1, 5.5], dtype=torch.float64)
    assert float(problem.loss_terms(u, c)["residual"].max()) < 1e-18
    assert float(problem.loss_terms(u + 1e-3 * torch.rand_like(u), c)["residual"].min()) > 1e-8


@pytest.mark.parametrize("order, viscosity", [(1, 0.0), (2, 0.01)])
def test_floor_decreases_under_refinement(order, viscosity):
    errors = []
    for n in (16, 32, 64):
        problem = BurgersFamily((n, n), viscosity=viscosity, stencil="conservative", scheme_order=order)
        u = problem.scheme_solution(np.array([4.1]))[0]
        ref = solve_on_grid(4.1, (n, n), viscosity, T)
        errors.append(np.linalg.norm(u - ref) / np.linalg.norm(ref))
    assert errors[0] > errors[1] > errors[2], errors
    # Smooth enough with nu = 0.01 for the second-order scheme to show it.
    if order == 2:
        assert errors[1] / errors[2] > 2.5, errors


def test_second_order_beats_first_order_at_equal_resolution():
    ref = solve_on_grid(4.77, (32, 32), 0.0, T)
    err = {}
    for order in (1, 2):
        problem = BurgersFamily((32, 32), viscosity=0.0, stencil="conservative", scheme_order=order)
        err[order] = np.linalg.norm(problem.scheme_solution(np.array([4.77]))[0] - ref) / np.linalg.norm(ref)
    assert err[2] < 0.8 * err[1], err


def test_implicit_diffusion_preconditioner_inverts_the_residuals_own_operator():
    """(I - r D_xx) applied to any row (D_xx written here: inflow node fixed at zero, zero-gradient ghost at
    the outflow) and then the preconditioner gives the row back; it keeps the scheme's zero and damps the
    highest mode by 1 / (1 + 4 nu dt / dx^2) at most."""
    from diffnet.discretisation.finite_volume import implicit_diffusion_inverse

    n_x, dt, dx, nu = 33, 0.01, 1 / 32, 0.01
    ratio = nu * dt / dx**2
    w = torch.randn(5, n_x - 1, dtype=torch.float64)
    padded = torch.cat([torch.zeros(5, 1, dtype=w.dtype), w, w[:, -1:]], dim=1)  # u_0 = 0; ghost u_N = u_{N-1}
    Dw = padded[:, 2:] - 2 * padded[:, 1:-1] + padded[:, :-2]
    inverse = implicit_diffusion_inverse(n_x, dt, dx, nu, w)
    torch.testing.assert_close((w - ratio * Dw) @ inverse.T, w, rtol=0, atol=1e-12)
    singular = torch.linalg.svdvals(inverse)
    assert singular.max() <= 1 + 1e-12 and singular.min() >= 1 / (1 + 4 * ratio) - 1e-12
    # The same zero: the scheme's own solution has zero preconditioned loss, a perturbation does not.
    plain = BurgersFamily((24, 24), viscosity=nu, stencil="conservative")
    pre = BurgersFamily((24, 24), viscosity=nu, stencil="conservative", preconditioner="implicit_diffusion")
    c = np.array([4.2])
    u = torch.as_tensor(plain.scheme_solution(c))
    ct = torch.as_tensor(c, dtype=torch.float64)
    assert pre.loss_terms(u, ct)["residual"].item() < 1e-20
    bumped = u.clone()
    bumped[:, 5:, 5:] += 1e-3
    assert pre.loss_terms(bumped, ct)["residual"].item() > 0 and plain.loss_terms(bumped, ct)["residual"].item() > 0
