"""The polish: k classical iterations from a network's output ("DiffNet + k cycles"), for every built-in family."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
from helpers import network_like

from diffnet.families.burgers import BurgersFamily
from diffnet.families.poisson import PoissonFamily
from diffnet.families.reaction_diffusion import ReactionDiffusionFamily
from diffnet.solvers.gmg import GMGSolver, prolongation

A = np.array([1.5, -2.0, 0.7, 2.5, -1.0, 0.3])  # nu over about four decades


def _energy_norm(K: np.ndarray, e: np.ndarray) -> float:
    return float(np.sqrt(e @ K @ e))


def test_one_vcycle_contracts_the_error_by_the_cycles_factor():
    """The V-cycle's energy-norm contraction factor rho = ||E||_A, from its error-propagation matrix E
    (the cycle applied to each unit error on the free nodes), bounds one polish step from any start;
    from the prolonged coarse FEM solution (the network's typical output) one cycle removes most of it."""
    fine, coarse = PoissonFamily((17, 17)), PoissonFamily((9, 9))
    system = fine.fem_system(A)
    solver = GMGSolver.build(system)
    exact = system.solve("direct").ravel()
    free = ~system.fixed
    K = system.A.toarray()[np.ix_(free, free)]
    E = np.empty((free.sum(), free.sum()))
    for j, node in enumerate(np.flatnonzero(free)):
        start = exact.copy()
        start[node] += 1.0
        E[:, j] = (solver.vcycles(start.reshape(17, 17), 1).ravel() - exact)[free]
    rho = float(np.sqrt(scipy.linalg.eigh(E.T @ K @ E, K, eigvals_only=True).max()))
    assert 0.0 < rho < 0.5
    guess = (prolongation((17, 17), (9, 9)) @ coarse.fem_system(A).solve("direct").ravel())
    before = _energy_norm(K, (guess - exact)[free])
    polished = fine.polish(A[None], guess.reshape(1, 17, 17), 1)[0].ravel()
    after = _energy_norm(K, (polished - exact)[free])
    assert after <= rho * before * (1 + 1e-9)
    assert after < 0.5 * before
    # k cycles: at most rho^k, and the Dirichlet values exact whatever the start held there.
    noisy = guess.reshape(1, 17, 17) + 0.1
    three = fine.polish(A[None], noisy, 3)[0]
    assert _energy_norm(K, (three.ravel() - exact)[free]) <= rho**3 * _energy_norm(K, (noisy.ravel() - exact)[free]) * (1 + 1e-9)
    assert np.all(three[:, 0] == 1.0) and np.all(three[:, -1] == 0.0)
    np.testing.assert_array_equal(fine.polish(A[None], noisy, 0)[0][:, 1:-1], noisy[0][:, 1:-1])


def test_reaction_diffusion_polish_converges_to_its_fem_solution():
    problem = ReactionDiffusionFamily((17, 17), kappa=2.0, source=1.0)
    exact = problem.reference(A[None], method="direct")
    start = np.zeros_like(exact)
    errors = [np.abs(problem.polish(A[None], start, k) - exact).max() for k in (1, 4, 12)]
    assert errors[0] < np.abs(start - exact).max() and errors[2] < 1e-3 * errors[0] and errors[1] < errors[0]


def test_burgers_newton_sweeps_reach_the_scheme_solution():
    problem = BurgersFamily((17, 33), viscosity=0.01, stencil="conservative")
    c = np.array([3.5, 5.0])
    scheme = problem.scheme_solution(c)
    rng = np.random.default_rng(0)
    start = scheme + 0.05 * rng.normal(size=scheme.shape)
    start[:, 0], start[:, :, 0] = scheme[:, 0], 0.0
    errors = [np.abs(problem.polish(c, start, k) - scheme).max() for k in (1, 2, 6)]
    assert errors[0] < 0.05 and errors[1] < errors[0] and errors[2] < 1e-9
    with pytest.raises(ValueError, match="conservative residual"):
        BurgersFamily((17, 33), viscosity=0.01, stencil="sobel").polish(c, start, 1)


@pytest.mark.parametrize("name", ["poisson", "poisson3d", "reaction_diffusion", "torsion", "plate", "burgers"])
def test_one_polish_step_reduces_the_error_on_every_instance(name):
    # Against the same-grid solution, on 6 instances of each family that polishes, from a start shaped like a
    # network's output: one step (a V-cycle, a Newton sweep) never makes it worse. On the cut domains the
    # extension past the boundary is re-solved first; without that, one V-cycle raised such errors 2-4x.
    from deepfusion.configuration.config import load_config
    from deepfusion.configuration.run import Run

    grid = {"poisson3d": [9, 9, 9], "burgers": [17, 33]}.get(name, [33, 33])
    extra = ["burgers.residual=conservative"] if name == "burgers" else []
    problem = Run.from_config(load_config(None, [f"problem.family={name}", f"problem.resolution={grid}",
                                                 "data.sampling=random", "data.n_train=1", "train.batch_size=1",
                                                 *extra])).family
    rng = np.random.default_rng(1)
    params = problem.sample(6, "random", 3)
    exact, start, measured = network_like(problem, params, rng)
    polished = problem.polish(params, start, 1)

    def error(fields):
        diff = np.where(measured, fields - exact, 0.0).reshape(len(fields), -1)
        return np.linalg.norm(diff, axis=1) / np.linalg.norm(np.where(measured, exact, 0.0).reshape(len(fields), -1), axis=1)

    before, after = error(start), error(polished)
    assert np.all(after < 0.5 * before), (before, after)
