"""The geometric multigrid of the vector Q1 systems (diffnet/solvers/vector_gmg.py): its transfers, its
hierarchy, and CG preconditioned by it against a direct solve, in a number of iterations the grid does not set."""

import numpy as np
import pytest

from diffnet.families.elasticity import ElasticityFamily, Elasticity3DFamily
from diffnet.solvers.elasticity import elasticity_matrix, rigid_body_modes, to_dofs
from diffnet.solvers.vector_gmg import geometric_hierarchy, vector_prolongation


@pytest.mark.parametrize("fine, coarse", [((9, 9), (5, 5)), ((7, 9), (4, 5)), ((5, 5, 5), (3, 3, 3))])
def test_the_prolongation_carries_each_component_and_every_affine_motion_exactly(fine, coarse):
    P = vector_prolongation(fine, coarse)
    d = len(fine)
    assert P.shape == (int(np.prod(fine)) * d, int(np.prod(coarse)) * d)
    # Translations and rotations are affine in x: multilinear interpolation reproduces them node for node.
    np.testing.assert_allclose(P @ rigid_body_modes(coarse), rigid_body_modes(fine), atol=1e-14)
    # A component never leaks into another.
    only_x = np.zeros((d, *coarse))
    only_x[0] = np.random.default_rng(0).normal(size=coarse)
    moved = (P @ to_dofs(only_x)).reshape(-1, d)
    assert np.all(moved[:, 1:] == 0.0) and np.abs(moved[:, 0]).max() > 0


@pytest.mark.parametrize("family, grid, sides", [
    (ElasticityFamily, 33, {}),  # clamped at x = 0, pulled at x = 1
    (ElasticityFamily, 29, {"x0": "u=0,free", "x1": "traction=1,0.2", "pin": "0.37,0.61"}),  # a roller and a pin off the coarse grids
    (Elasticity3DFamily, 9, {}),
])
def test_geometric_multigrid_cg_is_the_direct_solve_in_few_iterations(family, grid, sides):
    f = family(resolution=(grid,) * family.dims, **sides)
    system = f.system(f.sample(2, "random", 1)[1])
    stats = {}
    u = system.solve("gmg", tol=1e-10, stats=stats)
    exact = system.solve("direct")
    assert np.linalg.norm(u - exact) <= 1e-9 * np.linalg.norm(exact)
    assert stats["iterations"] <= 15, stats


def test_its_iterations_do_not_grow_with_the_grid():
    counts = []
    for grid in (17, 65):
        f = ElasticityFamily(resolution=(grid, grid))
        stats = {}
        f.system(f.sample(1, "random", 4)[0]).solve("gmg", tol=1e-8, stats=stats)
        counts.append(stats["iterations"])
    assert counts[1] <= counts[0] + 2, counts


def test_the_hierarchy_nests_its_galerkin_operators_and_refuses_a_mismatched_k():
    f = ElasticityFamily(resolution=(17, 17))
    system = f.system(f.sample(1, "random", 0)[0])
    free = ~system.fixed
    k_ff = system.K[free][:, free].tocsr()
    hierarchy = geometric_hierarchy(k_ff, system.shape, free)
    sizes = [level.A.shape[0] for level in hierarchy.levels]
    assert sizes[0] == free.sum() and sizes == sorted(sizes, reverse=True) and len(sizes) == 3  # 17 -> 9 -> 5
    for level, coarse in zip(hierarchy.levels, hierarchy.levels[1:]):
        difference = coarse.A - level.P.T @ level.A @ level.P
        assert abs(difference).max() <= 1e-13 * abs(coarse.A).max()
    with pytest.raises(ValueError, match="free dofs"):
        geometric_hierarchy(k_ff[:-1, :-1], system.shape, free)


def test_the_assembly_pattern_is_sorted_csr_without_duplicates():
    K = elasticity_matrix(np.ones((4, 5, 6)), 0.25)
    assert K.has_sorted_indices and K.has_canonical_format
    # A node couples with its 27 neighbours' 3 components at most (3 x 81 slots), a corner node with 8 x 3.
    per_row = np.diff(K.indptr)
    assert per_row.max() == 81 and per_row.min() == 24


def test_newton_with_geometric_multigrid_steps_reaches_the_cholesky_steps_solution():
    from diffnet.families.hyperelasticity import HyperelasticityFamily

    f = HyperelasticityFamily(resolution=(17, 17))
    p = f.sample(1, "random", 2)[0]
    by_gmg = f.classical_solver("newton-gmg-4", 17)
    u = by_gmg(p)
    exact = f.classical_solver("newton-cholesky", 17)(p)
    assert by_gmg.last.cg_iterations > 0 and by_gmg.last.newton_steps <= 12
    assert np.linalg.norm(u - exact) <= 1e-4 * np.linalg.norm(exact)
