"""A residual loss's coarse correction (diffnet/multigrid/gauss_newton.py): the coloured derivatives assemble
(J P)ᵀ (J P) and (J P)ᵀ r exactly (against the dense Jacobian, one unknown and two, S = C), Gauss–Newton ends where Pᵀ Jᵀ r = 0,
the network gets the loss's own gradient at the minimiser (the envelope theorem, by finite differences), the
residual's squares are Burgers' loss, and its reach is measured."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from diffnet.families.burgers import BurgersFamily
from diffnet.protocol.loss import Residual
from diffnet.multigrid import gauss_newton
from diffnet.multigrid.coarse import coarse_grid
from diffnet.multigrid.hessian import fixed_nodes
from diffnet.multigrid.stencil import as_blocks, components
from diffnet.multigrid.vcycle import along_axes, dense_interpolation


def _burgers(n=17, viscosity=0.01, **keys):
    return BurgersFamily(resolution=(n, n), viscosity=viscosity, stencil="conservative", c_range=(3.0, 6.0), **keys)


@dataclass(frozen=True)
class TwoSpecies:
    """Two Burgers fields coupled at every free node: a residual with two unknowns, for the block layout."""

    one: BurgersFamily
    unknowns = ("a", "b")

    @property
    def resolution(self):
        return self.one.resolution

    def at_resolution(self, resolution):
        return TwoSpecies(self.one.at_resolution(resolution))

    def fixed_nodes(self, instances, dtype):
        single = fixed_nodes(self.one, instances, dtype)
        return torch.stack([single, single], dim=1)

    def residual(self, u, c):
        ra, rb = self.one.residual(u[:, 0], c), self.one.residual(u[:, 1], 1.5 * c)
        mask = F.pad(torch.ones_like(u[:, 0, 1:, 1:]), (1, 0, 1, 0))
        return torch.stack([ra + 0.5 * mask * u[:, 1], rb - 0.3 * mask * u[:, 0]], dim=1)

    def loss(self):
        return Residual(lambda u, c: {"residual": self.residual(u, c).square().flatten(1).sum(1)}, self.residual)


def _field(family, c, scale=0.05, seed=0):
    """The initial condition carried along t (each unknown's) plus a smooth and a rough change, fixed nodes kept."""
    one = family if components(family) == 1 else family.one
    n = one.resolution[0]
    solution = one.inputs(c)[:, 0]
    x = torch.linspace(0.0, 1.0, n, dtype=torch.float64)
    error = scale * torch.sin(3 * x)[:, None] * torch.cos(2 * x)[None, :] + 0.002 * torch.randn(
        len(c), n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    error[:, 0], error[:, :, 0] = 0.0, 0.0
    u = solution + error
    return u if components(family) == 1 else torch.stack([u, u.flip(0)], dim=1)


def _dense_jp(family, w, c, nodes):
    """Per instance, J P (rows: residual nodes, columns: the free coarse nodes) from the dense Jacobian."""
    vector = components(family) > 1
    grid = tuple(family.resolution)
    coarse = coarse_grid(grid, nodes)
    t = [dense_interpolation(n, m, w) for n, m in zip(grid, coarse)]
    out = []
    for k in range(len(w)):
        channels = components(family)
        eye = torch.eye(channels * coarse[0] * coarse[1], dtype=torch.float64).reshape(-1, channels, *coarse)
        free = as_blocks(fixed_nodes(family, c[k:k + 1], w.dtype).logical_not(), vector)[0]
        coarse_free = as_blocks(fixed_nodes(family.at_resolution(coarse), c[k:k + 1], w.dtype).logical_not(),
                                vector)[0]
        p = (along_axes(eye, t, False) * free).flatten(1).T[:, coarse_free.flatten()]  # (fine, free coarse)
        # The dense Jacobian's columns: forward derivatives along every node's unit vector, in one batch.
        size = w[k].numel()
        units = torch.eye(size, dtype=torch.float64).reshape(size, *w.shape[1:])
        _, columns = gauss_newton.residual_jvp(family, w[k:k + 1].expand(size, *w.shape[1:]).clone(), units,
                                    c[k:k + 1].expand(size).clone())
        out.append(columns.flatten(1).T @ p)
    return out


@pytest.mark.slow  # 4 s quiet: the dense Jacobians
def test_the_coloured_derivatives_assemble_the_gram_matrix_and_gradient_of_the_dense_jacobian():
    for family in (_burgers(), TwoSpecies(_burgers())):  # S = C = 2 in the second
        c = torch.tensor([3.5, 5.0], dtype=torch.float64)
        u = _field(family, c)
        vector = components(family) > 1
        grid = tuple(family.resolution)
        coarse = coarse_grid(grid, 5)
        t = [dense_interpolation(n, m, u) for n, m in zip(grid, coarse)]
        channels = components(family)
        layout = gauss_newton._Layout(grid, coarse, gauss_newton.reach(family, u, c), channels, u.device)
        free = as_blocks(fixed_nodes(family, c, u.dtype).logical_not(), vector).double()
        coarse_free = as_blocks(fixed_nodes(family.at_resolution(coarse), c, u.dtype).logical_not(), vector)
        derivatives = []
        for direction in layout.directions:
            fine = along_axes(direction[None] * coarse_free, t, False) * free
            r, d = gauss_newton.residual_jvp(family, u, fine if vector else fine[:, 0], c)
            derivatives.append(as_blocks(d, vector))
        gram, rhs = layout.gather(torch.stack(derivatives), as_blocks(r, vector))
        for k, jp in enumerate(_dense_jp(family, u, c, 5)):
            keep = coarse_free[k].flatten()
            assembled = gram[k][keep][:, keep]
            expected = jp.T @ jp
            assert float((assembled - expected).abs().max()) <= 1e-12 * float(expected.abs().max())
            gradient = jp.T @ family.residual(u[k:k + 1], c[k:k + 1]).flatten()
            assert float((rhs[k, keep, 0] - gradient).abs().max()) <= 1e-12 * float(gradient.abs().max())


def test_gauss_newton_ends_where_the_coarse_gradient_vanishes_and_lowers_the_residual(monkeypatch):
    # A residual with one continuous derivative (first-order states, the Engquist-Osher flux) and nearly linear
    # (nu = 0.1), so that Gauss-Newton converges from far; with the minmod limiter and Godunov's flux it stops at a
    # kink, within 1e-4 of stationary.
    family = _burgers(13, viscosity=0.1, scheme_order=1, flux="engquist_osher")
    # Far from the residual's zero Gauss-Newton converges linearly (the residual's own curvature left out): 19-30
    # iterations here to 1e-8, more than the correction's cap of a training pass.
    monkeypatch.setattr(gauss_newton, "MAX_ITERATIONS", 60)
    c = torch.tensor([3.5, 5.0], dtype=torch.float64)
    u = _field(family, c)
    w, iterations = gauss_newton.least_squares_minimiser(family, u, c, 5)
    loss = lambda v: family.residual(v, c).square().flatten(1).sum(1)  # noqa: E731
    assert (loss(w) < loss(u)).all() and (iterations >= 1).all()
    for k, jp in enumerate(_dense_jp(family, w, c, 5)):
        r = family.residual(w[k:k + 1], c[k:k + 1]).flatten()
        assert float((jp.T @ r).norm()) <= 1e-6 * float(jp.norm() * r.norm())
    # The fixed nodes (the initial row, the inflow column) stay the network's.
    assert torch.equal(w[:, 0], u[:, 0]) and torch.equal(w[:, :, 0], u[:, :, 0])


def test_the_network_gets_the_losss_own_gradient_at_the_minimiser(monkeypatch):
    # At the minimiser Pᵀ ∇L = 0, so d L(u(ũ)) / dũ = ∇L(u): the correction passes the gradient through unchanged, and
    # it is the derivative of the corrected loss (central differences along a direction).
    family = _burgers(13, viscosity=0.1, scheme_order=1, flux="engquist_osher")
    monkeypatch.setattr(gauss_newton, "MAX_ITERATIONS", 60)  # to 1e-8 (the stationarity test)
    c = torch.tensor([4.0], dtype=torch.float64)
    u_tilde = _field(family, c).requires_grad_(True)
    loss = lambda v: family.residual(v, c).square().sum()  # noqa: E731
    w = gauss_newton.coarse_least_squares(family, u_tilde, c, 5)
    (gradient,) = torch.autograd.grad(loss(w), u_tilde)
    direction = torch.randn(u_tilde.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    direction[:, 0], direction[:, :, 0] = 0.0, 0.0
    eps = 1e-5
    with torch.no_grad():
        plus = loss(gauss_newton.coarse_least_squares(family, u_tilde + eps * direction, c, 5))
        minus = loss(gauss_newton.coarse_least_squares(family, u_tilde - eps * direction, c, 5))
    assert abs(float((plus - minus) / (2 * eps)) - float((gradient * direction).sum())) <= 1e-3 * float(
        (gradient * direction).abs().sum())


def test_burgers_residual_squares_are_its_loss_and_its_reach_is_measured():
    family = _burgers(viscosity=0.0)
    c = torch.tensor([3.5, 5.0], dtype=torch.float64)
    u = _field(family, c)
    assert family.loss().kind == "residual" and family.loss().residual.__func__ is type(family).residual
    assert torch.allclose(family.residual(u, c).square().flatten(1).sum(1), family.loss_terms(u, c)["residual"],
                          rtol=1e-12)
    # The MUSCL states reach two nodes along x, BDF2 two rows back: one more each, for safety.
    assert gauss_newton.reach(family, u, c) == (3, 3)
    assert gauss_newton.colours(17, 5, 3) == 4 and gauss_newton.colours(513, 33, 3) == 3
    assert not BurgersFamily(resolution=(9, 9), stencil="sobel").has("least_squares")
    assert not BurgersFamily(resolution=(9, 9), stencil="conservative", boundary="penalty").has("least_squares")



def test_a_residual_not_finite_at_the_networks_field_is_one_line_naming_the_instance():
    from diffnet.multigrid.minimiser import CoarseNewtonError

    family = _burgers(9)
    c = torch.tensor([3.5, 5.0], dtype=torch.float64)
    u = _field(family, c)
    u[1, 4, 4] = float("nan")
    with pytest.raises(CoarseNewtonError, match=r"on 5x5: the loss is not finite at the network's field for "
                                                r"instance\(s\) \[1\]"):
        gauss_newton.least_squares_minimiser(family, u, c, 5)
