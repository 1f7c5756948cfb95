"""The stabilised Q1 Navier–Stokes residual (diffnet.discretisation.navier_stokes) and the cavity's Newton solve
(diffnet.solvers.navier_stokes): its coloured Jacobian is autograd's, and its root meets Ghia, Ghia & Shin (1982)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from diffnet.discretisation.navier_stokes import navier_stokes_residual
from diffnet.solvers.navier_stokes import cavity_residual, cavity_solve
from diffnet.solvers.newton import sparse_jacobian

# Ghia, Ghia & Shin (1982), Table I: u on the vertical centreline x = 1/2, Re = 100.
GHIA_Y = [1.0, 0.9766, 0.9688, 0.9609, 0.9531, 0.8516, 0.7344, 0.6172, 0.5, 0.4531, 0.2813, 0.1719, 0.1016, 0.0703,
          0.0625, 0.0547, 0.0]
GHIA_U_100 = [1.0, 0.84123, 0.78871, 0.73722, 0.68717, 0.23151, 0.00332, -0.13641, -0.20581, -0.21090, -0.15662,
              -0.10150, -0.06434, -0.04775, -0.04192, -0.03717, 0.0]


def test_the_coloured_jacobian_with_coupled_components_is_autograds():
    # Three unknowns a node, every one coupled to every one within reach: 27 products give the whole Jacobian.
    torch.manual_seed(0)
    x = torch.rand(3, 6, 6, dtype=torch.float64)
    fn = lambda f: cavity_residual(f, torch.full((len(f),), 0.01, dtype=torch.float64))  # noqa: E731
    dense = torch.autograd.functional.jacobian(lambda y: fn(y[None])[0], x).reshape(x.numel(), x.numel()).numpy()
    np.testing.assert_allclose(sparse_jacobian(fn, x, 1, components=True).toarray(), dense, rtol=0, atol=1e-12)


def test_rest_with_a_constant_pressure_is_a_root_and_the_fields_are_checked():
    fields = torch.zeros(2, 3, 5, 5, dtype=torch.float64)
    fields[:, 2] = 3.0  # only the pressure's gradient enters
    r = navier_stokes_residual(fields, 0.01, (0.25, 0.25))
    # The pressure's boundary term -∫ p n·N_a stays on the boundary nodes' momentum rows only.
    assert float(r[:, :2, 1:-1, 1:-1].abs().max()) < 1e-14 and float(r[:, 2].abs().max()) < 1e-14
    with pytest.raises(ValueError, match=r"\(S, 3, N_y, N_x\)"):
        navier_stokes_residual(fields[:, :2], 0.01, (0.25, 0.25))


def test_the_cavity_at_re_100_meets_ghia_on_33_nodes_a_side():
    n = 33
    solution = cavity_solve(100.0, n)
    r = cavity_residual(torch.as_tensor(solution)[None], torch.tensor([0.01], dtype=torch.float64))
    r[:, 2, 0, 0] = 0.0  # the pinned pressure's row (the solution is reported mean-free)
    assert float(r.abs().max()) < 1e-8
    u = np.interp(GHIA_Y, np.linspace(0.0, 1.0, n), solution[0][:, n // 2])
    # 0.0043 measured on 2026-12-07: the scheme on 33^2 is within half a percent of the lid speed of the table.
    assert np.abs(u - GHIA_U_100).max() < 0.006
    assert abs(solution[2].mean()) < 1e-12
