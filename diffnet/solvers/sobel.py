"""Direct solve of the central (Sobel/Scharr) Burgers residual: the nodal field whose residual is zero.

The residual of :func:`diffnet.families.burgers.residual` has one equation per unknown
node (every node but the initial row and the inflow column) and couples each node to its
neighbours in t and x both ways, so the whole space-time field is one nonlinear system,
solved by Newton's method with a sparse Jacobian (:mod:`diffnet.solvers.newton`). Such a
central space-time system need not have a root near the entropy solution (where the
cell Peclet number passes 2 its roots can sit far from it), so when Newton fails the
least-squares optimum nearest the start is taken instead: it
is what a network trained on the mean squared residual can reach from there, and its
error against the converged reference is that residual's floor.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["solve_sobel"]


def solve_sobel(
    u0: np.ndarray,
    t_final: float,
    n_t: int,
    viscosity: float,
    kind: str = "sobel",
    initial: np.ndarray | None = None,
    tol: float = 1e-9,
    max_newton: int = 30,
) -> tuple[np.ndarray, float]:
    """The zero-residual field of the central residual on the (n_t, N_x) nodal grid, or the
    least-squares optimum where Newton finds no root.

    Parameters
    ----------
    u0, t_final, n_t, viscosity
        The initial row, the final time, the number of time rows and nu, as for
        :func:`diffnet.solvers.conservative.solve_scheme`.
    kind : {"sobel", "scharr"}
        Cross weights of the derivative kernels.
    initial : numpy.ndarray, optional
        (n_t, N_x) starting field for Newton (e.g. the converged reference, so that the
        root found is the one nearest it); default: the initial row at every time.
    tol : float
        Newton stops when the largest residual entry is below ``tol``.
    max_newton : int
        Newton iterations before falling back to Levenberg-Marquardt.

    Returns
    -------
    field : numpy.ndarray
        (n_t, N_x) float64.
    max_residual : float
        Its largest residual entry: below ``tol`` for a root.
    """
    from diffnet.discretisation.finite_difference import central_residual as residual
    from diffnet.solvers.newton import least_squares_solve, newton_solve

    n_x = u0.shape[0]
    dt, dx = t_final / (n_t - 1), 1.0 / (n_x - 1)
    row = torch.as_tensor(u0, dtype=torch.float64)
    start = np.broadcast_to(u0, (n_t, n_x)) if initial is None else np.asarray(initial, dtype=np.float64)
    # The unknowns are the nodes off the initial row and the inflow column, stored as
    # offsets from the initial row (as the network's field is).
    v0 = torch.as_tensor(start[1:, 1:] - u0[None, 1:], dtype=torch.float64)

    def field(v: torch.Tensor) -> torch.Tensor:
        return row + F.pad(v, (1, 0, 1, 0))

    def equations(v: torch.Tensor) -> torch.Tensor:  # a batch (B, n_t - 1, N_x - 1)
        return residual(field(v), dt, dx, viscosity, kind)

    # A node's equation reads its 3x3 neighbourhood, and at the edges the ghost node
    # extrapolated from two more: every dependency lies within 2 nodes.
    try:
        v = newton_solve(equations, v0, reach=2, tol=tol, max_iter=max_newton, what=f"{kind} residual")
        worst = float(equations(v[None]).abs().max())
    except RuntimeError:
        v, worst = least_squares_solve(equations, v0, reach=2, tol=tol)
    return field(v[None])[0].numpy(), worst
