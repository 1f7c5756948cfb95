"""A nonlinear elliptic family written outside DeepFusion against diffnet's public API (docs/families.md).

-div(nu grad u) + u^3 = f on [0, 1]^2, u = 0 on the boundary, with nu = exp(a1 cos(pi x) + a2 cos(pi y)),
a in [-1, 1]^2, and a constant source f. The loss is the energy
J(u) = integral [1/2 nu |grad u|^2 + 1/4 u^4 - f u] on the Q1 elements of the grid (2 x 2 Gauss points),
strictly convex, so its minimiser over nodal fields is unique: the floor. The reference solver is
Newton's method on the same discrete energy (its gradient and Hessian assembled from the same
quadrature), each Newton step solved by algebraic multigrid (pyamg's smoothed aggregation as a CG
preconditioner), with a backtracking line search on J; the truth is that solve on a grid
``truth_refine`` times finer, read at this grid's nodes. One Newton step from the network's field
is the polish step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from diffnet import (Family, ParameterSpec, at_gauss_points, dirichlet_energy, dirichlet_stencil, gauss_basis,
                     gauss_point_stencils, integer_in, interval, option, positive)

__all__ = ["CubicReaction", "NewtonSolver"]

# Element nodes as (dy, dx) offsets from the lower-left node: gauss_basis's column order.
_NODES = ((0, 0), (0, 1), (1, 0), (1, 1))


class NewtonSolver:
    """Newton's method on the discrete energy of one instance on an n x n grid (numpy + scipy + pyamg).

    The element quantities come from :func:`diffnet.gauss_basis`, the same basis values,
    gradients and weights the network's loss uses, so the minimiser found here is the
    minimiser of the trained loss.
    """

    def __init__(self, nu: np.ndarray, source: float):
        self.n = nu.shape[0]
        h = 1.0 / (self.n - 1)
        self.values, gx, gy, self.weight = gauss_basis(h, h)
        m = self.n - 1
        # Global node of each element's local node, (elements, 4).
        base = (np.arange(m)[:, None] * self.n + np.arange(m)[None, :]).ravel()
        self.dofs = np.stack([base + dy * self.n + dx for dy, dx in _NODES], axis=1)
        nu_q = nu.ravel()[self.dofs] @ self.values.T  # nu at the Gauss points, (elements, 4)
        local = np.einsum("eq,qa,qb->eab", nu_q, gx, gx) + np.einsum("eq,qa,qb->eab", nu_q, gy, gy)
        self.stiffness = self._assemble(self.weight * local)
        self.source = source
        boundary = np.zeros((self.n, self.n), dtype=bool)
        boundary[[0, -1], :] = boundary[:, [0, -1]] = True
        self.free = np.flatnonzero(~boundary.ravel())

    def _assemble(self, local: np.ndarray) -> sp.csr_matrix:
        rows = np.repeat(self.dofs, 4, axis=1).ravel()
        cols = np.tile(self.dofs, (1, 4)).ravel()
        size = self.n * self.n
        return sp.csr_matrix((local.ravel(), (rows, cols)), shape=(size, size))

    def energy(self, u: np.ndarray) -> float:
        u_q = u[self.dofs] @ self.values.T
        return 0.5 * u @ (self.stiffness @ u) + self.weight * float((0.25 * u_q**4 - self.source * u_q).sum())

    def gradient_and_hessian(self, u: np.ndarray) -> tuple[np.ndarray, sp.csr_matrix]:
        u_q = u[self.dofs] @ self.values.T
        g_local = self.weight * ((u_q**3 - self.source) @ self.values)  # (elements, 4)
        gradient = self.stiffness @ u + np.bincount(self.dofs.ravel(), g_local.ravel(), minlength=u.size)
        h_local = self.weight * np.einsum("eq,qa,qb->eab", 3.0 * u_q**2, self.values, self.values)
        return gradient, self.stiffness + self._assemble(h_local)

    def step(self, u: np.ndarray) -> tuple[np.ndarray, float]:
        """One damped Newton step on the free nodes; returns the new field and the step's max-norm."""
        import pyamg

        gradient, hessian = self.gradient_and_hessian(u)
        free = self.free
        a = hessian[free][:, free].tocsr()
        ml = pyamg.smoothed_aggregation_solver(a)
        delta = np.zeros_like(u)
        delta[free] = ml.solve(-gradient[free], tol=1e-12, accel="cg", maxiter=200)
        slope, j0, alpha = float(gradient @ delta), self.energy(u), 1.0
        while self.energy(u + alpha * delta) > j0 + 1e-4 * alpha * slope and alpha > 1e-6:
            alpha *= 0.5
        return u + alpha * delta, alpha * float(np.abs(delta).max())

    def solve(self, start: np.ndarray | None = None, tol: float = 1e-11, max_steps: int = 50) -> np.ndarray:
        u = np.zeros(self.n * self.n) if start is None else np.asarray(start, dtype=np.float64).ravel().copy()
        u[~np.isin(np.arange(u.size), self.free)] = 0.0
        for _ in range(max_steps):
            u, size = self.step(u)
            if size < tol * max(1.0, float(np.abs(u).max())):
                return u.reshape(self.n, self.n)
        raise RuntimeError(f"Newton did not converge in {max_steps} steps (last step {size:.2e})")


