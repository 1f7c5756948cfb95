"""Q1 hexahedral finite elements on the voxel grid: compiled assembly of -div(nu grad u) = 0 with
u = left at x = 0, u = right at x = 1 and zero flux on the other faces.

The element is the one of :mod:`diffnet.energy3d` (trilinear on each voxel, 2x2x2 Gauss,
nodal diffusivity interpolated to the Gauss points), so the solution here is the exact
minimiser of the 3-D energy DiffNet is trained on. The Dirichlet nodes are eliminated:
the unknowns are the nodes with 0 < i_x < N_x - 1, themselves a box of (N_z, N_y, N_x - 2)
nodes (row-major), which keeps the geometric multigrid of :mod:`diffnet.solvers.gmg3d` a
tensor-product construction.

Why compiled: a numpy assembly over 2^21 elements keeps (elements x 64) index and value
arrays, 3 GB at 128^3; the two passes below write the 27-point rows straight into CSR.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import scipy.sparse as sp

from diffnet.energy3d import HEX_NODES, hex_basis
from diffnet.solvers.gmg3d import GMG3D

__all__ = ["HexSystem", "hex_stencil", "poisson3d_system"]

_DZ = tuple(n[0] for n in HEX_NODES)
_DY = tuple(n[1] for n in HEX_NODES)
_DX = tuple(n[2] for n in HEX_NODES)


@numba.njit(cache=True)
def _stencil(nu: np.ndarray, stiff: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The stiffness matrix as a 27-point stencil (N_z, N_y, N_x, 3, 3, 3): entry [k, j, i, 1+dz, 1+dy, 1+dx]
    couples node (k, j, i) to (k+dz, j+dy, i+dx). Element by element: nu at the eight Gauss points,
    then sum_q nu_q stiff[q] scattered to the element's nodes."""
    nz, ny, nx = nu.shape
    out = np.zeros((nz, ny, nx, 3, 3, 3))
    nu_q = np.empty(8)
    element = np.empty((8, 8))
    for k in range(nz - 1):
        for j in range(ny - 1):
            for i in range(nx - 1):
                for q in range(8):
                    s = 0.0
                    for a in range(8):
                        s += values[q, a] * nu[k + _DZ[a], j + _DY[a], i + _DX[a]]
                    nu_q[q] = s
                for a in range(8):
                    for b in range(8):
                        s = 0.0
                        for q in range(8):
                            s += nu_q[q] * stiff[q, a, b]
                        element[a, b] = s
                for a in range(8):
                    for b in range(8):
                        out[k + _DZ[a], j + _DY[a], i + _DX[a],
                            1 + _DZ[b] - _DZ[a], 1 + _DY[b] - _DY[a], 1 + _DX[b] - _DX[a]] += element[a, b]
    return out


@numba.njit(cache=True)
def _free_csr(S: np.ndarray, left: float, right: float):
    """The rows and columns of the free nodes (0 < i < N_x - 1) of stencil ``S`` as CSR arrays, and the
    right-hand side: minus the couplings to the Dirichlet planes times their values."""
    nz, ny, nx = S.shape[:3]
    fx = nx - 2
    n = nz * ny * fx
    indptr = np.zeros(n + 1, dtype=np.int64)
    indices = np.empty(27 * n, dtype=np.int32)
    data = np.empty(27 * n)
    rhs = np.zeros(n)
    nnz = 0
    row = 0
    for k in range(nz):
        for j in range(ny):
            for i in range(1, nx - 1):
                for dz in range(-1, 2):
                    kk = k + dz
                    if kk < 0 or kk >= nz:
                        continue
                    for dy in range(-1, 2):
                        jj = j + dy
                        if jj < 0 or jj >= ny:
                            continue
                        for dx in range(-1, 2):
                            ii = i + dx
                            v = S[k, j, i, 1 + dz, 1 + dy, 1 + dx]
                            if ii == 0:
                                rhs[row] -= v * left
                            elif ii == nx - 1:
                                rhs[row] -= v * right
                            else:
                                indices[nnz] = (kk * ny + jj) * fx + ii - 1
                                data[nnz] = v
                                nnz += 1
                row += 1
                indptr[row] = nnz
    return indptr, indices[:nnz], data[:nnz], rhs


