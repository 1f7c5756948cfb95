"""Direct solve of the implicit conservative Burgers scheme: the field whose conservative residual is zero.

Each time row depends only on the rows before it, so the scheme is solved by marching:
row n is the root of the residual at row n, found by Newton's method (Jacobian by
autograd, backtracking on the residual norm) from row n - 1. Its error against the
converged Godunov reference is the discretisation floor a network trained on that
residual can reach.
"""

from __future__ import annotations

import numpy as np
import torch

from diffnet.conservative import conservative_residual

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
) -> np.ndarray:
    """March the implicit scheme of :func:`diffnet.conservative.conservative_residual`.

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

        def row_residual(v: torch.Tensor) -> torch.Tensor:
            new = torch.cat([u[n, :1], v])[None]
            window = torch.cat([past, new])[None]
            return conservative_residual(window, dt, dx, viscosity, order, flux)[0, -1]

        v = u[n - 1, 1:].clone()
        g = row_residual(v)
        for _ in range(max_newton):
            if float(g.abs().max()) < tol:
                break
            jac = torch.autograd.functional.jacobian(row_residual, v, vectorize=True)
            step = torch.linalg.solve(jac, g)
            norm, alpha = float(g.norm()), 1.0
            while True:  # backtrack until the residual norm falls (kinks of the limiter/flux)
                trial = v - alpha * step
                g_trial = row_residual(trial)
                if float(g_trial.norm()) < norm or alpha < 1e-6:
                    break
                alpha *= 0.5
            v, g = trial, g_trial
        if float(g.abs().max()) >= tol:
            raise RuntimeError(f"Newton did not converge on time row {n} (residual {float(g.abs().max()):.2e})")
        u[n, 1:] = v
    return u.numpy()
