"""Newton's method for local (stencil) residuals: a sparse Jacobian from coloured vector-Jacobian products.

A residual whose entry at node p depends only on the unknowns within ``reach`` nodes of
p (per axis) has a Jacobian with at most (2 reach + 1)^d entries per row and column.
Colouring the residual nodes by their index modulo 2 reach + 1 on each axis gives
weightings in which no two nodes of one colour depend on the same unknown, so
(2 reach + 1)^d vector-Jacobian products recover every entry, whatever the grid size
(the dense Jacobian by autograd costs one backward pass per unknown). The products are
one backward pass over a batch holding one copy of the unknowns per colour (the
residuals take a batch anyway). Forward mode would be the textbook choice, but torch's
forward-mode products between a dual and a plain tensor go through a Python fallback,
which made it 20-50x slower per operation here. The linear systems are solved by
sparse LU (:func:`diffnet.solvers.sparse_lu.lu_solve`: SuperLU, or PARDISO where asked).
"""

from __future__ import annotations

import itertools
from typing import Callable

import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse.linalg import spsolve

from diffnet.solvers.sparse_lu import lu_solve

__all__ = ["sparse_jacobian", "newton_solve", "least_squares_solve"]


def _single(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``fn`` (which takes a batch) at the one point ``x``."""
    return fn(x[None])[0]


def sparse_jacobian(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, reach: int,
                    components: bool = False) -> sp.csr_matrix:
    """The Jacobian of ``fn`` at ``x`` as a sparse matrix (rows: outputs, columns: unknowns, both row-major).

    Parameters
    ----------
    fn : callable
        Maps a batch of unknowns (B, *x.shape) to residuals of the same shape.
    x : torch.Tensor
        Unknowns on a 1-D or 2-D grid, float64.
    reach : int
        Residual p depends only on unknowns q with |q_i - p_i| <= reach on every grid axis.
    components : bool
        Whether the first axis holds several unknowns per node (velocity and pressure), each residual component at a
        node depending on every component within reach: that axis is coloured one component at a time.
    """
    shape = tuple(x.shape)
    period = 2 * reach + 1
    nodes = np.meshgrid(*[np.arange(n) for n in shape], indexing="ij")
    periods = [shape[0] if components else period] + [period] * (len(shape) - 1)
    colours = list(itertools.product(*[range(m) for m in periods]))
    weights = torch.stack([torch.as_tensor(np.logical_and.reduce([g % m == c for g, m, c in zip(nodes, periods, colour)]),
                                           dtype=x.dtype) for colour in colours])
    batch = x.detach().expand(len(colours), *shape).clone().requires_grad_(True)
    with torch.enable_grad():
        (products,) = torch.autograd.grad(fn(batch), batch, grad_outputs=weights)
    products = products.numpy()
    rows, cols, vals = [], [], []
    flat = np.arange(int(np.prod(shape))).reshape(shape)
    for k, colour in enumerate(colours):
        # Entry (p, q) for every unknown q and the one residual node p of this colour within reach.
        p = [g + (c - g + reach) % period - reach for g, c in zip(nodes, colour)]
        if components:  # the residual component is the colour's own, whatever the unknown's
            p[0] = np.full_like(nodes[0], colour[0])
        inside = np.logical_and.reduce([(pi >= 0) & (pi < n) for pi, n in zip(p, shape)])
        values = products[k][inside]
        keep = values != 0.0
        cols.append(flat[inside][keep])
        rows.append(np.ravel_multi_index(tuple(pi[inside][keep] for pi in p), shape))
        vals.append(values[keep])
    n = flat.size
    return sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n, n))


def newton_solve(
    fn: Callable[[torch.Tensor], torch.Tensor],
    x0: torch.Tensor,
    reach: int,
    tol: float,
    max_iter: int = 60,
    what: str = "residual",
    strict: bool = True,
    components: bool = False,
    lu: str = "superlu",
    stats: list | None = None,
) -> torch.Tensor:
    """Solve fn(x) = 0 from ``x0`` by Newton's method with backtracking on ||fn(x)||.

    ``fn`` maps a batch of unknowns (B, *x0.shape) to residuals of the same shape.

    Backtracking (halving the step until the residual norm falls) carries Newton across
    the kinks of limiters and upwind fluxes. Stops when max |fn(x)| < ``tol``, or after
    ``max_iter`` iterations. ``components``: the first axis holds several unknowns per node
    (:func:`sparse_jacobian`). ``lu``: each step's sparse LU (:data:`~diffnet.solvers.sparse_lu.LU_METHODS`).
    ``stats``: a list that gets one entry per Newton step taken (its count is the solve's cost).

    Raises
    ------
    RuntimeError
        With ``strict``, when ``max_iter`` iterations do not reach ``tol`` (naming ``what``);
        without it the last iterate is returned (a fixed number of iterations: a polish).
    """
    x = x0.detach().clone()
    g = _single(fn, x)
    for _ in range(max_iter):
        if float(g.abs().max()) < tol:
            return x
        jac = sparse_jacobian(fn, x, reach, components)
        step = torch.as_tensor(lu_solve(jac, g.reshape(-1).numpy(), lu), dtype=x.dtype).reshape(x.shape)
        if stats is not None:
            stats.append(float(g.abs().max()))
        norm, alpha = float(g.norm()), 1.0
        while True:
            trial = x - alpha * step
            g_trial = _single(fn, trial)
            if float(g_trial.norm()) < norm or alpha < 1e-6:
                break
            alpha *= 0.5
        x, g = trial, g_trial
    if strict and float(g.abs().max()) >= tol:
        raise RuntimeError(f"Newton did not converge on the {what} (max residual {float(g.abs().max()):.2e} "
                           f"after {max_iter} iterations)")
    return x


def least_squares_solve(
    fn: Callable[[torch.Tensor], torch.Tensor],
    x0: torch.Tensor,
    reach: int,
    tol: float,
    max_iter: int = 100,
) -> tuple[torch.Tensor, float]:
    """The local minimiser of ||fn(x)||^2 nearest ``x0``, by Levenberg-Marquardt with sparse direct solves.

    Where fn has a root near ``x0`` this converges to it as Newton's method does (the
    damping shrinks on every accepted step); where it has none (a central space-time
    residual need not) it stops at the least-squares optimum. ``fn`` maps a batch
    (B, *x0.shape) to residuals of the same shape.

    Returns
    -------
    x : torch.Tensor
        The minimiser.
    max_residual : float
        max |fn(x)| there (below ``tol`` when a root was found).
    """
    x = x0.detach().clone()
    g = _single(fn, x).reshape(-1).numpy()
    cost, damping = float(g @ g), 1e-6
    for _ in range(max_iter):
        if np.abs(g).max() < tol:
            break
        jac = sparse_jacobian(fn, x, reach)
        normal = (jac.T @ jac).tocsc()
        scale = sp.diags(normal.diagonal())
        gradient = jac.T @ g
        while True:
            step = spsolve((normal + damping * scale).tocsc(), gradient)
            trial = x - torch.as_tensor(step, dtype=x.dtype).reshape(x.shape)
            g_trial = _single(fn, trial).reshape(-1).numpy()
            if float(g_trial @ g_trial) < cost or damping > 1e8:
                break
            damping *= 8.0
        decrease = cost - float(g_trial @ g_trial)
        if decrease <= 0:  # no step lowers the cost: a minimum
            break
        x, g, cost, damping = trial, g_trial, float(g_trial @ g_trial), max(damping / 8.0, 1e-12)
        if decrease < 1e-14 * cost:
            break
    return x, float(np.abs(g).max())
