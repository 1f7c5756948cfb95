"""Compiled kernels for operators on structured node grids in 2-D and 3-D, stored as stencils.

An operator on a grid of shape ``grid`` is an array ``S`` of shape (*grid, *(2w+1,) * d):
``S[i, j, w+di, w+dj]`` couples node (i, j) to node (i+di, j+dj) in 2-D, and likewise with a
third index in 3-D; couplings that leave the grid are zero. The Q1 matrices are 3^d-point
(w = 1); a Galerkin coarse operator of a non-nested pair of grids can reach two coarse nodes
away (w = 2). A node's coefficients are contiguous, so one row of the operator is one or two
cache lines (2-D) or four (3-D).

One source serves both dimensions: every kernel is written for a 3-D grid, and a 2-D grid is
passed as the 3-D grid with one layer of nodes and a stencil one coupling deep in z
(:func:`grid3`, :func:`stencil3`: views, no copy). The hot passes (the element sums, the
residual, Gauss-Seidel and the Galerkin product) are compiled once per dimension from that
source (:func:`_compile`), the dimension a compile-time constant: the loops over z and over an
element's 2^d nodes then have constant bounds and unroll, and in 2-D the z loops vanish, so the
2-D arithmetic is the one these kernels did when they were 2-D only, in the same order (the
tests hold the results bitwise) and at the same speed. Read from the arrays' shapes instead, the
node count cost the element pass 2.2x and the z loop the residual 1.3x at 1025^2 (one thread,
the 2-core machine). In the sweeps the in-plane 3 x 3 couplings of an interior node have constant
loop bounds too: through node-dependent bounds the same sweep ran 3-5x slower at 1025^2.

Why compiled by hand rather than pyamg's cycling on CSR matrices: pyamg's kernels are
C++, but its levels are built with sparse triple products and each cycle walks Python
between kernels. Measured (benchmarks/fem_vs_inference.py; one thread, the same FMG to discretisation
accuracy, results equal to 1e-12): hierarchy + FMG took 2.8-6.3 ms at 33^2-65^2 with
pyamg and 1.0-3.9 ms here; 0.80-0.88 s at 1025^2 with pyamg and 0.33-0.39 s here, where
the numpy assembly with its CSR build (0.25 s warm, 1.0 s cold) became 0.08 s. Time
now follows the number of unknowns, so "the cheapest classical solve" of an
equal-accuracy comparison is chosen by the grid, not by fixed overheads.

A prolongation between two node grids is multilinear and separable; per axis it is given
by ``left`` (the coarse node left of each fine node) and ``weight`` (the weight of
``left + 1``; ``left`` gets ``1 - weight``), as :func:`diffnet.grid.transfer.interpolation_weights`.
A one-node axis (the z of a 2-D grid) has left 0 and weight 0, and the kernels never read
past it.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numba
import numpy as np
import scipy.sparse as sp

from diffnet.grid.element import element_nodes

__all__ = ["grid3", "stencil3", "stencil_native", "kernels", "q1_stencil", "q1_galerkin", "apply_dirichlet",
           "interpolate", "restrict", "coarse_width", "to_csr"]


def grid3(a: np.ndarray) -> np.ndarray:
    """A nodal field over a 2-D grid (N_y, N_x) as the 3-D grid (1, N_y, N_x); a 3-D one as it is. A view."""
    return a[None] if a.ndim == 2 else a


def stencil3(S: np.ndarray) -> np.ndarray:
    """A 2-D stencil (N_y, N_x, k, k) as the 3-D stencil (1, N_y, N_x, 1, k, k); a 3-D one as it is. A view."""
    return S.reshape(1, *S.shape[:2], 1, *S.shape[2:]) if S.ndim == 4 else S


def stencil_native(S3: np.ndarray, dims: int) -> np.ndarray:
    """A stencil in the 3-D layout back in the shape of its ``dims``-dimensional grid (a view); the inverse
    of :func:`stencil3`."""
    return S3.reshape(*S3.shape[1:3], *S3.shape[4:]) if dims == 2 else S3


# -- kernels that do not depend on the dimension ---------------------------------------------


@numba.njit(cache=True, inline="always")
def _identity_row(S: np.ndarray, k: int, i: int, j: int) -> None:
    """Node (k, i, j)'s row of the stencil operator ``S`` becomes the identity's."""
    S[k, i, j, :, :, :] = 0.0
    S[k, i, j, S.shape[3] // 2, S.shape[4] // 2, S.shape[5] // 2] = 1.0


@numba.njit(cache=True)
def _row(S: np.ndarray, x: np.ndarray, k: int, i: int, j: int, diagonal: bool) -> float:
    """sum over the neighbours n of node (k, i, j) of S[(k, i, j), n] x[n], the node itself if ``diagonal``."""
    nz, ny, nx, kz, ky, kx = S.shape
    wz, w = kz // 2, ky // 2
    s = 0.0
    for dk in range(max(-wz, -k), min(wz, nz - 1 - k) + 1):
        for di in range(max(-w, -i), min(w, ny - 1 - i) + 1):
            for dj in range(max(-w, -j), min(w, nx - 1 - j) + 1):
                if diagonal or dk != 0 or di != 0 or dj != 0:
                    s += S[k, i, j, wz + dk, w + di, w + dj] * x[k + dk, i + di, j + dj]
    return s


@numba.njit(cache=True, inline="always")
def _bilinear(c: np.ndarray, a: int, b: int, p: float, m: int, q: float) -> float:
    """The bilinear interpolant of layer ``a`` of ``c`` at rows b, b+1 (weight p) and columns m, m+1 (weight q)."""
    return ((1.0 - p) * ((1.0 - q) * c[a, b, m] + q * c[a, b, m + 1])
            + p * ((1.0 - q) * c[a, b + 1, m] + q * c[a, b + 1, m + 1]))


@numba.njit(cache=True)
def interpolate(coarse: np.ndarray, lz: np.ndarray, wz: np.ndarray, ly: np.ndarray, wy: np.ndarray,
                lx: np.ndarray, wx: np.ndarray, fixed: np.ndarray, out: np.ndarray) -> None:
    """out += P coarse on the free fine nodes (multilinear P given per axis by left/weight; 3-D layout)."""
    nz, ny, nx = out.shape
    for k in range(nz):
        a, r = lz[k], wz[k]
        for i in range(ny):
            b, p = ly[i], wy[i]
            for j in range(nx):
                if fixed[k, i, j]:
                    continue
                m, q = lx[j], wx[j]
                v = _bilinear(coarse, a, b, p, m, q)
                if r != 0.0:  # between two coarse layers (never on a one-layer grid)
                    v = (1.0 - r) * v + r * _bilinear(coarse, a + 1, b, p, m, q)
                out[k, i, j] += v


@numba.njit(cache=True)
def restrict(fine: np.ndarray, lz: np.ndarray, wz: np.ndarray, ly: np.ndarray, wy: np.ndarray,
             lx: np.ndarray, wx: np.ndarray, fixed_fine: np.ndarray, fixed_coarse: np.ndarray,
             out: np.ndarray) -> None:
    """out = Pᵀ fine over the free fine nodes, zero on the fixed coarse nodes (the transpose of
    :func:`interpolate`; 3-D layout)."""
    out[:, :, :] = 0.0
    nz, ny, nx = fine.shape
    for k in range(nz):
        a, r = lz[k], wz[k]
        for i in range(ny):
            b, p = ly[i], wy[i]
            for j in range(nx):
                if fixed_fine[k, i, j]:
                    continue
                m, q = lx[j], wx[j]
                f = fine[k, i, j]
                for layer in range(2 if r != 0.0 else 1):
                    t = 1.0 - r if layer == 0 else r
                    out[a + layer, b, m] += t * (1.0 - p) * (1.0 - q) * f
                    out[a + layer, b, m + 1] += t * (1.0 - p) * q * f
                    out[a + layer, b + 1, m] += t * p * (1.0 - q) * f
                    out[a + layer, b + 1, m + 1] += t * p * q * f
    nz, ny, nx = out.shape
    for k in range(nz):
        for i in range(ny):
            for j in range(nx):
                if fixed_coarse[k, i, j]:
                    out[k, i, j] = 0.0


@numba.njit(cache=True)
def _parents(left: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per fine node of one axis: how many coarse nodes it interpolates from (1 or 2), which, and the weights."""
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
def _finish(out: np.ndarray, fixed: np.ndarray, mirror: bool) -> None:
    """Cut the fixed nodes out of a coarse operator: identity rows, no couplings to them; with
    ``mirror`` the couplings to earlier (z, y) lines are copied from their symmetric entries."""
    nz, ny, nx, kz, ky, kx = out.shape
    wz, width = kz // 2, ky // 2
    for K in range(nz):
        for I in range(ny):
            for J in range(nx):
                if fixed[K, I, J]:
                    _identity_row(out, K, I, J)
                    continue
                for dK in range(max(-wz, -K), min(wz, nz - 1 - K) + 1):
                    for dI in range(max(-width, -I), min(width, ny - 1 - I) + 1):
                        for dJ in range(max(-width, -J), min(width, nx - 1 - J) + 1):
                            if fixed[K + dK, I + dI, J + dJ]:
                                out[K, I, J, wz + dK, width + dI, width + dJ] = 0.0
                            elif mirror and (dK < 0 or (dK == 0 and dI < 0)):
                                # symmetric: the coupling to an earlier line is that line's to this node
                                out[K, I, J, wz + dK, width + dI, width + dJ] = \
                                    out[K + dK, I + dI, J + dJ, wz - dK, width - dI, width - dJ]


