"""Cholesky factors of the coarse operators, one per instance: banded where the band is narrow, dense otherwise.

A_c of the coarse correction couples a coarse node to the nodes at most two away along each axis (a 5^d-point
stencil), so in the grid's lexicographic order, each node's unknowns together (node-major for several unknowns),
its nonzeros lie within a band of half-width about C (2 m + 2) in 2-D and C (2 m² + 2 m + 2) in 3-D for m
nodes a side. A banded factorisation (LAPACK's pbtrf, scipy.linalg.cholesky_banded) costs N b² where a dense
one costs N³ / 3: for elasticity's 17² x 2 = 578 unknowns (b = 73) 20x fewer operations, for a scalar 17² (b = 36)
70x, for 9³ (b = 182) 7x (measured: benchmarks/product_cost.py). On a GPU, or where the band is not narrower,
the factors are torch's dense batched ones (a CUDA graph captures those).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["BandedFactor", "factorise", "solve_factors", "factor_bytes"]

# A band is taken where N b² is at most this share of N³ / 3 (below it the band's per-instance calls cost more
# than the saving: a dense batched factorisation is one call for the whole batch).
_BANDED_SHARE = 0.5


@dataclass
class BandedFactor:
    """One instance's upper Cholesky factor in LAPACK's banded storage, of the unknowns in ``order``."""

    band: np.ndarray  # (b + 1, N): scipy.linalg.cholesky_banded's upper form
    order: np.ndarray  # the unknowns' permutation: row i of the factor is unknown order[i]

    def solve(self, rhs: np.ndarray) -> np.ndarray:
        from scipy.linalg import cho_solve_banded

        out = np.empty_like(rhs)
        out[self.order] = cho_solve_banded((self.band, False), rhs[self.order], check_finite=False)
        return out


def _node_major(n: int, components: int) -> np.ndarray:
    """The permutation that puts each node's unknowns together: component-major index c n + i -> i C + c."""
    return np.arange(n * components).reshape(components, n).T.reshape(-1)


def factorise(dense: torch.Tensor, components: int, what: str) -> list[Any]:
    """Per instance of ``dense`` (S, N, N), symmetric positive definite with ``components`` unknowns per node
    (component-major, as the fields), its Cholesky factor: a :class:`BandedFactor` on the CPU where the band is
    narrow, else a dense lower factor (N, N) (torch). A matrix that is not positive definite is a ValueError
    naming ``what`` and the instances."""
    from diffnet.multigrid.vcycle import cholesky

    n = dense.shape[-1]
    if not dense.is_cuda and n > 1:
        order = _node_major(n // components, components)
        position = np.empty(n, dtype=np.int64)
        position[order] = np.arange(n)
        values = dense.detach().cpu().numpy()
        rows, cols = np.nonzero((values != 0).any(axis=0))
        width = int(np.max(np.abs(position[rows] - position[cols]))) if len(rows) else 0
        if n * (width + 1) ** 2 <= _BANDED_SHARE * n**3 / 3:
            return _banded(values, order, width, what)
    return list(cholesky(dense, what))


def _banded(values: np.ndarray, order: np.ndarray, width: int, what: str) -> list[BandedFactor]:
    """Each matrix of ``values`` (S, N, N) in the unknowns' ``order`` as a band of half-width ``width``, factorised.
    The band is read off the matrix in that order directly (a permuted copy of a 578² matrix cost 10 ms each)."""
    from scipy.linalg import LinAlgError, cholesky_banded

    n = values.shape[-1]
    factors, failed = [], []
    for k, matrix in enumerate(values):
        band = np.zeros((width + 1, n))
        for d in range(width + 1):  # the upper form: band[width - d, j] = A[order[j - d], order[j]]
            band[width - d, d:] = matrix[order[: n - d], order[d:]]
        try:
            factors.append(BandedFactor(cholesky_banded(band, lower=False, check_finite=False), order))
        except LinAlgError:
            failed.append(k)
    if failed:
        raise ValueError(f"{what} is not positive definite for instance(s) {failed}")
    return factors


def solve_factors(factors: list[Any], rhs: torch.Tensor) -> torch.Tensor:
    """x = A⁻¹ b per instance, for right-hand sides ``rhs`` (S, N, 1) and the instances' factors."""
    from diffnet.multigrid.vcycle import cholesky_solve

    if all(isinstance(f, torch.Tensor) for f in factors):
        return cholesky_solve(rhs, torch.stack(factors))
    values = rhs.detach().cpu().numpy()[:, :, 0]
    out = np.stack([f.solve(b) if isinstance(f, BandedFactor) else
                    torch.cholesky_solve(torch.as_tensor(b)[:, None], f.cpu()).numpy()[:, 0]
                    for f, b in zip(factors, values)])
    return torch.as_tensor(out, dtype=rhs.dtype, device=rhs.device)[:, :, None]


def factor_bytes(factor: Any) -> int:
    """The bytes a factor holds."""
    if isinstance(factor, BandedFactor):
        return factor.band.nbytes + factor.order.nbytes
    return factor.element_size() * factor.nelement()
