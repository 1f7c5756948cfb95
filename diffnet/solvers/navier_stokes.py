"""The lid-driven cavity's classical solve: Newton on the stabilised Q1 residual with a sparse LU.

The unit square, the lid y = 1 moving at u = 1 (its two corners held at rest, the regularised cavity), the other
walls at rest; the pressure pinned at the corner (0, 0) and reported mean-free. The Jacobian is read off the residual
by coloured vector-Jacobian products (:func:`diffnet.solvers.newton.sparse_jacobian`), the steps solved by SuperLU;
a Reynolds number beyond the reach of Newton from rest is approached by continuation from Re = 100.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from diffnet.discretisation.navier_stokes import navier_stokes_residual
from diffnet.solvers.newton import newton_solve

__all__ = ["cavity_boundary", "cavity_residual", "cavity_solve"]


def cavity_boundary(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(fixed, values) on n x n nodes: a (3, n, n) bool mask of the fixed unknowns (the walls' velocities, the pinned
    pressure) and their (3, n, n) values (u = 1 on the lid between its corners)."""
    fixed, values = np.zeros((3, n, n), dtype=bool), np.zeros((3, n, n))
    for c in (0, 1):
        fixed[c, [0, -1], :] = fixed[c, :, [0, -1]] = True
    values[0, -1, 1:-1] = 1.0
    fixed[2, 0, 0] = True
    return fixed, values


@lru_cache(maxsize=8)
def _boundary_tensors(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Built once per grid: the residual is evaluated at every Newton step and line-search trial.
    return tuple(torch.as_tensor(a) for a in cavity_boundary(n))


def cavity_residual(fields: torch.Tensor, nu: torch.Tensor | float) -> torch.Tensor:
    """The residual with the boundary rows replaced by (field - boundary value), (S, 3, n, n)."""
    n = fields.shape[-1]
    fixed, values = (a.to(fields.device) for a in _boundary_tensors(n))
    r = navier_stokes_residual(fields, nu, (1.0 / (n - 1),) * 2)
    return torch.where(fixed, fields - values.to(fields.dtype), r * (n - 1) ** 2)


def cavity_solve(re: float, n: int, initial: np.ndarray | None = None, tol: float = 1e-10,
                 steps: int | None = None) -> np.ndarray:
    """The cavity's same-grid solution (3, n, n) at Reynolds number ``re`` (pressure mean-free), from ``initial``
    (default: rest, by continuation in steps of Re 100 beyond 100); with ``steps``, that many Newton steps and no
    more (a polish)."""
    nu_of = lambda r: torch.tensor([1.0 / r], dtype=torch.float64)  # noqa: E731
    if initial is None:
        fixed, values = cavity_boundary(n)
        x = torch.as_tensor(np.where(fixed, values, 0.0))
        ladder = [*np.arange(100.0, re, 100.0), re]
    else:
        x, ladder = torch.as_tensor(np.asarray(initial, dtype=np.float64)), [re]
    for r in ladder:
        fn = lambda f, nu=nu_of(r): cavity_residual(f, nu.expand(len(f)))  # noqa: E731
        x = newton_solve(fn, x, reach=1, tol=tol, max_iter=40 if steps is None else steps, what=f"cavity at Re = {r:g}",
                         strict=steps is None, components=True)
    out = x.numpy().copy()
    out[2] -= out[2].mean()
    return out
