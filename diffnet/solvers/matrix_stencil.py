"""Compiled kernels for operators on structured node grids, stored as stencils.

An operator is an array ``S`` of shape (N_y, N_x, 2w+1, 2w+1): ``S[i, j, w+di, w+dj]``
couples node (i, j) to node (i+di, j+dj); couplings that leave the grid are zero. The Q1
matrices are 9-point (w = 1); a Galerkin coarse operator of a non-nested pair of grids
can reach two coarse nodes away (w = 2). A node's coefficients are contiguous, so one
row of the operator is one cache line or two.

Why compiled by hand rather than pyamg's cycling on CSR matrices: pyamg's kernels are
C++, but its levels are built with sparse triple products and each cycle walks Python
between kernels. Measured 2026-11-24 (one thread, the same FMG to discretisation
accuracy, results equal to 1e-12): hierarchy + FMG took 2.8-6.3 ms at 33^2-65^2 with
pyamg and 1.0-3.9 ms here; 0.80-0.88 s at 1025^2 with pyamg and 0.33-0.39 s here, where
the numpy assembly with its CSR build (0.25 s warm, 1.0 s cold) became 0.08 s. Time
now follows the number of unknowns, so "the cheapest classical solve" of an
equal-accuracy comparison is chosen by the grid, not by fixed overheads.

A prolongation between two node grids is bilinear and separable; per dimension it is
given by ``left`` (the coarse node left of each fine node) and ``weight`` (the weight of
``left + 1``; ``left`` gets ``1 - weight``), as :func:`diffnet.solvers.gmg.interpolation_1d`.
"""

from __future__ import annotations

import numba
import numpy as np
import scipy.sparse as sp

from diffnet.energy import ELEMENT_NODES

__all__ = ["q1_stencil", "q1_galerkin", "apply_dirichlet", "residual", "gauss_seidel", "interpolate", "restrict",
           "galerkin", "coarse_width", "to_csr", "interpolation_weights"]

# The element's node offsets split by axis (tuples: compile-time constants for numba).
_DY = tuple(dy for dy, _ in ELEMENT_NODES)
_DX = tuple(dx for _, dx in ELEMENT_NODES)


def interpolation_weights(n_fine: int, n_coarse: int) -> tuple[np.ndarray, np.ndarray]:
    """(left, weight) of linear interpolation from ``n_coarse`` to ``n_fine`` uniform nodes on [0, 1]."""
    x = np.linspace(0.0, 1.0, n_fine) * (n_coarse - 1)
    left = np.minimum(np.floor(x).astype(np.int64), n_coarse - 2)
    return left, x - left


@numba.njit(cache=True)
def _q1_elements(nu: np.ndarray, stiff: np.ndarray, mass: np.ndarray, values: np.ndarray, ratio: int) -> np.ndarray:
    """Sum element matrices into a 9-point stencil on the grid with ``ratio`` times fewer cells per side:
    element (I, J) gets, from each of its ratio^2 fine elements s, sum_q nu_q stiff[s, q] + mass[s]
    (nu_q: the nodal nu interpolated to Gauss point q of that fine element)."""
    ny, nx = (nu.shape[0] - 1) // ratio + 1, (nu.shape[1] - 1) // ratio + 1
    out = np.zeros((ny, nx, 3, 3))
    nu_q = np.empty(4)
    element = np.empty((4, 4))
    for I in range(ny - 1):
        for J in range(nx - 1):
            element[:, :] = 0.0
            for sub in range(ratio * ratio):
                i, j = ratio * I + _DY[sub], ratio * J + _DX[sub]
                for q in range(4):
                    nu_q[q] = (values[q, 0] * nu[i, j] + values[q, 1] * nu[i, j + 1]
                               + values[q, 2] * nu[i + 1, j] + values[q, 3] * nu[i + 1, j + 1])
                # Constant bounds and offsets: the 16 entries unroll (with the Gauss-point count
                # read from an array's shape the pass took 1.4x as long at 1025^2).
                for a in range(4):
                    for b in range(4):
                        v = mass[sub, a, b]
                        for q in range(4):
                            v += nu_q[q] * stiff[sub, q, a, b]
                        element[a, b] += v
            for a in range(4):
                for b in range(4):
                    out[I + _DY[a], J + _DX[a], 1 + _DY[b] - _DY[a], 1 + _DX[b] - _DX[a]] += element[a, b]
    return out


