"""The immersed Q1 energy of a domain cut out of the node grid, in torch (a DiffNet's loss) and assembled
(its exact minimiser: the floor, and the classical solver's system), 2-D.

    J(u) = ∫_Ω [½ ν |∇u|² + ½ κ² u² - f u]                                  (cut-cell quadrature)
         + α ∫_{cut elements} ½ ν |∇u|²                                       (finite-cell regularisation)
         - ∫_Γ ν ∂_n u (u - g) + ½ ∫_Γ (γ_e ν / h) (u - g)²                    (symmetric Nitsche, if Dirichlet on Γ)

over the nodal fields on the active nodes (those of the elements Ω meets; the others are held at 0).
Its stationarity conditions are Nitsche's method for -∇·(ν∇u) + κ²u = f in Ω, u = g on Γ (or, without
the Γ terms, ν ∂_n u = 0 there): consistent, so the discrete solution converges at Q1's O(h²) in L2.

Why these choices. Nitsche rather than a penalty alone: a penalty (γ/h) ∫ (u - g)² is inconsistent and
leaves an O(h / γ) error on Γ, first order. The penalty's weight γ_e is set element by element from
the largest eigenvalue C_e of ∫_{Γ_e} h ν (∂_n v)² against the element's energy (a 4 x 4 generalised
eigenproblem on the fields orthogonal to constants): with γ_e >= 4 C_e the energy is bounded below
for every cut, however small the inside part (J >= ¼ a(u, u) + C_e ∫ (ν/h) u² elementwise), which a
fixed γ is not; γ_e >= 10 keeps the penalty meaningful where the boundary barely enters an element.
The α-term (finite-cell, α = 1e-4 of the element's energy over the whole cut element) bounds C_e and
the conditioning where Ω covers a sliver of an element; it perturbs the solution by O(α).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from diffnet.instances.cutcell import CutCells
from diffnet.discretisation.energy import at_gauss_points, quadratic_energy
from diffnet.grid.element import gauss_basis

__all__ = ["ALPHA", "GAMMA_MIN", "Immersed", "immersed", "point_batch", "immersed_energy", "immersed_matrices"]

ALPHA = 1e-4
GAMMA_MIN = 10.0

_CORNERS = ((0, 0), (0, 1), (1, 0), (1, 1))


@dataclass(frozen=True, eq=False)
class Immersed:
    """One instance's immersed discretisation.

    Attributes
    ----------
    cells : CutCells
        The domain on the grid and its cut-cell quadrature.
    nodes, b_nodes : numpy.ndarray
        (P, 4), (B, 4): the grid's flat node index of each corner of the element of each inside point,
        boundary point.
    nu_points, nu_boundary : numpy.ndarray
        ν at the inside and boundary points (interpolated from the nodes).
    penalty : numpy.ndarray
        (B,) γ_e ν / h at each boundary point; zeros where Γ carries no Dirichlet data.
    stiffness_weight, load_weight : numpy.ndarray
        (N_y - 1, N_x - 1): each element's weight in the 2x2-Gauss part: 1 inside, α (stiffness) or 0
        (load) on cut elements, whose inside part is in the point lists, 0 outside.
    """

    cells: CutCells
    nodes: np.ndarray
    b_nodes: np.ndarray
    nu_points: np.ndarray
    nu_boundary: np.ndarray
    penalty: np.ndarray
    stiffness_weight: np.ndarray
    load_weight: np.ndarray

    @property
    def active(self) -> np.ndarray:
        return self.cells.active


def _corner_nodes(element: np.ndarray, nx: int) -> np.ndarray:
    """(n, 4) flat node indices of the corners of flat elements ``element`` on a grid of ``nx`` columns."""
    i, j = np.divmod(element, nx - 1)
    return np.stack([(i + dy) * nx + j + dx for dy, dx in _CORNERS], axis=-1)


def _element_stiffness(nu: np.ndarray, spacing: tuple[float, float]) -> np.ndarray:
    """(N_y - 1, N_x - 1, 4, 4): every element's Q1 stiffness matrix of nodal ``nu`` by 2x2 Gauss."""
    values, gx, gy, w = gauss_basis(*spacing)
    ny, nx = nu.shape
    corners = np.stack([nu[dy : ny - 1 + dy, dx : nx - 1 + dx] for dy, dx in _CORNERS], axis=-1)
    nu_q = corners @ values.T  # (ny-1, nx-1, Q)
    stiff = w * (gx[:, :, None] * gx[:, None, :] + gy[:, :, None] * gy[:, None, :])
    return np.einsum("ijq,qab->ijab", nu_q, stiff)


