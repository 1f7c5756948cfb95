"""The sparse Cholesky factorisation, the classical solve a 2-D user reaches for first: SuiteSparse's CHOLMOD
(supernodal, a fill-reducing ordering of its own) through the ``sksparse-minimal`` wheel, which installs from PyPI
on Linux with no system library (scikit-sparse, its usual binding, needs SuiteSparse's headers to build).

One call is one factorisation: the binding analyses the pattern and factorises in one step and keeps no symbolic
analysis to reuse, so a solve of a new instance on the same grid pays both (measured in the same call as AMG-CG:
elasticity 64², 8 064 unknowns, 16 ms against 33 ms, the assembly included; docs/results.md).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["cholesky_solve"]


def cholesky_solve(A: sp.spmatrix, rhs: np.ndarray) -> np.ndarray:
    """x with A x = ``rhs`` for a symmetric positive definite sparse A, by CHOLMOD.

    Raises
    ------
    ValueError
        When CHOLMOD finds A not positive definite, or the solve's relative residual exceeds 1e-8 (the binding
        factorises some indefinite matrices as LDLᵀ without a word, so the residual, one matrix-vector product, is
        checked too).
    """
    from sksparse_minimal import SparseCholesky

    A = sp.csc_matrix(A)
    rhs = np.asarray(rhs, dtype=np.float64)
    try:
        x = SparseCholesky(A).solve_A(rhs)
    except ValueError as e:
        raise ValueError(f"sparse Cholesky: {e} ({A.shape[0]} x {A.shape[1]}); it is not symmetric positive "
                         "definite") from None
    residual = np.linalg.norm(A @ x - rhs) / max(np.linalg.norm(rhs), 1e-300)
    if not residual <= 1e-8:
        raise ValueError(f"sparse Cholesky: relative residual {residual:.2e} on the {A.shape[0]} x {A.shape[1]} "
                         "system; it is not symmetric positive definite")
    return x
