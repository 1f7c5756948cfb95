"""Oracles the tests of several folders share, sharing nothing with the code they check (diffnet only)."""

from __future__ import annotations

import numpy as np
import torch

from diffnet.multigrid.coarse import CoarseSpace, coarse_grid

__all__ = ["dense_newton"]


def _prolongation(family, like: torch.Tensor, params: torch.Tensor, nodes: int, k: int) -> torch.Tensor:
    """P of instance k as a dense (fine, coarse) matrix, from the coarse space's prolongation of unit vectors."""
    space = CoarseSpace.build(family, like, params, nodes)
    fields = tuple(like.shape[1: like.ndim - len(family.resolution)])
    coarse = fields + coarse_grid(family.resolution, nodes)
    n = int(np.prod(coarse))
    columns = []
    for j in range(n):
        e = torch.zeros(len(params), n, dtype=torch.float64)
        e[k, j] = 1.0
        columns.append(space.prolong(e.reshape(len(params), *coarse))[k].reshape(-1))
    P = torch.stack(columns, 1)
    return P[:, P.abs().sum(0) > 0]


def dense_newton(family, u_tilde: torch.Tensor, params: torch.Tensor, nodes: int) -> torch.Tensor:
    """u~ + P c*, c* = argmin E(u~ + P c) by undamped Newton in c with autograd's dense Hessian, to rounding: an oracle
    sharing nothing with the code's stencils, A_c or line search."""
    grid, out = tuple(u_tilde.shape[1:]), []
    for k in range(len(params)):
        P = _prolongation(family, u_tilde, params, nodes, k)

        def energy(c):
            v = (u_tilde[k].reshape(-1) + P @ c).reshape(1, *grid)
            return sum(t.sum() for t in family.loss_terms(v, params[k: k + 1]).values())

        c = torch.zeros(P.shape[1], dtype=torch.float64)
        for _ in range(40):
            step = torch.linalg.solve(torch.autograd.functional.hessian(energy, c),
                                      torch.autograd.functional.jacobian(energy, c))
            c = c - step
            if float(step.abs().max()) < 1e-14 * max(1.0, float(c.abs().max())):
                break
        out.append((u_tilde[k].reshape(-1) + P @ c).reshape(grid))
    return torch.stack(out)