def immersed(cells: CutCells, nu: np.ndarray, dirichlet: bool, alpha: float = ALPHA) -> Immersed:
    """The immersed discretisation of ``cells`` for nodal ``nu`` (N_y, N_x); ``dirichlet``: whether Γ
    carries Dirichlet data (Nitsche) or none (zero flux, natural)."""
    ny, nx = cells.resolution
    nu = np.asarray(nu, dtype=np.float64)
    flat = nu.ravel()
    nodes, b_nodes = _corner_nodes(cells.element, nx), _corner_nodes(cells.b_element, nx)
    nu_p = (flat[nodes] * cells.values).sum(axis=1)
    nu_b = (flat[b_nodes] * cells.b_values).sum(axis=1)
    stiffness_weight = np.where(cells.full, 1.0, np.where(cells.cut, alpha, 0.0))
    penalty = np.zeros(len(nu_b))
    if dirichlet and len(nu_b):
        hx, hy = cells.spacing
        h = float(np.sqrt(hx * hy))
        # Per cut element: A_e (the inside part's energy + the alpha-term) and B_e (h nu (d_n v)^2 on Γ_e).
        n_el = (ny - 1) * (nx - 1)
        A = np.zeros((n_el, 4, 4))
        np.add.at(A, cells.element, (cells.weights * nu_p)[:, None, None] * np.einsum("pad,pbd->pab", cells.grads, cells.grads))
        A += alpha * _element_stiffness(nu, cells.spacing).reshape(n_el, 4, 4) * cells.cut.reshape(n_el, 1, 1)
        dn = np.einsum("bad,bd->ba", cells.b_grads, cells.b_normals)
        B = np.zeros((n_el, 4, 4))
        np.add.at(B, cells.b_element, (h * cells.b_weights * nu_b)[:, None, None] * dn[:, :, None] * dn[:, None, :])
        els = np.unique(cells.b_element)
        # Off the constants (both forms vanish there): an orthonormal basis of the other three directions.
        Q = np.linalg.qr(np.concatenate([np.ones((4, 1)), np.eye(4)[:, :3]], axis=1))[0][:, 1:]
        Ar, Br = Q.T @ A[els] @ Q, Q.T @ B[els] @ Q
        L = np.linalg.cholesky(Ar)
        Li = np.linalg.inv(L)
        C = np.linalg.eigvalsh(Li @ Br @ np.swapaxes(Li, 1, 2))[:, -1]
        gamma = np.zeros(n_el)
        gamma[els] = np.maximum(4.0 * C, GAMMA_MIN)
        penalty = gamma[cells.b_element] * nu_b / h
    return Immersed(cells, nodes, b_nodes, nu_p, nu_b, penalty, stiffness_weight,
                    cells.full.astype(np.float64))


def point_batch(data: Sequence[Immersed], like: torch.Tensor) -> dict[str, torch.Tensor]:
    """The instances' point lists concatenated, node indices into the batch's flattened (scalar) fields, as
    tensors in ``like``'s dtype and device."""
    size = int(np.prod(data[0].cells.resolution))
    t = lambda a: torch.as_tensor(a, dtype=like.dtype, device=like.device)  # noqa: E731
    out = {
        "nodes": torch.as_tensor(np.concatenate([d.nodes + s * size for s, d in enumerate(data)]), device=like.device),
        "b_nodes": torch.as_tensor(np.concatenate([d.b_nodes + s * size for s, d in enumerate(data)]), device=like.device),
        "sample": torch.as_tensor(np.concatenate([np.full(len(d.nodes), s) for s, d in enumerate(data)]), device=like.device),
        "b_sample": torch.as_tensor(np.concatenate([np.full(len(d.b_nodes), s) for s, d in enumerate(data)]),
                                    device=like.device),
    }
    for key, attr in (("values", "values"), ("grads", "grads"), ("weights", "weights"), ("b_values", "b_values"),
                      ("b_grads", "b_grads"), ("b_weights", "b_weights"), ("b_normals", "b_normals")):
        out[key] = t(np.concatenate([getattr(d.cells, attr) for d in data]))
    for key in ("nu_points", "nu_boundary", "penalty"):
        out[key] = t(np.concatenate([getattr(d, key) for d in data]))
    for key in ("stiffness_weight", "load_weight"):
        out[key] = t(np.stack([getattr(d, key) for d in data]))
    return out


