"""Geometric multigrid for the Q1 systems: interpolation, agreement with the direct solve,
grid-independent convergence, and FMG at discretisation accuracy."""

import numpy as np
import pytest

from diffnet.families.poisson import PoissonFamily
from diffnet.families.poisson3d import Poisson3DFamily
from diffnet.families.reaction_diffusion import ReactionDiffusionFamily
from diffnet.grid.transfer import grid_hierarchy, interpolation_matrix, interpolation_weights
from diffnet.solvers.gmg import COARSEST, GMGSolver, prolongation

A = np.array([1.5, -2.0, 0.7, 2.5, -1.0, 0.3])  # nu over about four decades


@pytest.mark.parametrize("fine, coarse", [(17, 9), (64, 32), (40, 13)])
def test_interpolation_reproduces_linear_functions(fine, coarse):
    P = interpolation_matrix(coarse, fine)
    xf, xc = np.linspace(0, 1, fine), np.linspace(0, 1, coarse)
    assert np.allclose(P @ np.ones(coarse), 1.0)
    assert np.allclose(P @ (3 * xc - 1), 3 * xf - 1)
    assert (P >= 0).all()


def test_nested_grids_inject_and_average():
    P = interpolation_matrix(5, 9)
    assert np.allclose(P[::2], np.eye(5))
    assert np.allclose(P[1::2], 0.5 * (np.eye(5)[:-1] + np.eye(5)[1:]))
    P2 = prolongation((9, 17), (5, 9))
    assert P2.shape == (9 * 17, 5 * 9)
    y, x = np.mgrid[0:1:5j, 0:1:9j]
    yf, xf = np.mgrid[0:1:9j, 0:1:17j]
    assert np.allclose(P2 @ (x * y).ravel(), (xf * yf).ravel())  # bilinear is exact on xy


def test_hierarchy_halves_to_the_coarsest():
    # coarsest first, as every hierarchy here counts its levels
    assert grid_hierarchy((1025, 1025), COARSEST) == [(9, 9), (17, 17), (33, 33), (65, 65), (129, 129), (257, 257),
                                                      (513, 513), (1025, 1025)]
    assert grid_hierarchy((64, 40), COARSEST) == [(8, 5), (16, 10), (32, 20), (64, 40)]


@pytest.mark.parametrize("n", [17, 33, 40])
@pytest.mark.parametrize("family", ["poisson", "reaction_diffusion"])
def test_preconditioned_cg_equals_the_direct_solve(n, family):
    problem = PoissonFamily((n, n)) if family == "poisson" else ReactionDiffusionFamily((n, n))
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
        GMGSolver.build(PoissonFamily((n, n)).fem_system(A)).solve(1e-8, stats=stats)
        iterations.append(stats["iterations"])
    assert max(iterations) - min(iterations) <= 2, iterations
    assert max(iterations) <= 12, iterations


def test_one_fmg_cycle_reaches_the_discretisation_error():
    """FMG's algebraic error stays a small fraction of the grid's floor (the same-grid FEM against
    a 4x finer FEM) at every grid, so one cycle per level is a complete solve."""
    for n in (17, 33, 65, 129):
        problem = PoissonFamily((n, n))
        system = problem.fem_system(A)
        exact = system.solve("direct")
        floor = np.linalg.norm(exact - problem.truth(A[None])[0]) / np.linalg.norm(exact)
        u = GMGSolver.build(system).fmg(cycles=1)
        algebraic = np.linalg.norm(u - exact) / np.linalg.norm(exact)
        assert algebraic < 0.3 * floor, (n, algebraic, floor)
        assert np.array_equal(u[:, 0], np.ones(n)) and np.array_equal(u[:, -1], np.zeros(n))


# --- the compiled kernels against scipy.sparse / pyamg on the same operators ---------------------------

from diffnet.solvers import matrix_stencil as ms  # noqa: E402
from diffnet.solvers.fem import dirichlet_system  # noqa: E402


def _masked_prolongation(fine, coarse, fixed_fine, fixed_coarse):
    """Multilinear P (scipy, Kronecker) without rows at fixed fine nodes or columns at fixed coarse nodes."""
    P = prolongation(fine, coarse).tolil()
    P[np.flatnonzero(fixed_fine.ravel()), :] = 0.0
    P[:, np.flatnonzero(fixed_coarse.ravel())] = 0.0
    return P.tocsr()


