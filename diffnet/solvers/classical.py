"""The Q1 families' classical solvers as a DiffNet's competitors: one instance solved on a grid of the
solver's choosing, and its field carried onto the network's output grid so the two are judged at the
same nodes.

A configuration is (grid, method): nodes per side and a multigrid variant. The Q1 families'
``classical`` capability (:mod:`diffnet.protocol.capabilities`) is built from these functions:
:func:`q1_configurations` lists the sweep a comparison at equal accuracy walks through, coarse to
fine. Burgers's (Godunov on a sweep of cells) lives with its solver, :mod:`diffnet.solvers.burgers`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from diffnet.grid.transfer import interpolation_matrix

__all__ = ["Q1_METHODS", "DIRECT_METHODS", "q1_configurations", "q1_solver", "q1_to_grid", "Q1Classical"]

# "fmg1": full multigrid (geometric, Galerkin coarse operators), one V-cycle per level; "fmg":
# the same, then V-cycles until the algebraic error is a tenth of the discretisation error;
# "cholesky": a sparse Cholesky (CHOLMOD), the direct solve a 2-D user reaches for first;
# "sa-cg": pyamg's default smoothed aggregation preconditioning CG to a relative residual of
# 1e-8 (the reference row).
Q1_METHODS = {
    "fmg1": "geometric multigrid, FMG, 1 V(1,1)-cycle per level",
    "fmg": "geometric multigrid, FMG to discretisation accuracy",
    "cholesky": "sparse Cholesky (CHOLMOD), assembly and factorisation per solve",
    "sa-cg": "pyamg default smoothed aggregation + CG to 1e-8",
}
# The methods of a sweep that solve directly (a factorisation): every family whose classical side solves a sparse
# linear system (or Newton's) sweeps at least one of these (tests/methods/test_strongest_classical.py); a
# non-symmetric Jacobian (Navier-Stokes') takes a sparse LU.
DIRECT_METHODS = ("cholesky", "newton-cholesky", "newton-lu")

# Grids of the sweep, about a factor 1.5 apart: (2^k + 1) nodes and halfway between.
_NODES = (5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537, 2049)


def q1_configurations(family) -> dict[str, list[int]]:
    """FEM nodes per side to sweep, coarse to fine, for "fmg1", "fmg" and (2-D) "cholesky".

    The grids stop below the independent reference's grid (``problem.truth_refine`` times
    finer): there a classical solve *is* the reference, and its error against it means nothing.
    """
    n = max(family.resolution)
    finest = family.truth_refine * (n - 1) + 1
    # The network's own grid is a candidate too: there the Q1 solve is the floor itself,
    # while a neighbouring grid pays an interpolation error to reach these nodes.
    grids = sorted({g for g in _NODES if g < finest} | {n})
    # A sparse Cholesky in 2-D only: in 3-D its fill-in makes it slower than the iterative solves at every size
    # swept (elasticity 17³: 665 ms against AMG-CG's 221 ms; 33³: 45 s against 2.2 s).
    return {"fmg1": grids, "fmg": grids, **({"cholesky": grids} if len(family.resolution) == 2 else {})}


def q1_solver(family, method: str, grid: int) -> Callable[[np.ndarray], np.ndarray]:
    """A function of one instance's parameters returning its Q1 solution on a grid x grid (x grid) mesh.

    Everything a user of that solver pays per instance happens inside the call (the Q1
    assembly and the multigrid setup included), so timing the call times the solve.
    A non-square network grid is matched by its longer side.
    """
    if method not in Q1_METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(Q1_METHODS)}")
    coarse = dataclasses.replace(family, resolution=(grid,) * len(family.resolution))

    def fem(instances: np.ndarray) -> np.ndarray:
        system = coarse.fem_system(instances)
        if method == "sa-cg":
            import pyamg

            ml = pyamg.smoothed_aggregation_solver(system.A)
            u = ml.solve(system.rhs, tol=1e-8, accel="cg", maxiter=500)
            u[system.fixed] = system.values[system.fixed]
            return u.reshape(system.shape)
        if method == "cholesky":
            return system.solve("cholesky")
        return system.multigrid().fmg(cycles=1, to_discretisation=method == "fmg")

    return fem


def q1_to_grid(family, native: np.ndarray) -> np.ndarray:
    """A Q1 solution carried onto ``family``'s nodes: Q1 solutions are (bi/tri)linear on their
    elements, so evaluating them at other nodes is the multigrid's own separable interpolation."""
    out = np.asarray(native)
    for axis, n in enumerate(family.resolution):
        if out.shape[axis] != n:
            moved = np.moveaxis(out, axis, 0)
            carried = interpolation_matrix(moved.shape[0], n) @ moved.reshape(moved.shape[0], -1)
            out = np.moveaxis(carried.reshape(n, *moved.shape[1:]), 0, axis)
    return out


class Q1Classical:
    """The ``classical`` capability of the Q1 families (2-D and 3-D), mixed into a :class:`~diffnet.protocol.family.Family`
    with ``fem_system`` and ``truth_refine``: geometric multigrid FMG over a sweep of grids, and pyamg's
    default beside it."""

    classical_baseline = "sa-cg"  # pyamg's default, timed beside the cheapest configuration

    @property
    def classical_methods(self) -> dict[str, str]:
        return Q1_METHODS

    def classical_configurations(self) -> dict[str, list[int]]:
        return q1_configurations(self)

    def classical_solver(self, method: str, grid: int) -> Callable[[np.ndarray], np.ndarray]:
        return q1_solver(self, method, grid)

    def classical_to_grid(self, method: str, native: np.ndarray, instances: np.ndarray) -> np.ndarray:
        return q1_to_grid(self, native)
