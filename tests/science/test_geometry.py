"""Domains beyond the rectangle: shapes by signed distance, the cut-cell quadrature, and the immersed Q1
energy with Nitsche's boundary terms against its assembled system and closed-form solutions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.integrate import dblquad

from diffnet.instances.cutcell import cut_cells
from diffnet.instances.geometry import Box, Disc, HalfSpace, Occupancy, Shape, Star, grid_points
from diffnet.discretisation.immersed import immersed, immersed_energy, immersed_matrices
from diffnet.solvers.fem import FEMSystem
from diffnet.solvers.matrix_stencil import apply_dirichlet, to_csr


def test_shapes_signed_distances_and_their_combinations():
    p = np.array([[0.5, 0.5], [0.9, 0.5], [0.5, 0.95], [0.0, 0.0]])
    disc, box = Disc((0.5, 0.5), 0.3), Box((0.2, 0.2), (0.8, 0.8))
    np.testing.assert_allclose(disc.sdf(p), [-0.3, 0.1, 0.15, np.hypot(0.5, 0.5) - 0.3])
    np.testing.assert_allclose(box.sdf(p), [-0.3, 0.1, 0.15, np.hypot(0.2, 0.2)])
    np.testing.assert_allclose((box - Disc((0.5, 0.5), 0.1)).sdf(p)[:2], [0.1, 0.1])  # the centre is in the hole
    assert (disc | box).sdf(p)[1] == pytest.approx(0.1) and (disc & HalfSpace((1.0, 0.0), 0.5)).sdf(p)[1] > 0
    star = Star((0.5, 0.5), 0.3, (0.1,), (0.0,))
    np.testing.assert_allclose(star.sdf(star.boundary(64)), 0.0, atol=1e-12)  # zero on its own boundary
    assert star.sdf(np.array([[0.5, 0.5]]))[0] < 0 and star.min_radius() == pytest.approx(0.27, rel=1e-3)
    with pytest.raises(ValueError, match="different dimensions"):
        Disc((0.5, 0.5), 0.3) | Disc((0.5, 0.5, 0.5), 0.3)


class _Counted(Shape):
    """A shape that counts its distance evaluations."""

    def __init__(self, shape):
        self.shape, self.calls = shape, 0

    def sdf(self, points):
        self.calls += 1
        return self.shape.sdf(points)


@pytest.mark.parametrize("shape", [Disc((0.5, 0.5), 0.13), Star((0.5, 0.5), 0.12, (0.2, 0.0, 0.1), (0.0, 0.1, 0.0)),
                                   Disc((0.5, 0.5), 0.13) - Box((0.5, 0.5), (0.7, 0.7))])
def test_boundary_crossings_lie_on_the_boundary_in_a_few_evaluations(shape):
    # Every cut edge of a 64^2 grid: the crossing on the boundary to rounding, where bisection to the last bit puts it.
    h = 1.0 / 63
    nodes = grid_points((64, 64)).reshape(-1, 2)
    a = nodes[shape.sdf(nodes) <= 0]
    b = np.concatenate([a + [h, 0.0], a + [0.0, h]])
    a = np.concatenate([a, a])
    cut = shape.sdf(b) > 0
    a, b = a[cut], b[cut]
    t = shape.crossing(a, b)
    assert len(t) >= 20 and np.all((t >= 0) & (t <= 1))
    assert np.abs(shape.sdf(a + t[:, None] * (b - a))).max() < 1e-14
    lo, hi = np.zeros(len(a)), np.ones(len(a))
    for _ in range(52):
        mid = 0.5 * (lo + hi)
        out = shape.sdf(a + mid[:, None] * (b - a)) > 0
        lo, hi = np.where(out, lo, mid), np.where(out, mid, hi)
    np.testing.assert_allclose(t, 0.5 * (lo + hi), atol=1e-12)
    counted = _Counted(shape)
    counted.crossing(a, b)
    assert counted.calls <= 12  # bisection: 54


def test_cut_quadrature_is_exact_on_a_straight_boundary():
    """Polynomials of the energies' degree over {y >= 0.1 + 0.3 x}: the reconstruction is the domain
    itself, so the rule is exact to rounding, on any grid."""
    shape = HalfSpace((0.3, -1.0), -0.1 / np.hypot(0.3, 1.0))
    for grid in ((17, 23), (40, 31)):
        cells = cut_cells(shape, grid)
        for f, g in ((lambda p: np.ones(len(p)), lambda y, x: 1.0),
                     (lambda p: p[:, 0] ** 2 * p[:, 1] ** 2, lambda y, x: x * x * y * y),
                     (lambda p: p[:, 0] ** 3 * p[:, 1], lambda y, x: x**3 * y)):
            exact = dblquad(g, 0, 1, lambda x: 0.1 + 0.3 * x, lambda x: 1.0, epsabs=1e-14)[0]
            assert cells.integrate(f) == pytest.approx(exact, abs=1e-14)
        assert cells.b_weights.sum() == pytest.approx(np.hypot(1.0, 0.3), abs=1e-13)
        np.testing.assert_allclose(cells.b_normals, np.tile([0.3, -1.0] / np.hypot(0.3, 1.0), (len(cells.b_normals), 1)),
                                   atol=1e-9)


def test_cut_quadrature_on_a_disc_converges_at_second_order():
    """A disc's area, second moment and perimeter: the polygon through boundary points errs by O(h^2);
    the divergence theorem holds to rounding on the reconstructed domain (area = ∮ x n_x)."""
    R, c = 0.31, (0.5, 0.47)
    errors = []
    for n in (17, 33, 65, 129):
        cells = cut_cells(Disc(c, R), (n, n))
        area = cells.area()
        m2 = cells.integrate(lambda p: (p[:, 0] - c[0]) ** 2)
        errors.append([abs(area / (np.pi * R**2) - 1), abs(m2 / (np.pi * R**4 / 4) - 1),
                       abs(cells.b_weights.sum() / (2 * np.pi * R) - 1)])
        assert (cells.b_weights * cells.b_points[:, 0] * cells.b_normals[:, 0]).sum() == pytest.approx(area, rel=1e-13)
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    assert orders.mean(axis=0).min() > 1.8, orders


def test_an_occupancy_image_is_a_domain():
    n = 129
    image = Disc((0.5, 0.5), 0.3).on_grid((n, n)) <= 0
    shape = Occupancy(image)
    cells = cut_cells(shape, (65, 65))
    assert cells.area() == pytest.approx(np.pi * 0.3**2, rel=0.02)
    with pytest.raises(ValueError, match="empty"):
        Occupancy(np.zeros((9, 9), dtype=bool))


def _solve(data, nu, f, g=0.0):
    S, b = immersed_matrices(data, nu, f=f, g=g)
    n = data.cells.resolution
    fixed = ~data.active
    apply_dirichlet(S, b, fixed, np.zeros(n))
    return FEMSystem(S, b.ravel(), fixed.ravel(), np.zeros(fixed.size), n).solve("direct")


def test_immersed_energy_is_its_assembled_quadratic_form_and_that_is_positive_definite():
    n = 33
    rng = np.random.default_rng(0)
    nu = np.exp(0.5 * rng.standard_normal((n, n)))
    data = immersed(cut_cells(Star((0.5, 0.5), 0.3, (0.1, -0.05), (0.05, 0.08)), (n, n)), nu, dirichlet=True)
    S, b = immersed_matrices(data, nu, kappa=1.5, f=2.0, g=0.3)
    K = to_csr(S)
    x = rng.standard_normal((2, n, n)) * data.active
    u = torch.tensor(x, requires_grad=True)
    J = immersed_energy(u, torch.as_tensor(np.stack([nu, nu])), [data, data], kappa=1.5, f=2.0, g=0.3)
    c = immersed_energy(torch.zeros(1, n, n, dtype=torch.float64), torch.as_tensor(nu[None]), [data], 1.5, 2.0, 0.3)
    for k in range(2):
        assert J[k].item() - c.item() == pytest.approx(0.5 * x[k].ravel() @ K @ x[k].ravel() - b.ravel() @ x[k].ravel(),
                                                       rel=1e-12)
    grad = torch.autograd.grad(J.sum(), u)[0][0].numpy().ravel()
    np.testing.assert_allclose(grad, K @ x[0].ravel() - b.ravel(), atol=1e-10 * np.abs(grad).max())
    active = data.active.ravel()
    assert abs(K - K.T).max() < 1e-12
    assert np.linalg.eigvalsh(K.toarray()[active][:, active])[0] > 0  # Nitsche's penalty from the local bound


def test_torsion_of_a_disc_converges_to_its_closed_form_at_second_order():
    """-Δu = 1 in a disc, u = 0 on its circle: u = (R² - r²) / 4; the immersed solution's error at the
    inside nodes falls as h²."""
    R, c = 0.31, np.array([0.5, 0.47])
    errors = []
    for n in (17, 33, 65, 129):
        data = immersed(cut_cells(Disc(tuple(c), R), (n, n)), np.ones((n, n)), dirichlet=True)
        u = _solve(data, np.ones((n, n)), 1.0)
        exact = (R**2 - ((grid_points((n, n)) - c) ** 2).sum(-1)) / 4
        inside = data.cells.inside
        errors.append(np.linalg.norm((u - exact)[inside]) / np.linalg.norm(exact[inside]))
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    assert errors[-1] < 2e-4 and orders.mean() > 1.8, (errors, orders)