def _axes(fine, coarse):
    """The prolongation's (left, weight) arrays per axis of the 3-D layout, flat: lz, wz, ly, wy, lx, wx."""
    pairs = [interpolation_weights(1, 1)] * (3 - len(fine)) + [interpolation_weights(f, c)
                                                                  for f, c in zip(fine, coarse)]
    return [a for pair in pairs for a in pair]


@pytest.mark.parametrize("fine, coarse", [((17, 17), (9, 9)), ((40, 64), (20, 32)), ((40, 13), (20, 7)),
                                          ((9, 9, 9), (5, 5, 5)), ((8, 11, 9), (4, 6, 5))])
def test_kernels_equal_their_sparse_matrices(fine, coarse):
    """Residual, Gauss-Seidel, transfers and the Galerkin product of the stencil kernels (2-D and 3-D, one
    source) against the same operators as scipy CSR matrices, with Dirichlet nodes scattered at random."""
    import scipy.sparse as sp
    from scipy.sparse.linalg import spsolve_triangular

    dims = len(fine)
    k = ms.kernels(dims)
    rng = np.random.default_rng(3)
    nu = np.exp(rng.normal(size=fine))
    fixed = rng.random(fine) < 0.15
    system = dirichlet_system(nu, fixed, rng.random(fine))
    S, A = ms.stencil3(system.stencil), system.A
    x, b = rng.normal(size=fine), rng.normal(size=fine)
    x3, b3 = ms.grid3(x), ms.grid3(b)
    r = np.empty(fine)
    k.residual(S, x3, b3, ms.grid3(r))
    assert np.allclose(r.ravel(), b.ravel() - A @ x.ravel(), rtol=0, atol=1e-12)
    # Forward Gauss-Seidel is (D + L) x_new = b - U x_old; backward is (D + U) x_new = b - L x_old.
    for forward in (True, False):
        lower, upper = (sp.tril(A, 0), sp.triu(A, 1)) if forward else (sp.triu(A, 0), sp.tril(A, -1))
        expected = spsolve_triangular(lower.tocsr(), b.ravel() - upper @ x.ravel(), lower=forward)
        y = x.copy()
        k.gauss_seidel(S, ms.grid3(y), b3, forward)
        assert np.allclose(y.ravel(), expected, rtol=0, atol=1e-10)
    # Transfers and the Galerkin product.
    nearest = np.ix_(*(np.rint(np.linspace(0, f - 1, c)).astype(int) for f, c in zip(fine, coarse)))
    fixed_c = np.ascontiguousarray(fixed[nearest])
    P = _masked_prolongation(fine, coarse, fixed, fixed_c)
    axes = _axes(fine, coarse)
    c = rng.normal(size=coarse)
    up = x.copy()
    ms.interpolate(ms.grid3(c), *axes, ms.grid3(fixed), ms.grid3(up))
    # Interpolation reads the coarse fixed nodes too (FMG lifts the coarse Dirichlet data with it;
    # a correction is zero there); it writes only free fine nodes.
    full = _masked_prolongation(fine, coarse, fixed, np.zeros_like(fixed_c))
    assert np.allclose(up.ravel(), x.ravel() + full @ c.ravel(), rtol=0, atol=1e-12)
    c[fixed_c] = 0.0
    assert np.allclose(P @ c.ravel(), full @ c.ravel(), rtol=0, atol=1e-12)
    down = np.empty(coarse)
    ms.restrict(x3, *axes, ms.grid3(fixed), ms.grid3(fixed_c), ms.grid3(down))
    assert np.allclose(down.ravel(), P.T @ x.ravel(), rtol=0, atol=1e-12)
    width = max(ms.coarse_width(1, *axes[2 * axis: 2 * axis + 2]) for axis in range(3 - dims, 3))
    Sc = ms.stencil_native(k.galerkin(S, ms.grid3(fixed), ms.grid3(fixed_c), *axes, width), dims)
    expected = (P.T @ A @ P).tolil()
    expected[np.flatnonzero(fixed_c.ravel()), np.flatnonzero(fixed_c.ravel())] = 1.0
    assert abs(ms.to_csr(Sc) - expected.tocsr()).max() <= 1e-12 * abs(A).max()
    nested = all(f == 2 * m - 1 for f, m in zip(fine, coarse))
    assert width == (1 if nested else 2)  # non-nested grids reach two coarse nodes