@dataclass(frozen=True)
class CubicReaction(Family):
    """-div(nu grad u) + u^3 = f on the unit square, u = 0 on its boundary. Its keys (``[cubic_reaction]``) are the
    fields made with ``option``."""

    resolution: tuple[int, ...]
    coeff_range: tuple[float, ...] = option((-1.0, 1.0), "range of a1, a2 in nu = exp(a1 cos πx + a2 cos πy)",
                                            interval)
    source: float = option(30.0, "constant source f (> 0; the cubic term matters from f ≈ 10)", positive)
    truth_refine: int = option(4, "the reference is the Newton solve on a grid this many times finer",
                               integer_in(2, 8))

    name = "cubic_reaction"
    in_channels = 3
    # "precondition": the loss's Hessian as a stencil, this family's own (`hessian` below); without it the engine
    # reads it off 9 Hessian-vector products (the loss couples each node to its 8 neighbours only), 18 gradient
    # passes each time: 6x this one's cost, and the coarse correction's Newton needs one per iteration.
    capabilities = frozenset({"reference", "floor", "polish", "precondition"})
    polish_step = "Newton step"

    def describe(self) -> str:
        return f"nu=exp(a1 cos pi x + a2 cos pi y), a in {list(self.coeff_range)}, f={self.source}"

    @property
    def parameters(self) -> ParameterSpec:
        return ParameterSpec("a", (2,), *self.coeff_range, description="coefficients (a1, a2) of log nu")

    def coordinates(self) -> dict[str, np.ndarray]:
        ny, nx = self.resolution
        return {"y": np.linspace(0.0, 1.0, ny), "x": np.linspace(0.0, 1.0, nx)}

    def log_nu(self, a: torch.Tensor) -> torch.Tensor:
        ny, nx = self.resolution
        y = torch.linspace(0.0, 1.0, ny, dtype=a.dtype, device=a.device)[:, None]
        x = torch.linspace(0.0, 1.0, nx, dtype=a.dtype, device=a.device)[None, :]
        return a[:, 0, None, None] * torch.cos(math.pi * x) + a[:, 1, None, None] * torch.cos(math.pi * y)

    def inputs(self, a: torch.Tensor) -> torch.Tensor:
        ny, nx = self.resolution
        log_nu = self.log_nu(a)
        y = torch.linspace(0.0, 1.0, ny, dtype=a.dtype, device=a.device)[:, None].expand(ny, nx)
        x = torch.linspace(0.0, 1.0, nx, dtype=a.dtype, device=a.device)[None, :].expand(ny, nx)
        return torch.stack([log_nu, y.expand_as(log_nu), x.expand_as(log_nu)], dim=1)

    def field(self, raw: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        return F.pad(raw[:, 0, 1:-1, 1:-1], (1, 1, 1, 1))

    def loss_terms(self, u: torch.Tensor, a: torch.Tensor) -> dict[str, torch.Tensor]:
        h = 1.0 / (self.resolution[1] - 1)
        values, _, _, weight = gauss_basis(h, h)
        at_points = at_gauss_points(u, values)
        nu = torch.exp(self.log_nu(a.to(u.dtype)))
        j = dirichlet_energy(u, nu, h, h) + weight * (0.25 * at_points.pow(4) - self.source * at_points).sum(dim=(1, 2, 3))
        return {"energy": j / self.unit}

    @property
    def unit(self) -> float:
        """The loss's unit: J at the solution is of order -f^(4/3) / 4 (where u^3 ~ f)."""
        return 0.25 * self.source ** (4.0 / 3.0)

    def hessian(self, u: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """The loss's Hessian at u as a 9-point stencil (S, 9, N_y, N_x): the stiffness K(nu) plus the mass matrix
        of 3 u^2 at the Gauss points, in the loss's unit."""
        h = 1.0 / (self.resolution[1] - 1)
        values, _, _, weight = gauss_basis(h, h)
        nu = torch.exp(self.log_nu(a.to(u.dtype)))
        reaction = 3.0 * at_gauss_points(u, values)[:, None, None] ** 2  # (S, 1, 1, Q, cells)
        mass = weight * np.einsum("qa,qb->qab", values, values)[None]  # (1, Q, 4, 4)
        stencil = dirichlet_stencil(nu, h, h) + gauss_point_stencils(reaction, mass)[:, 0]
        return stencil / self.unit

    def _solver(self, a: np.ndarray, n: int) -> NewtonSolver:
        log_nu = self.at_resolution((n, n)).log_nu(torch.as_tensor(np.asarray(a, dtype=np.float64))[None])[0]
        return NewtonSolver(np.exp(log_nu.numpy()), self.source)

    def reference(self, a: np.ndarray, progress=None) -> np.ndarray:
        out = []
        for k, row in enumerate(a):
            out.append(self._solver(row, self.resolution[1]).solve())
            if progress is not None:
                progress(k + 1, len(a))
        return np.stack(out)

    def reference_name(self) -> str:
        return "Newton-AMG on this grid"

    def truth(self, a: np.ndarray, progress=None) -> np.ndarray:
        r, n = self.truth_refine, self.resolution[1]
        return np.stack([self._solver(row, r * (n - 1) + 1).solve()[::r, ::r] for row in a])

    def truth_name(self) -> str:
        n = self.truth_refine * (self.resolution[1] - 1) + 1
        return f"Newton-AMG on {n}x{n} ({self.truth_refine}x finer)"

    def discrete_optimum(self, a: np.ndarray, initial=None) -> tuple[np.ndarray, np.ndarray]:
        return self.reference(a), np.ones(len(a), dtype=bool)

    def floor_name(self) -> str:
        return "the energy's minimiser on this grid (Newton-AMG)"

    def polish(self, a: np.ndarray, fields: np.ndarray, steps: int) -> np.ndarray:
        """``steps`` damped Newton steps from the network's fields."""
        out = []
        for row, u in zip(a, fields):
            solver, w = self._solver(row, self.resolution[1]), np.asarray(u, dtype=np.float64).ravel().copy()
            for _ in range(steps):
                w, _ = solver.step(w)
            out.append(w.reshape(self.resolution))
        return np.stack(out)