# -- the hot passes, compiled per dimension ------------------------------------------------------


def _compile(dims: int) -> SimpleNamespace:
    """The element pass, the Dirichlet cut, the residual, Gauss-Seidel and the Galerkin product for grids
    of ``dims`` dimensions (3-D layout). ``dims`` and the element's node offsets are constants of the
    compiled code (numba freezes a closure's variables and keys its cache on them)."""
    FLAT = dims == 2  # one layer of nodes: every loop over z runs once, at offset 0
    nodes3 = [(0,) * (3 - dims) + n for n in element_nodes(dims)]
    OZ, OY, OX = (tuple(n[axis] for n in nodes3) for axis in range(3))  # the element's node offsets
    NODES = len(OX)

    @numba.njit(cache=True)
    def elements(nu: np.ndarray, stiff: np.ndarray, mass: np.ndarray, values: np.ndarray, ratio: int) -> np.ndarray:
        """Sum element matrices into a 3^d-point stencil on the grid with ``ratio`` times fewer cells per
        side: element (K, I, J) gets, from each of its ratio^d fine elements s, sum_q nu_q stiff[s, q] +
        mass[s] (nu_q: the nodal nu interpolated to Gauss point q of that fine element)."""
        nz = 1 if FLAT else (nu.shape[0] - 1) // ratio + 1
        ny, nx = (nu.shape[1] - 1) // ratio + 1, (nu.shape[2] - 1) // ratio + 1
        wz = 0 if FLAT else 1
        out = np.zeros((nz, ny, nx, 2 * wz + 1, 3, 3))
        subs = 1 if ratio == 1 else NODES  # a coarse element's fine elements sit at its nodes' offsets
        nu_q = np.empty(NODES)
        element = np.empty((NODES, NODES))
        for K in range(1 if FLAT else nz - 1):
            for I in range(ny - 1):
                for J in range(nx - 1):
                    element[:, :] = 0.0
                    for sub in range(subs):
                        k, i, j = ratio * K + OZ[sub], ratio * I + OY[sub], ratio * J + OX[sub]
                        for q in range(NODES):
                            s = 0.0
                            for a in range(NODES):
                                s += values[q, a] * nu[k + OZ[a], i + OY[a], j + OX[a]]
                            nu_q[q] = s
                        for a in range(NODES):
                            for b in range(NODES):
                                v = mass[sub, a, b]
                                for q in range(NODES):
                                    v += nu_q[q] * stiff[sub, q, a, b]
                                element[a, b] += v
                    for a in range(NODES):
                        for b in range(NODES):
                            out[K + OZ[a], I + OY[a], J + OX[a],
                                wz + OZ[b] - OZ[a], 1 + OY[b] - OY[a], 1 + OX[b] - OX[a]] += element[a, b]
        return out

    @numba.njit(cache=True)
    def apply_dirichlet(S: np.ndarray, rhs: np.ndarray, fixed: np.ndarray, g: np.ndarray) -> None:
        nz, ny, nx, kz, ky, kx = S.shape
        wz, w = kz // 2, ky // 2
        for k in range(nz):
            for i in range(ny):
                for j in range(nx):
                    if fixed[k, i, j]:
                        _identity_row(S, k, i, j)
                        rhs[k, i, j] = g[k, i, j]
                        continue
                    for dk in range(0 if FLAT else -wz, 1 if FLAT else wz + 1):
                        for di in range(-w, w + 1):
                            for dj in range(-w, w + 1):
                                kk, ii, jj = k + dk, i + di, j + dj
                                if 0 <= kk < nz and 0 <= ii < ny and 0 <= jj < nx and fixed[kk, ii, jj]:
                                    rhs[k, i, j] -= S[k, i, j, wz + dk, w + di, w + dj] * g[kk, ii, jj]
                                    S[k, i, j, wz + dk, w + di, w + dj] = 0.0

    @numba.njit(cache=True)
    def residual(S: np.ndarray, x: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        """out = b - S x."""
        nz, ny, nx, kz, ky, kx = S.shape
        wz = kz // 2
        square = ky == 3 and kx == 3
        for k in range(nz):
            k0, k1 = (0, 0) if FLAT else (max(-wz, -k), min(wz, nz - 1 - k))
            for i in range(ny):
                inner = square and 0 < i < ny - 1
                for j in range(nx):
                    if inner and 0 < j < nx - 1:
                        s = 0.0
                        for dk in range(k0, k1 + 1):
                            for di in range(3):
                                for dj in range(3):
                                    s += S[k, i, j, wz + dk, di, dj] * x[k + dk, i + di - 1, j + dj - 1]
                    else:
                        s = _row(S, x, k, i, j, True)
                    out[k, i, j] = b[k, i, j] - s

    @numba.njit(cache=True)
    def gauss_seidel(S: np.ndarray, x: np.ndarray, b: np.ndarray, forward: bool) -> None:
        """One lexicographic Gauss-Seidel sweep in place, nodes in order (``forward``) or reversed."""
        nz, ny, nx, kz, ky, kx = S.shape
        wz = kz // 2
        square = ky == 3 and kx == 3
        for layer in range(nz):
            k = layer if forward else nz - 1 - layer
            k0, k1 = (0, 0) if FLAT else (max(-wz, -k), min(wz, nz - 1 - k))
            for row in range(ny):
                i = row if forward else ny - 1 - row
                inner = square and 0 < i < ny - 1
                for col in range(nx):
                    j = col if forward else nx - 1 - col
                    if inner and 0 < j < nx - 1:
                        s = 0.0
                        for dk in range(k0, k1 + 1):
                            for di in range(3):
                                for dj in range(3):
                                    if dk != 0 or di != 1 or dj != 1:
                                        s += S[k, i, j, wz + dk, di, dj] * x[k + dk, i + di - 1, j + dj - 1]
                    else:
                        s = _row(S, x, k, i, j, False)
                    x[k, i, j] = (b[k, i, j] - s) / S[k, i, j, wz, ky // 2, kx // 2]

    @numba.njit(cache=True)
    def galerkin(S: np.ndarray, fixed: np.ndarray, fixed_coarse: np.ndarray, lz: np.ndarray, wz: np.ndarray,
                 ly: np.ndarray, wy: np.ndarray, lx: np.ndarray, wx: np.ndarray, width: int) -> np.ndarray:
        """The coarse operator Pᵀ S P of width ``width`` (see :func:`kernels`)."""
        nz, ny, nx, kz, ky, kx = S.shape
        sz, w = kz // 2, ky // 2
        nzc, nyc, nxc = fixed_coarse.shape
        width_z = 0 if FLAT else width
        out = np.zeros((nzc, nyc, nxc, 2 * width_z + 1, 2 * width + 1, 2 * width + 1))
        cz, iz, vz = _parents(lz, wz)
        cy, iy, vy = _parents(ly, wy)
        cx, ix, vx = _parents(lx, wx)
        for k in range(nz):
            for i in range(ny):
                for j in range(nx):
                    if fixed[k, i, j]:
                        continue
                    for dk in range(0 if FLAT else max(-sz, -k), 1 if FLAT else min(sz, nz - 1 - k) + 1):
                        for di in range(max(-w, -i), min(w, ny - 1 - i) + 1):
                            for dj in range(max(-w, -j), min(w, nx - 1 - j) + 1):
                                c = S[k, i, j, sz + dk, w + di, w + dj]
                                k2, i2, j2 = k + dk, i + di, j + dj
                                if c == 0.0 or fixed[k2, i2, j2]:
                                    continue
                                # Row parents (Kz, I, J) of (k, i, j), column parents (Lz, K, L) of (k2, i2, j2).
                                for r in range(1 if FLAT else cz[k]):
                                    Kz = iz[k, r]
                                    for s in range(cy[i]):
                                        I = iy[i, s]
                                        for t in range(cx[j]):
                                            J = ix[j, t]
                                            pa = vy[i, s] * vx[j, t] * c if FLAT else vz[k, r] * vy[i, s] * vx[j, t] * c
                                            for rr in range(1 if FLAT else cz[k2]):
                                                Lz = iz[k2, rr]
                                                if Lz < Kz:  # an earlier layer: the mirror of a summed coupling
                                                    continue
                                                pz = pa if FLAT else pa * vz[k2, rr]
                                                for u in range(cy[i2]):
                                                    K = iy[i2, u]
                                                    if Lz == Kz and K < I:  # an earlier line: likewise
                                                        continue
                                                    pk = pz * vy[i2, u]
                                                    for v in range(cx[j2]):
                                                        out[Kz, I, J, width_z + Lz - Kz, width + K - I,
                                                            width + ix[j2, v] - J] += pk * vx[j2, v]
        _finish(out, fixed_coarse, True)
        return out

    return SimpleNamespace(elements=elements, apply_dirichlet=apply_dirichlet, residual=residual,
                           gauss_seidel=gauss_seidel, galerkin=galerkin)


@functools.cache
def kernels(dims: int) -> SimpleNamespace:
    """The compiled passes for grids of ``dims`` (2 or 3) dimensions, all on the 3-D layout
    (:func:`grid3`, :func:`stencil3`):

    * ``residual(S, x, b, out)``: out = b - S x;
    * ``gauss_seidel(S, x, b, forward)``: one lexicographic sweep in place, nodes in order or reversed;
    * ``galerkin(S, fixed, fixed_coarse, lz, wz, ly, wy, lx, wx, width)``: the coarse operator Pᵀ S P of
      width ``width`` (in z: 0 on a one-layer grid), P multilinear without rows at fixed fine nodes or
      columns at fixed coarse nodes (corrections vanish there); fixed coarse rows become identity rows.
      Dropping P's columns only drops rows and columns of Pᵀ S P, so the product is formed with all
      columns and the fixed coarse ones cut afterwards: no test in the inner loops. ``S`` is
      symmetric, so only the couplings to coarse nodes at or after the row's (z, y) line are summed
      and the others copied from their mirror (the product took 1.5x as long in full; summing each
      coarse row in a local array, or unrolling the interior's stencil, was no faster);
    * ``elements`` and ``apply_dirichlet``: behind :func:`q1_stencil`, :func:`q1_galerkin` and
      :func:`apply_dirichlet`.
    """
    if dims not in (2, 3):
        raise ValueError(f"grids have 2 or 3 dimensions, got {dims}")
    return _compile(dims)


# -- the Q1 operators -------------------------------------------------------------------------


def q1_stencil(nu: np.ndarray, stiff: np.ndarray, mass: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The Q1 matrix of -div(nu grad) + mass as a 3^d-point stencil, one pass over the elements.

    ``nu`` is nodal over the grid (2-D or 3-D); ``stiff`` (Q, 2^d, 2^d) holds w * grad N_a . grad N_b
    at each Gauss point, ``mass`` (2^d, 2^d) the reaction term's element matrix, ``values`` (Q, 2^d)
    N_a at the Gauss points (nu is interpolated there from the element's nodes).
    """
    dims = nu.ndim
    out = kernels(dims).elements(np.ascontiguousarray(grid3(nu)), stiff[None], mass[None], values, 1)
    return stencil_native(out, dims)


def q1_galerkin(nu: np.ndarray, stiff: np.ndarray, mass: np.ndarray, values: np.ndarray,
                fixed_coarse: np.ndarray) -> np.ndarray:
    """Pᵀ A P for the Q1 matrix A of :func:`q1_stencil` on nested grids (N = 2 N_c - 1 per side), straight
    from the nodal ``nu``: element by coarse element.

    Nested multilinear coarse functions are fine Q1 functions, so the coarse operator is the
    sum over coarse elements of T_sᵀ A_e T_s over their 2^d fine elements e (T_s: the
    coarse element's multilinear values at sub-element s's corners). With A_e = sum_q nu_q
    stiff_q + mass, ``stiff`` (2^d sub-elements, Q, 2^d, 2^d) holds T_sᵀ stiff_q T_s and ``mass``
    (2^d, 2^d, 2^d) T_sᵀ mass T_s. One pass over the fine elements like the assembly's, where the
    stencil product (the ``galerkin`` of :func:`kernels`) took 3x as long at 1025^2. The caller checks
    that the fine Dirichlet nodes interpolate only from fixed coarse ones, so that cutting the
    fixed coarse nodes afterwards gives the same operator as the product.
    """
    dims = nu.ndim
    out = kernels(dims).elements(np.ascontiguousarray(grid3(nu)), stiff, mass, values, 2)
    _finish(out, grid3(fixed_coarse), False)
    return stencil_native(out, dims)


def apply_dirichlet(S: np.ndarray, rhs: np.ndarray, fixed: np.ndarray, g: np.ndarray) -> None:
    """In place, on a stencil of the grid's own shape: rows of fixed nodes become identity rows with
    right-hand side ``g``; couplings of free nodes to fixed ones move to the right-hand side. The
    operator stays symmetric.

    (The same cut as :func:`_finish`'s, in one pass with the right-hand side: as a second
    pass through _finish it took 3x as long at 1025^2.)
    """
    kernels(fixed.ndim).apply_dirichlet(stencil3(S), grid3(rhs), grid3(fixed), grid3(g))


def coarse_width(width: int, left: np.ndarray, weight: np.ndarray) -> int:
    """How far (in coarse nodes) Pᵀ S P reaches along one axis, S reaching ``width`` fine nodes."""
    n = left.size
    low = np.where(weight == 1.0, left + 1, left)  # the parents of each fine node with a nonzero weight
    high = np.where(weight == 0.0, left, left + 1)
    reach = 0
    for d in range(1, width + 1):
        reach = max(reach, int(np.max(high[d:] - low[: n - d], initial=0)))
    return reach


def to_csr(S: np.ndarray) -> sp.csr_matrix:
    """The stencil (2-D or 3-D) as an (N, N) CSR matrix, nodes numbered row-major; exact zeros are not stored."""
    dims = S.ndim // 2
    grid, k = S.shape[:dims], S.shape[-1]
    w, n = k // 2, int(np.prod(grid))
    index = np.int32 if k**dims * n < 2**31 else np.int64
    values = S.reshape(n, k**dims)  # within a row the columns ascend in this order
    stored = values != 0.0
    indptr = np.zeros(n + 1, dtype=index)
    np.cumsum(np.count_nonzero(stored, axis=1), out=indptr[1:])
    strides = np.cumprod((1,) + tuple(grid[:0:-1]))[::-1]  # row-major node strides, outermost axis first
    offsets = np.zeros(1, dtype=np.int64)
    for stride in strides:  # the offsets of the stencil's entries, in its row-major order
        offsets = (offsets[:, None] + stride * np.arange(-w, w + 1)).ravel()
    columns = np.arange(n, dtype=index)[:, None] + offsets.astype(index)
    return sp.csr_matrix((values[stored], columns[stored], indptr), shape=(n, n))
