"""Direct solve of the implicit conservative Burgers scheme: the field whose conservative residual is zero.

Each time row depends only on the rows before it, so the scheme is solved by marching:
row n is the root of the residual at row n, found by Newton's method from row n - 1
(:func:`diffnet.solvers.newton.newton_solve`: a row's residual at node j involves nodes
j - 2 .. j + 2 only, so its banded Jacobian costs five vector-Jacobian products in one
backward pass, not one backward pass per node). Its error against the converged Godunov reference is
the discretisation floor a network trained on that residual can reach.
"""

from __future__ import annotations

import numpy as np
import torch

from diffnet.discretisation.finite_volume import conservative_residual
from diffnet.solvers.newton import newton_solve

__all__ = ["solve_scheme"]


def solve_scheme(
    u0: np.ndarray,
    t_final: float,
    n_t: int,
    viscosity: float,
    order: int = 2,
    flux: str = "godunov",
    tol: float = 1e-11,
    max_newton: int = 60,
    initial: np.ndarray | None = None,
    iterations: int | None = None,
) -> np.ndarray:
    """March the implicit scheme of :func:`diffnet.discretisation.finite_volume.conservative_residual`.

    Parameters
    ----------
    u0 : numpy.ndarray
        Initial row (N_x,) on the nodes x_j = j / (N_x - 1); its first entry is the
        inflow value, kept at every time.
    t_final : float
        T; the rows are t_n = n T / (n_t - 1).
    n_t : int
        Number of time rows, the initial one included.
    viscosity : float
        nu >= 0.
    order, flux
        As for the residual.
    tol : float
        Newton stops when the largest residual entry of the row is below ``tol``.
    max_newton : int
        Newton iterations allowed per row.
    initial : numpy.ndarray, optional
        (n_t, N_x): each row's Newton iteration starts from this field's row (a network's
        output) instead of the previous time row.
    iterations : int, optional
        At most this many Newton iterations per row, without the convergence check: the
        polish of ``initial`` ("DiffNet + k Newton steps"), not a solve.

    Returns
    -------
    numpy.ndarray
        (n_t, N_x) float64 field with zero residual (to ``tol``) at every unknown node.

    Raises
    ------
    RuntimeError
        When Newton does not converge on some row.
    """
    n_x = u0.shape[0]
    dt, dx = t_final / (n_t - 1), 1.0 / (n_x - 1)
    u = torch.zeros(n_t, n_x, dtype=torch.float64)
    u[0] = torch.as_tensor(u0, dtype=torch.float64)
    u[:, 0] = u[0, 0]
    for n in range(1, n_t):
        past = u[max(0, n - order) : n]  # the rows the residual at row n looks back to

        def row_residual(v: torch.Tensor) -> torch.Tensor:  # a batch of candidate rows (B, N_x - 1)
            new = torch.cat([u[n, :1].expand(len(v), 1), v], dim=1)[:, None]
            window = torch.cat([past.expand(len(v), *past.shape), new], dim=1)
            return conservative_residual(window, dt, dx, viscosity, order, flux)[:, -1]

        start = u[n - 1, 1:] if initial is None else torch.as_tensor(initial[n, 1:], dtype=torch.float64)
        u[n, 1:] = newton_solve(row_residual, start, reach=2, tol=tol,
                                max_iter=max_newton if iterations is None else iterations, what=f"time row {n}",
                                strict=iterations is None)
    return u.numpy()
