"""A residual's sweeps (diffnet/multigrid/residual_sweeps.py): symmetric Gauss-Seidel on J^T J, colour by colour, each
node's Gauss-Newton step: for a linear residual exactly block Gauss-Seidel on the normal equations (against a dense
oracle, one and two unknowns, S = C = 2), for a nonlinear one |r|^2 never rises; fixed nodes held; no gradient."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from diffnet.multigrid.residual_sweeps import residual_sweeps
from diffnet.protocol.loss import Residual


@dataclass(frozen=True)
class Transport:
    """-eps lap u + b . grad u + kappa u + cubic u^3 = 1 by central differences on an n x n grid, u = 0 on the boundary;
    with ``coupled`` two unknowns, each the other's source."""

    resolution: tuple[int, int] = (9, 9)
    cubic: float = 0.0
    coupled: bool = False

    @property
    def unknowns(self):
        return ("a", "b") if self.coupled else ("u",)

    def field(self, raw, c):
        return F.pad(raw[:, :, 1:-1, 1:-1], (1, 1, 1, 1)) if self.coupled else F.pad(raw[:, 0, 1:-1, 1:-1], (1, 1, 1, 1))

    def _one(self, u, c):
        h = 1.0 / (self.resolution[0] - 1)
        m = u[:, 1:-1, 1:-1]
        lap = (u[:, 2:, 1:-1] + u[:, :-2, 1:-1] + u[:, 1:-1, 2:] + u[:, 1:-1, :-2] - 4 * m) / h**2
        grad = c[:, None, None] * (u[:, 1:-1, 2:] - u[:, 1:-1, :-2]) / (2 * h) + (u[:, 2:, 1:-1] - u[:, :-2, 1:-1]) / (4 * h)
        return F.pad(-0.05 * lap + grad + 2.0 * m + self.cubic * m**3 - 1.0, (1, 1, 1, 1)) * h

    def residual(self, u, c):
        if not self.coupled:
            return self._one(u, c)
        inside = F.pad(torch.ones_like(u[:, 0, 1:-1, 1:-1]), (1, 1, 1, 1))
        return torch.stack([self._one(u[:, 0], c) - 0.5 * inside * u[:, 1], self._one(u[:, 1], 2 * c) + 0.3 * inside * u[:, 0]], 1)

    def loss(self):
        return Residual(lambda u, c: {"r": self.residual(u, c).square().flatten(1).sum(1)}, self.residual)


def _start(family, c, seed=0):
    shape = (len(c), len(family.unknowns), *family.resolution)
    return family.field(torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)), c)


def _dense_sweep(family, u, c):
    """One symmetric sweep of block Gauss-Seidel on the normal equations of a linear residual, by its dense Jacobian:
    the colours (nodes 3 apart on each axis, a 5-point residual's) forwards then backwards, each colour's free unknowns
    solved together."""
    n, channels = family.resolution[0], len(family.unknowns)
    colours = list(itertools.product(range(3), range(3)))
    out = u.clone()
    for s in range(len(c)):
        residual = lambda v: family.residual(v.reshape(u[s:s + 1].shape), c[s:s + 1]).flatten()  # noqa: E731
        x = u[s].flatten().clone()
        jac = torch.autograd.functional.jacobian(residual, x)  # constant: the residual is linear
        for colour in colours + colours[::-1]:
            mask = torch.zeros(n, n, dtype=torch.bool)
            mask[colour[0]::3, colour[1]::3] = True
            mask[0], mask[-1], mask[:, 0], mask[:, -1] = False, False, False, False  # the fixed nodes
            columns = (mask.expand(channels, n, n) if channels > 1 else mask).flatten().nonzero().flatten()
            block = jac[:, columns]
            x[columns] -= torch.linalg.solve(block.T @ block, block.T @ residual(x))
        out[s] = x.reshape(u.shape[1:])
    return out


@pytest.mark.parametrize("coupled", [False, True])
def test_one_sweep_of_a_linear_residual_is_block_gauss_seidel_on_its_normal_equations(coupled):
    family = Transport(coupled=coupled)
    c = torch.tensor([0.7, -0.4], dtype=torch.float64)  # two instances; two unknowns when coupled: S = C
    u = _start(family, c)
    swept = residual_sweeps(family, u, c, 1)
    expected = _dense_sweep(family, u, c)
    assert torch.allclose(swept, expected, rtol=0, atol=1e-11 * float(expected.abs().max()))
    # The fixed (boundary) nodes keep their values.
    edge = (slice(None),) + ((slice(None),) if coupled else ()) + (0,)
    assert torch.equal(swept[edge], u[edge])


def test_sweeps_of_a_nonlinear_residual_never_raise_its_squares_and_refuse_a_gradient():
    family = Transport(cubic=4.0, coupled=True)
    c = torch.tensor([0.7, -0.4], dtype=torch.float64)
    u = 3.0 * _start(family, c, seed=1)  # far out: the cubic term dominates
    losses = [family.loss().value(u, c)]
    for _ in range(3):
        u = residual_sweeps(family, u, c, 1)
        losses.append(family.loss().value(u, c))
    assert all((b <= a).all() for a, b in zip(losses, losses[1:])) and (losses[-1] < 0.5 * losses[0]).all()
    with pytest.raises(RuntimeError, match="no gradient"):
        residual_sweeps(family, u.clone().requires_grad_(True), c, 1)