def q1_stencil(nu: np.ndarray, stiff: np.ndarray, mass: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The Q1 matrix of -div(nu grad) + mass as a 9-point stencil, one pass over the elements.

    ``stiff`` (Q, 4, 4) holds w * grad N_a . grad N_b at each Gauss point, ``mass`` (4, 4)
    the reaction term's element matrix, ``values`` (Q, 4) N_a at the Gauss points (nu is
    interpolated there from the element's nodes).
    """
    return _q1_elements(nu, stiff[None], mass[None], values, 1)


@numba.njit(cache=True, inline="always")
def _identity_row(S: np.ndarray, i: int, j: int) -> None:
    """Node (i, j)'s row of the stencil operator ``S`` becomes the identity's."""
    w = S.shape[2] // 2
    S[i, j, :, :] = 0.0
    S[i, j, w, w] = 1.0


@numba.njit(cache=True)
def apply_dirichlet(S: np.ndarray, rhs: np.ndarray, fixed: np.ndarray, g: np.ndarray) -> None:
    """In place: rows of fixed nodes become identity rows with right-hand side ``g``; couplings of free
    nodes to fixed ones move to the right-hand side. The operator stays symmetric.

    (The same cut as :func:`_finish`'s, in one pass with the right-hand side: as a second
    pass through _finish it took 3x as long at 1025^2.)
    """
    ny, nx, k, _ = S.shape
    w = k // 2
    for i in range(ny):
        for j in range(nx):
            if fixed[i, j]:
                _identity_row(S, i, j)
                rhs[i, j] = g[i, j]
                continue
            for di in range(-w, w + 1):
                for dj in range(-w, w + 1):
                    ii, jj = i + di, j + dj
                    if 0 <= ii < ny and 0 <= jj < nx and fixed[ii, jj]:
                        rhs[i, j] -= S[i, j, w + di, w + dj] * g[ii, jj]
                        S[i, j, w + di, w + dj] = 0.0


@numba.njit(cache=True)
def _row(S: np.ndarray, x: np.ndarray, i: int, j: int, w: int, ny: int, nx: int, diagonal: bool) -> float:
    """sum over the neighbours (i+di, j+dj) of S[i, j, w+di, w+dj] x[i+di, j+dj], (i, j) itself if ``diagonal``."""
    s = 0.0
    for di in range(max(-w, -i), min(w, ny - 1 - i) + 1):
        for dj in range(max(-w, -j), min(w, nx - 1 - j) + 1):
            if diagonal or di != 0 or dj != 0:
                s += S[i, j, w + di, w + dj] * x[i + di, j + dj]
    return s


# In the two kernels below the 9-point interior (nearly every node) is written with
# constant loop bounds so that the compiler unrolls it; through _row's node-dependent
# bounds the same sweep ran 3-5x slower at 1025^2.


@numba.njit(cache=True)
def residual(S: np.ndarray, x: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out = b - S x."""
    ny, nx, k, _ = S.shape
    w = k // 2
    for i in range(ny):
        inner = w == 1 and 0 < i < ny - 1
        for j in range(nx):
            if inner and 0 < j < nx - 1:
                s = 0.0
                for di in range(3):
                    for dj in range(3):
                        s += S[i, j, di, dj] * x[i + di - 1, j + dj - 1]
            else:
                s = _row(S, x, i, j, w, ny, nx, True)
            out[i, j] = b[i, j] - s


@numba.njit(cache=True)
def gauss_seidel(S: np.ndarray, x: np.ndarray, b: np.ndarray, forward: bool) -> None:
    """One lexicographic Gauss-Seidel sweep in place, rows in order (``forward``) or reversed."""
    ny, nx, k, _ = S.shape
    w = k // 2
    for row in range(ny):
        i = row if forward else ny - 1 - row
        inner = w == 1 and 0 < i < ny - 1
        for col in range(nx):
            j = col if forward else nx - 1 - col
            if inner and 0 < j < nx - 1:
                s = 0.0
                for di in range(3):
                    for dj in range(3):
                        if di != 1 or dj != 1:
                            s += S[i, j, di, dj] * x[i + di - 1, j + dj - 1]
            else:
                s = _row(S, x, i, j, w, ny, nx, False)
            x[i, j] = (b[i, j] - s) / S[i, j, w, w]


@numba.njit(cache=True)
def interpolate(coarse: np.ndarray, ly: np.ndarray, wy: np.ndarray, lx: np.ndarray, wx: np.ndarray,
                fixed: np.ndarray, out: np.ndarray) -> None:
    """out += P coarse on the free fine nodes (bilinear P given per dimension by left/weight)."""
    ny, nx = out.shape
    for i in range(ny):
        a, p = ly[i], wy[i]
        for j in range(nx):
            if fixed[i, j]:
                continue
            c, q = lx[j], wx[j]
            out[i, j] += ((1.0 - p) * ((1.0 - q) * coarse[a, c] + q * coarse[a, c + 1])
                          + p * ((1.0 - q) * coarse[a + 1, c] + q * coarse[a + 1, c + 1]))


@numba.njit(cache=True)
def restrict(fine: np.ndarray, ly: np.ndarray, wy: np.ndarray, lx: np.ndarray, wx: np.ndarray,
             fixed_fine: np.ndarray, fixed_coarse: np.ndarray, out: np.ndarray) -> None:
    """out = Pᵀ fine over the free fine nodes, zero on the fixed coarse nodes (the transpose of :func:`interpolate`)."""
    out[:, :] = 0.0
    ny, nx = fine.shape
    for i in range(ny):
        a, p = ly[i], wy[i]
        for j in range(nx):
            if fixed_fine[i, j]:
                continue
            c, q = lx[j], wx[j]
            f = fine[i, j]
            out[a, c] += (1.0 - p) * (1.0 - q) * f
            out[a, c + 1] += (1.0 - p) * q * f
            out[a + 1, c] += p * (1.0 - q) * f
            out[a + 1, c + 1] += p * q * f
    ny, nx = out.shape
    for i in range(ny):
        for j in range(nx):
            if fixed_coarse[i, j]:
                out[i, j] = 0.0


@numba.njit(cache=True)
def _parents(left: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per fine node of one dimension: how many coarse nodes it interpolates from (1 or 2), which, and the weights."""
    n = left.size
    count = np.empty(n, dtype=np.int64)
    index = np.empty((n, 2), dtype=np.int64)
    value = np.empty((n, 2))
    for i in range(n):
        if weight[i] == 0.0 or weight[i] == 1.0:
            count[i], index[i, 0], value[i, 0] = 1, left[i] + int(weight[i]), 1.0
        else:
            count[i] = 2
            index[i, 0], index[i, 1] = left[i], left[i] + 1
            value[i, 0], value[i, 1] = 1.0 - weight[i], weight[i]
    return count, index, value


@numba.njit(cache=True)
def galerkin(S: np.ndarray, fixed: np.ndarray, fixed_coarse: np.ndarray, ly: np.ndarray, wy: np.ndarray,
             lx: np.ndarray, wx: np.ndarray, width: int) -> np.ndarray:
    """The coarse operator Pᵀ S P of width ``width``, P bilinear without rows at fixed fine nodes
    or columns at fixed coarse nodes (corrections vanish there); fixed coarse rows become identity rows.

    Dropping P's columns only drops rows and columns of Pᵀ S P, so the product is formed
    with all columns and the fixed coarse ones cut afterwards: no test in the inner loops.
    ``S`` is symmetric, so only the couplings to coarse rows K >= I are summed and the
    others copied from their mirror (the product took 1.5x as long in full; summing each
    coarse row in a local array, or unrolling the interior's stencil, was no faster).
    """
    ny, nx, k, _ = S.shape
    w = k // 2
    nyc, nxc = fixed_coarse.shape
    out = np.zeros((nyc, nxc, 2 * width + 1, 2 * width + 1))
    cy, iy, vy = _parents(ly, wy)
    cx, ix, vx = _parents(lx, wx)
    for i in range(ny):
        for j in range(nx):
            if fixed[i, j]:
                continue
            for di in range(max(-w, -i), min(w, ny - 1 - i) + 1):
                for dj in range(max(-w, -j), min(w, nx - 1 - j) + 1):
                    a = S[i, j, w + di, w + dj]
                    i2, j2 = i + di, j + dj
                    if a == 0.0 or fixed[i2, j2]:
                        continue
                    # Row parents (I, J) of (i, j), column parents (K, L) of (i2, j2).
                    for s in range(cy[i]):
                        I = iy[i, s]
                        for t in range(cx[j]):
                            J = ix[j, t]
                            pa = vy[i, s] * vx[j, t] * a
                            for u in range(cy[i2]):
                                K = iy[i2, u]
                                if K < I:  # the lower half is the upper half's mirror (below)
                                    continue
                                pk = pa * vy[i2, u]
                                for v in range(cx[j2]):
                                    out[I, J, width + K - I, width + ix[j2, v] - J] += pk * vx[j2, v]
    _finish(out, fixed_coarse, True)
    return out


@numba.njit(cache=True)
def _finish(out: np.ndarray, fixed: np.ndarray, mirror: bool) -> None:
    """Cut the fixed nodes out of a coarse operator: identity rows, no couplings to them; with
    ``mirror`` the couplings to rows above (K < I) are copied from their symmetric entries."""
    ny, nx, k, _ = out.shape
    width = k // 2
    for I in range(ny):
        for J in range(nx):
            if fixed[I, J]:
                _identity_row(out, I, J)
                continue
            for dI in range(max(-width, -I), min(width, ny - 1 - I) + 1):
                for dJ in range(max(-width, -J), min(width, nx - 1 - J) + 1):
                    if fixed[I + dI, J + dJ]:
                        out[I, J, width + dI, width + dJ] = 0.0
                    elif mirror and dI < 0:  # symmetric: (I, J) -> (K, L) is (K, L) -> (I, J), summed above
                        out[I, J, width + dI, width + dJ] = out[I + dI, J + dJ, width - dI, width - dJ]


def q1_galerkin(nu: np.ndarray, stiff: np.ndarray, mass: np.ndarray, values: np.ndarray,
                fixed_coarse: np.ndarray) -> np.ndarray:
    """Pᵀ A P for the Q1 matrix A of :func:`q1_stencil` on nested grids (N = 2 N_c - 1 per side), straight
    from the nodal ``nu``: element by coarse element.

    Nested bilinear coarse functions are fine Q1 functions, so the coarse operator is the
    sum over coarse elements of T_sᵀ A_e T_s over their four fine elements e (T_s: the
    coarse element's bilinear values at sub-element s's corners). With A_e = sum_q nu_q
    stiff_q + mass, ``stiff`` (4 sub-elements, Q, 4, 4) holds T_sᵀ stiff_q T_s and ``mass``
    (4, 4, 4) T_sᵀ mass T_s. One pass over the fine elements like the assembly's, where the
    stencil product (:func:`galerkin`) took 3x as long at 1025^2. The caller checks that
    the fine Dirichlet nodes interpolate only from fixed coarse ones, so that cutting the
    fixed coarse nodes afterwards gives the same operator as :func:`galerkin`.
    """
    out = _q1_elements(nu, stiff, mass, values, 2)
    _finish(out, fixed_coarse, False)
    return out


def coarse_width(width: int, left: np.ndarray, weight: np.ndarray) -> int:
    """How far (in coarse nodes) Pᵀ S P reaches in one dimension, S reaching ``width`` fine nodes."""
    n = left.size
    low = np.where(weight == 1.0, left + 1, left)  # the parents of each fine node with a nonzero weight
    high = np.where(weight == 0.0, left, left + 1)
    reach = 0
    for d in range(1, width + 1):
        reach = max(reach, int(np.max(high[d:] - low[: n - d], initial=0)))
    return reach


def to_csr(S: np.ndarray) -> sp.csr_matrix:
    """The stencil as an (N, N) CSR matrix, nodes numbered row-major; exact zeros are not stored."""
    ny, nx, k, _ = S.shape
    w, n = k // 2, ny * nx
    index = np.int32 if k * k * n < 2**31 else np.int64
    values = S.reshape(n, k * k)  # within a row the columns ascend in this order
    stored = values != 0.0
    indptr = np.zeros(n + 1, dtype=index)
    np.cumsum(np.count_nonzero(stored, axis=1), out=indptr[1:])
    offsets = np.array([di * nx + dj for di in range(-w, w + 1) for dj in range(-w, w + 1)], dtype=index)
    columns = np.arange(n, dtype=index)[:, None] + offsets
    return sp.csr_matrix((values[stored], columns[stored], indptr), shape=(n, n))
