"""A sparse LU solve: PARDISO (Intel MKL, through pypardiso) where it is installed, SuperLU (scipy) otherwise.

Measured on the cavity's Newton Jacobian (three unknowns a node, 27-point blocks; one thread, 2026-12-07): 65^2
(12,675 unknowns) SuperLU 0.17-0.18 s, PARDISO 0.13-0.31 s (by the field; 0.31 s at a solution at Re = 300); 129^2
SuperLU 1.59 s, PARDISO 0.33 s; 257^2 SuperLU 10.3 s, PARDISO 2.2 s (the same solution to 1e-11). On small systems
PARDISO's set-up per call dominates (17^2: tens of milliseconds where SuperLU takes one), so it takes the systems
of :data:`PARDISO_FROM` unknowns and more. scikit-umfpack has no wheel (its source needs SWIG and SuiteSparse's
headers). MKL has no wheel for ARM machines, so pypardiso is installed on x86-64 only and SuperLU is the rest's.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import splu

__all__ = ["LU_METHODS", "PARDISO_FROM", "available", "lu_solve"]

PARDISO_FROM = 30_000  # unknowns: between 65^2 (12,675: SuperLU's, as fast or faster) and 129^2 (49,923: PARDISO 4.8x)
LU_METHODS = {"pardiso": "PARDISO (Intel MKL, pypardiso)", "superlu": "SuperLU (scipy)"}


@lru_cache(maxsize=1)
def _pardiso():
    try:
        import pypardiso
    except ImportError:  # not installed (ARM machines: no MKL wheel)
        return None
    return pypardiso


def available(unknowns: int | None = None) -> str:
    """The fastest LU installed for a system of ``unknowns`` (default: a large one): "pardiso" where pypardiso
    imports and the system has :data:`PARDISO_FROM` unknowns or more, "superlu" otherwise."""
    large = unknowns is None or unknowns >= PARDISO_FROM
    return "pardiso" if large and _pardiso() is not None else "superlu"


def lu_solve(matrix: sp.spmatrix, rhs: np.ndarray, method: str | None = None) -> np.ndarray:
    """x with ``matrix`` x = ``rhs`` (a vector, or one column per right-hand side) by a fresh factorisation with
    ``method`` ("pardiso", "superlu"; default :func:`available` for its size)."""
    method = method or available(matrix.shape[0])
    if method == "pardiso":
        solver = _pardiso()
        if solver is None:
            raise ValueError("the LU 'pardiso' needs pypardiso (pip install pypardiso; x86-64 only)")
        # A solver of its own each call, its memory freed after: pypardiso's shared default keeps the last factor.
        pardiso = solver.PyPardisoSolver()
        try:
            return pardiso.solve(sp.csr_matrix(matrix), np.asarray(rhs, dtype=np.float64))
        finally:
            pardiso.free_memory(everything=True)
    if method == "superlu":
        return splu(sp.csc_matrix(matrix)).solve(np.asarray(rhs, dtype=np.float64))
    raise ValueError(f"unknown LU {method!r}; choose from {', '.join(LU_METHODS)}")
