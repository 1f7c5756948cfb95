"""The coarse operators' Cholesky factors, one per instance: banded where the band is narrow, dense otherwise.

A_c of the coarse correction is a coarse block stencil: unknown a at coarse node I couples to unknown b at I + O
for |O_k| <= 2 along each axis (grids that do not nest couple nodes two apart; grids that nest, |O_k| <= 1, and
the stencil has 3^d points). In the grid's lexicographic order
with each node's unknowns together (node-major), its nonzeros lie within a band of half-width about
C (2 m + 2) in 2-D and C (2 m² + 2 m + 2) in 3-D for m nodes a side, and a banded factorisation (LAPACK's pbtrf,
through scipy.linalg.cholesky_banded) costs N b² where a dense one costs N³ / 3: for elasticity's 17² x 2 = 578
unknowns (b = 73) 20x fewer operations, for a scalar 17² (b = 36) 70x, for 9³ (b = 182) 7x; where the grids
nest the band is about half as wide (b = 37, 18, 91). The band is filled
from the stencil directly, through index arrays made once per coarse grid: no dense matrix (an (S, N, N) buffer
and its 25 C² scatters were the larger part of an elasticity instance's A_c, benchmarks/product_cost.py). On a GPU, or where the
band is not narrower, the factors are torch's dense batched ones (a CUDA graph captures those).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass


import numpy as np
import torch

from diffnet.multigrid.stencil import coupling_index
from diffnet.multigrid.vcycle import SHIFTS, cholesky, cholesky_solve, shifted_cholesky

__all__ = ["BandedFactor", "factorise_stencil", "solve_factors", "factor_bytes"]

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


@dataclass(frozen=True)
class _Layout:
    """Where every coupling of a coarse block stencil (C, C, n, 5^d) lies: the couplings inside the grid, each
    once per triangle needed. ``source``: the flat index into the stencil; ``row``, ``col``: the unknowns
    (component-major, a n + I); ``upper``: the couplings with node-major position row <= col; ``width``: the
    half-bandwidth in node-major order; ``order``: the node-major permutation (position -> unknown)."""

    source: np.ndarray
    row: np.ndarray
    col: np.ndarray
    upper: np.ndarray
    width: int
    order: np.ndarray


@functools.lru_cache(maxsize=32)
def _layout(coarse: tuple[int, ...], components: int, reach: int) -> _Layout:
    """Couplings at most ``reach`` nodes apart along every axis (1 where the grids nest: the band half as wide,
    its factorisation 2-4x cheaper), of a stencil whose offsets span (-reach, ..., reach)^d."""
    n, c = math.prod(coarse), components
    a, b, j, rows, cols = coupling_index(coarse, c, reach)
    source = ((a * c + b) * n + rows) * (2 * reach + 1) ** len(coarse) + j
    row, col = a * n + rows, b * n + cols
    order = np.arange(n * c).reshape(c, n).T.reshape(-1)  # node-major position I c + a -> unknown a n + I
    position = np.empty_like(order)
    position[order] = np.arange(n * c)
    upper = position[row] <= position[col]
    width = int((position[col] - position[row])[upper].max()) if upper.any() else 0
    return _Layout(source, row, col, upper, width, order)


def factorise_stencil(values: torch.Tensor, keep: torch.Tensor, coarse: tuple[int, ...], what: str,
                      shift: bool = False) -> list[BandedFactor | torch.Tensor]:
    """Per instance of the coarse block stencils ``values`` (S, C, C, n, w^d) on the grid ``coarse`` (w = 5, or 3 where
    the grids nest), the Cholesky factor of the operator on the unknowns ``keep`` (S, C n) holds (the others:
    identity rows): a :class:`BandedFactor` on the CPU where the band is narrow, else a dense lower factor (N, N)
    (torch). An operator that is not positive definite is a ValueError naming ``what`` and the instances; with
    ``shift`` (a Newton step's Hessian away from the minimiser, which may be indefinite) its diagonal is raised
    by a growing share of itself (Levenberg-Marquardt) until it is, instead."""
    s, c = values.shape[0], values.shape[1]
    width = round(values.shape[-1] ** (1 / len(coarse)))
    if width not in (3, 5) or width ** len(coarse) != values.shape[-1]:
        raise ValueError(f"need a 3^d- or 5^d-point coarse stencil on {coarse}, got {values.shape[-1]} points")
    layout = _layout(tuple(coarse), c, (width - 1) // 2)
    n_unknowns = c * math.prod(coarse)
    flat = values.reshape(s, -1)
    mask = keep.to(values.dtype)
    couplings = flat[:, torch.as_tensor(layout.source, device=values.device)] * \
        mask[:, torch.as_tensor(layout.row, device=values.device)] * mask[:, torch.as_tensor(layout.col, device=values.device)]
    banded = n_unknowns * (layout.width + 1) ** 2 <= _BANDED_SHARE * n_unknowns**3 / 3
    if values.is_cuda or not banded:
        dense = torch.zeros(s, n_unknowns * n_unknowns, dtype=values.dtype, device=values.device)
        dense[:, torch.as_tensor(layout.row * n_unknowns + layout.col, device=values.device)] = couplings
        dense = dense.reshape(s, n_unknowns, n_unknowns)
        dense.diagonal(dim1=1, dim2=2).add_(1.0 - mask)
        if shift:
            return shifted_cholesky(dense, what)
        return list(cholesky(dense, what))
    return _banded(couplings.detach().cpu().numpy(), (1.0 - mask).cpu().numpy(), layout, what, shift)


def _banded(couplings: np.ndarray, identity: np.ndarray, layout: _Layout, what: str,
            shift: bool = False) -> list[BandedFactor]:
    """The banded factors of the operators whose couplings (S, K) lie at ``layout``, plus ``identity`` (S, N) on
    their diagonals (``shift``: :func:`factorise_stencil`)."""
    from scipy.linalg import LinAlgError, cholesky_banded

    n, w = len(layout.order), layout.width
    position = np.empty_like(layout.order)
    position[layout.order] = np.arange(n)
    pr, pc = position[layout.row[layout.upper]], position[layout.col[layout.upper]]
    target = (w + pr - pc) * n + pc  # the upper form: band[w + i - j, j] = A[i, j], i <= j
    bands = np.zeros((len(couplings), (w + 1) * n))
    bands[:, target] = couplings[:, layout.upper]  # each (row, col) is one coupling: (a, I; b, I + O) names it
    bands = bands.reshape(len(couplings), w + 1, n)
    bands[:, w] += identity[:, layout.order]
    factors, failed = [], []
    for k, band in enumerate(bands):
        for share in SHIFTS if shift else (0.0,):
            trial = band
            if share:
                trial = band.copy()
                trial[w] += share * np.abs(band[w])
            try:
                factors.append(BandedFactor(cholesky_banded(trial, lower=False, check_finite=False), layout.order))
                break
            except LinAlgError:
                pass
        else:
            failed.append(k)
    if failed:
        raise ValueError(f"{what} is not positive definite for instance(s) {failed}" + (", even shifted" if shift else ""))
    return factors


def solve_factors(factors: list[BandedFactor | torch.Tensor], rhs: torch.Tensor) -> torch.Tensor:
    """x = A⁻¹ b per instance, for right-hand sides ``rhs`` (S, N, 1) and the instances' factors."""
    if all(isinstance(f, torch.Tensor) for f in factors):
        return cholesky_solve(rhs, torch.stack(factors))
    values = rhs.detach().cpu().numpy()[:, :, 0]
    out = np.stack([f.solve(b) if isinstance(f, BandedFactor) else
                    torch.cholesky_solve(torch.as_tensor(b)[:, None], f.cpu()).numpy()[:, 0]
                    for f, b in zip(factors, values)])
    return torch.as_tensor(out, dtype=rhs.dtype, device=rhs.device)[:, :, None]


def factor_bytes(factor: BandedFactor | torch.Tensor) -> int:
    """The bytes a factor holds."""
    if isinstance(factor, BandedFactor):
        return factor.band.nbytes + factor.order.nbytes
    return factor.element_size() * factor.nelement()
