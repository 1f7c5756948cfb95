"""Geometric multigrid for the Q1 systems: interpolation, agreement with the direct solve,
grid-independent convergence, and FMG at discretisation accuracy."""

import numpy as np
import pytest

from diffnet.problems.poisson import PoissonProblem
from diffnet.problems.reaction_diffusion import ReactionDiffusionProblem
from diffnet.solvers.gmg import GMGSolver, grid_hierarchy, interpolation_1d, prolongation

A = np.array([1.5, -2.0, 0.7, 2.5, -1.0, 0.3])  # nu over about four decades


@pytest.mark.parametrize("fine, coarse", [(17, 9), (64, 32), (40, 13)])
def test_interpolation_reproduces_linear_functions(fine, coarse):
    P = interpolation_1d(fine, coarse)
    xf, xc = np.linspace(0, 1, fine), np.linspace(0, 1, coarse)
    assert np.allclose(P @ np.ones(coarse), 1.0)
    assert np.allclose(P @ (3 * xc - 1), 3 * xf - 1)
    assert (P.toarray() >= 0).all()


def test_nested_grids_inject_and_average():
    P = interpolation_1d(9, 5).toarray()
    assert np.allclose(P[::2], np.eye(5))
    assert np.allclose(P[1::2], 0.5 * (np.eye(5)[:-1] + np.eye(5)[1:]))
    P2 = prolongation((9, 17), (5, 9))
    assert P2.shape == (9 * 17, 5 * 9)
    y, x = np.mgrid[0:1:5j, 0:1:9j]
    yf, xf = np.mgrid[0:1:9j, 0:1:17j]
    assert np.allclose(P2 @ (x * y).ravel(), (xf * yf).ravel())  # bilinear is exact on xy


def test_hierarchy_halves_to_the_coarsest():
    assert grid_hierarchy((1025, 1025)) == [(1025, 1025), (513, 513), (257, 257), (129, 129), (65, 65),
                                            (33, 33), (17, 17), (9, 9)]
    assert grid_hierarchy((64, 40)) == [(64, 40), (32, 20), (16, 10), (8, 5)]


@pytest.mark.parametrize("n", [17, 33, 40])
@pytest.mark.parametrize("family", ["poisson", "reaction_diffusion"])
def test_preconditioned_cg_equals_the_direct_solve(n, family):
    problem = PoissonProblem((n, n)) if family == "poisson" else ReactionDiffusionProblem((n, n))
    system = problem.fem_system(A)
    direct = system.solve("direct")
    solver = GMGSolver.build(system)
    stats = {}
    u = solver.solve(1e-10, stats=stats)
    assert np.abs(u - direct).max() <= 1e-8 * np.abs(direct).max()
    assert stats["iterations"] <= 12
    # The Dirichlet values are exact, not solved for.
    assert np.array_equal(u.ravel()[system.fixed], system.values[system.fixed])


def test_cycles_to_tolerance_do_not_grow_with_the_grid():
    iterations = []
    for n in (33, 65, 129, 257):
        stats = {}
        GMGSolver.build(PoissonProblem((n, n)).fem_system(A)).solve(1e-8, stats=stats)
        iterations.append(stats["iterations"])
    assert max(iterations) - min(iterations) <= 2, iterations
    assert max(iterations) <= 12, iterations


def test_one_fmg_cycle_reaches_the_discretisation_error():
    """FMG's algebraic error stays a small fraction of the grid's floor (the same-grid FEM against
    a 4x finer FEM) at every grid, so one cycle per level is a complete solve."""
    for n in (17, 33, 65, 129):
        problem = PoissonProblem((n, n))
        system = problem.fem_system(A)
        exact = system.solve("direct")
        floor = np.linalg.norm(exact - problem.truth(A[None])[0]) / np.linalg.norm(exact)
        u = GMGSolver.build(system).fmg(cycles=1)
        algebraic = np.linalg.norm(u - exact) / np.linalg.norm(exact)
        assert algebraic < 0.3 * floor, (n, algebraic, floor)
        assert np.array_equal(u[:, 0], np.ones(n)) and np.array_equal(u[:, -1], np.zeros(n))