def hex_stencil(nu: np.ndarray, hx: float, hy: float, hz: float) -> np.ndarray:
    """The Q1 stiffness matrix of nodal ``nu`` (N_z, N_y, N_x) as a (N_z, N_y, N_x, 3, 3, 3) stencil."""
    values, gx, gy, gz, w = hex_basis(hx, hy, hz)
    stiff = w * (gx[:, :, None] * gx[:, None, :] + gy[:, :, None] * gy[:, None, :] + gz[:, :, None] * gz[:, None, :])
    return _stencil(np.ascontiguousarray(nu, dtype=np.float64), stiff, values)


@dataclass
class HexSystem:
    """The Q1 system on the free nodes of one instance.

    Attributes
    ----------
    A : scipy.sparse.csr_matrix
        Symmetric positive definite, (n, n) over the free nodes, box (N_z, N_y, N_x - 2) row-major.
    rhs : numpy.ndarray
        (n,): the Dirichlet planes' couplings moved to the right.
    shape : tuple
        The full node grid (N_z, N_y, N_x).
    left, right : float
        The values at x = 0 and x = 1.
    """

    A: sp.csr_matrix
    rhs: np.ndarray
    shape: tuple[int, int, int]
    left: float = 1.0
    right: float = 0.0

    @property
    def free_shape(self) -> tuple[int, int, int]:
        nz, ny, nx = self.shape
        return nz, ny, nx - 2

    def full(self, free: np.ndarray) -> np.ndarray:
        """The nodal field (N_z, N_y, N_x) of free-node values, the Dirichlet planes filled in."""
        u = np.empty(self.shape)
        u[:, :, 1:-1] = np.asarray(free).reshape(self.free_shape)
        u[:, :, 0], u[:, :, -1] = self.left, self.right
        return u

    def multigrid(self):
        """This system's geometric multigrid hierarchy (:class:`~diffnet.solvers.gmg3d.GMG3D`)."""
        return GMG3D.build(self)

    def solve(self, method: str = "gmg") -> np.ndarray:
        """The nodal solution (N_z, N_y, N_x): ``gmg`` (FMG to a tenth of the discretisation error),
        ``amg`` (pyamg smoothed aggregation + CG to 1e-10) or ``direct`` (sparse LU; small grids)."""
        if method == "gmg":
            return self.multigrid().fmg(to_discretisation=True)
        if method == "amg":
            import pyamg

            ml = pyamg.smoothed_aggregation_solver(self.A, symmetry="symmetric")
            return self.full(ml.solve(self.rhs, tol=1e-10, accel="cg", maxiter=500))
        if method == "direct":
            from scipy.sparse.linalg import splu

            # The minimum-degree ordering of A + Aᵀ suits a symmetric 3-D stencil: at 33^3 it
            # factorises in a third of the time of SuperLU's default (COLAMD).
            return self.full(splu(self.A.tocsc(), permc_spec="MMD_AT_PLUS_A").solve(self.rhs))
        raise ValueError(f"unknown method {method!r}; choose from gmg, amg, direct")


def poisson3d_system(nu: np.ndarray, left: float = 1.0, right: float = 0.0) -> HexSystem:
    """The Q1 system of -div(nu grad u) = 0 on [0,1]^3 for nodal ``nu`` (N_z, N_y, N_x) >= 3 nodes per side,
    u = ``left`` at x = 0, ``right`` at x = 1, zero flux elsewhere."""
    nz, ny, nx = nu.shape
    if min(nu.shape) < 3:
        raise ValueError(f"need at least 3 nodes per side, got {nu.shape}")
    S = hex_stencil(nu, 1.0 / (nx - 1), 1.0 / (ny - 1), 1.0 / (nz - 1))
    indptr, indices, data, rhs = _free_csr(S, float(left), float(right))
    n = nz * ny * (nx - 2)
    A = sp.csr_matrix((data, indices, indptr), shape=(n, n))
    return HexSystem(A, rhs, (nz, ny, nx), float(left), float(right))