@pytest.mark.parametrize("shape", [(33, 33), (40, 40), (17, 17, 17), (13, 17, 11)])
def test_vcycle_equals_pyamgs_on_the_same_levels(shape):
    """The compiled V(1,1)-cycle (forward Gauss-Seidel before, backward after, LU at the bottom) is
    pyamg's cycle on the hierarchy's operators as CSR matrices, to rounding, in 2-D and 3-D."""
    from pyamg.multilevel import MultilevelSolver
    from pyamg.relaxation.smoothing import change_smoothers

    dims = len(shape)
    family = PoissonFamily(shape) if dims == 2 else Poisson3DFamily(shape)
    system = family.fem_system(A)
    solver = GMGSolver.build(system)
    grids = grid_hierarchy(shape, COARSEST)[::-1]  # PyAMG's order: finest first
    assert len(solver.levels) == len(grids) >= 2
    ours = solver.levels[::-1]
    levels = []
    for fine, coarse, fg, cg in zip(ours, ours[1:], grids, grids[1:]):
        level = MultilevelSolver.Level()
        level.A = ms.to_csr(ms.stencil_native(fine.stencil, dims))
        level.P = _masked_prolongation(fg, cg, fine.fixed, coarse.fixed)
        level.R = level.P.T.tocsr()
        levels.append(level)
    last = MultilevelSolver.Level()
    last.A = ms.to_csr(ms.stencil_native(solver.levels[0].stencil, dims))
    ml = MultilevelSolver(levels + [last], coarse_solver="splu")
    change_smoothers(ml, ("gauss_seidel", {"sweep": "forward"}), ("gauss_seidel", {"sweep": "backward"}))
    start = np.random.default_rng(len(shape)).random(shape)
    start.ravel()[system.fixed] = system.values[system.fixed]
    ours = solver.vcycles(start, 2)
    theirs = ml.solve(system.rhs, x0=start.ravel().copy(), tol=0.0, maxiter=2, cycle="V")
    assert np.abs(ours.ravel() - theirs).max() <= 1e-12


@pytest.mark.parametrize("family", ["poisson", "reaction_diffusion", "poisson3d"])
def test_element_wise_coarse_operator_equals_the_stencil_product(family):
    """The first coarse operator formed element by element from nu (nested grids, Dirichlet nodes on
    boundary lines or planes) is the stencil Galerkin product; elsewhere the hierarchy falls back to the product."""
    from diffnet.grid.level import Level
    from diffnet.solvers.gmg import _flat, _nearest, _q1_coarsening
    from diffnet.solvers.q1 import coarse_q1_stencil

    n = 33 if family != "poisson3d" else 17
    problem = {"poisson": PoissonFamily((n, n)), "reaction_diffusion": ReactionDiffusionFamily((n, n), kappa=2.0, source=1.0),
               "poisson3d": Poisson3DFamily((n, n, n))}[family]
    dims = len(problem.resolution)
    system = problem.fem_system(A)
    solver = GMGSolver.build(system)
    fine, coarse = solver.levels[-1], solver.levels[-2]
    assert _q1_coarsening(fine, coarse.fixed)
    product = ms.stencil_native(fine.smoother.passes.galerkin(fine.stencil, fine.fixed, coarse.fixed, *_flat(fine), 1), dims)
    element_wise = coarse_q1_stencil(*system.q1, coarse.fixed.reshape(product.shape[:dims]))
    assert np.abs(element_wise - product).max() <= 1e-12 * np.abs(product).max()
    assert np.array_equal(ms.stencil_native(coarse.stencil, dims), element_wise)  # what build used
    # Not nested, or a Dirichlet node inside a coarse cell: the stencil product.
    half = tuple(f if f == 1 else (f - 1) // 2 for f in fine.fixed.shape)
    assert not _q1_coarsening(Level(fine.stencil, fine.fixed, fine.interpolation, fine.values), np.zeros(half, bool))
    odd = fine.fixed.copy()
    odd[(0,) * (3 - dims) + (5,) * dims] = True
    near = [_nearest(f, (f + 1) // 2 if f > 1 else 1) for f in fine.fixed.shape]
    assert not _q1_coarsening(Level(fine.stencil, odd, fine.interpolation, fine.values), np.ascontiguousarray(odd[np.ix_(*near)]))