def immersed_energy(u: torch.Tensor, nu: torch.Tensor, data: Sequence[Immersed], kappa: float = 0.0,
                    f: float = 0.0, g: float = 0.0) -> torch.Tensor:
    """J(u) per sample (S,) for nodal fields u and ν (S, N_y, N_x), instance s discretised by ``data[s]``:
    constant source ``f`` and Dirichlet value ``g`` on Γ (where its penalty is nonzero)."""
    b = point_batch(data, u)
    hx, hy = data[0].cells.spacing
    values, gx, gy, w = gauss_basis(hx, hy)
    # Elements wholly inside (and the alpha-term on cut ones): the 2x2 Gauss energy as convolutions.
    bulk = quadratic_energy(u, nu, values, [gx, gy], b["stiffness_weight"])
    if kappa:
        bulk = bulk + kappa**2 * quadratic_energy(u, torch.ones_like(u), values, [values], b["load_weight"])
    total = w * bulk
    if f:
        total = total - w * f * (at_gauss_points(u, values) * b["load_weight"][:, None]).sum(dim=(1, 2, 3))
    flat = u.reshape(-1)
    # The inside parts of the cut elements.
    U = flat[b["nodes"]]
    up = (U * b["values"]).sum(-1)
    grad = torch.einsum("pa,pad->pd", U, b["grads"])
    e = 0.5 * b["nu_points"] * grad.square().sum(-1) + 0.5 * kappa**2 * up.square() - f * up
    total = total.index_add(0, b["sample"], b["weights"] * e)
    # Nitsche on Γ.
    if bool((b["penalty"] > 0).any()):
        Ub = flat[b["b_nodes"]]
        ub = (Ub * b["b_values"]).sum(-1)
        dn = torch.einsum("ba,bad,bd->b", Ub, b["b_grads"], b["b_normals"])
        on = b["penalty"] > 0
        e = torch.where(on, -b["nu_boundary"] * dn * (ub - g) + 0.5 * b["penalty"] * (ub - g).square(), 0.0)
        total = total.index_add(0, b["b_sample"], b["b_weights"] * e)
    return total


def immersed_matrices(data: Immersed, nu: np.ndarray, kappa: float = 0.0, f: float = 0.0,
                      g: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """The quadratic form of :func:`immersed_energy`, J(u) = ½ uᵀ K u - bᵀ u (+ const), assembled: K as a
    9-point stencil (N_y, N_x, 3, 3) and b (N_y, N_x)."""
    cells = data.cells
    ny, nx = cells.resolution
    hx, hy = cells.spacing
    values, _, _, w = gauss_basis(hx, hy)
    n_el = (ny - 1) * (nx - 1)
    Ke = _element_stiffness(np.asarray(nu, dtype=np.float64), (hx, hy)) * data.stiffness_weight[..., None, None]
    if kappa:
        Ke += kappa**2 * w * (values.T @ values) * data.load_weight[..., None, None]
    be = f * w * np.broadcast_to(values.sum(axis=0), (ny - 1, nx - 1, 4)) * data.load_weight[..., None]
    Ke, be = Ke.reshape(n_el, 4, 4).copy(), be.reshape(n_el, 4).copy()
    N, G = cells.values, cells.grads
    point = np.einsum("pad,pbd->pab", G, G) * data.nu_points[:, None, None] + kappa**2 * N[:, :, None] * N[:, None, :]
    np.add.at(Ke, cells.element, cells.weights[:, None, None] * point)
    np.add.at(be, cells.element, (cells.weights * f)[:, None] * N)
    on = data.penalty > 0
    if on.any():
        Nb, nu_b, lam, wb = cells.b_values[on], data.nu_boundary[on], data.penalty[on], cells.b_weights[on]
        D = np.einsum("bad,bd->ba", cells.b_grads[on], cells.b_normals[on])
        sym = D[:, :, None] * Nb[:, None, :]
        term = -nu_b[:, None, None] * (sym + np.swapaxes(sym, 1, 2)) + lam[:, None, None] * Nb[:, :, None] * Nb[:, None, :]
        np.add.at(Ke, cells.b_element[on], wb[:, None, None] * term)
        np.add.at(be, cells.b_element[on], (wb * g)[:, None] * (-nu_b[:, None] * D + lam[:, None] * Nb))
    Ke, be = Ke.reshape(ny - 1, nx - 1, 4, 4), be.reshape(ny - 1, nx - 1, 4)
    stencil, rhs = np.zeros((ny, nx, 3, 3)), np.zeros((ny, nx))
    for a, (ay, ax) in enumerate(_CORNERS):
        rows = (slice(ay, ny - 1 + ay), slice(ax, nx - 1 + ax))
        rhs[rows] += be[..., a]
        for c, (cy, cx) in enumerate(_CORNERS):
            stencil[rows + (1 + cy - ay, 1 + cx - ax)] += Ke[..., a, c]
    return stencil, rhs
