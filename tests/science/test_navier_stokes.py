"""The stabilised Q1 Navier–Stokes residual (diffnet.discretisation.navier_stokes) and the cavity's Newton solve
(diffnet.solvers.navier_stokes): its coloured Jacobian is autograd's, and its root meets Ghia, Ghia & Shin (1982)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from diffnet.discretisation.navier_stokes import navier_stokes_residual
from diffnet.solvers.navier_stokes import cavity_residual, cavity_solve
from diffnet.solvers.ghia import U, Y, centreline_deviation
from diffnet.solvers.newton import sparse_jacobian

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
    assert float(r.abs().max()) < 1e-8
    u = np.interp(Y, np.linspace(0.0, 1.0, n), solution[0][:, n // 2])
    # 0.0043 measured on 2026-12-07: the scheme on 33^2 is within half a percent of the lid speed of Table I;
    # Table II's v as close (both: 0.0043).
    assert np.abs(u - U[100]).max() < 0.006
    assert centreline_deviation(solution, 100) < 0.006
    with pytest.raises(ValueError, match="Ghia et al. tabulate Re = 100, 400, 1000; got 500"):
        centreline_deviation(solution, 500)
    assert abs(solution[2, 0, 0]) < 1e-15  # the pressure pinned at the corner (0, 0)
