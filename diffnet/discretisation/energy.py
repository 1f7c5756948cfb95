"""Q1 finite elements on the node grid in any dimension: 2^d-point Gauss quadrature as convolutions,
and energies.

Each cell between 2^d neighbouring nodes is one multilinear (Q1) element: bilinear on the
pixels of a 2-D grid, trilinear on the voxels of a 3-D one. A 2x2 (2x2x2) convolution over the
nodal field gives, for every element at once, the value or a derivative of the interpolant at
one Gauss point, so an integral over the domain is a weighted sum of convolution outputs. With
the tensor-product 2-point Gauss rule the integrals below are exact for a multilinear
coefficient, which is why minimising these energies over nodal values gives exactly the Q1
finite-element solution assembled by :mod:`diffnet.solvers.fem` from the same :func:`gauss_basis`.

The dimension lives in the grid: a field (S, N_y, N_x) with spacings (h_x, h_y), or
(S, N_z, N_y, N_x) with (h_x, h_y, h_z); the spacings are given x first, the axes outermost first.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
import torch.nn.functional as F

from diffnet.backend.constants import constant
from diffnet.backend.precision import conv, no_tf32
from diffnet.grid.element import gauss_basis

__all__ = [
    "at_gauss_points",
    "quadratic_energy",
    "quadratic_stencil",
    "element_stencils",
    "gauss_point_stencils",
    "dirichlet_energy",
    "dirichlet_stencil",
    "reaction_diffusion_energy",
    "source_work",
    "reaction_diffusion_stencil",
]

def _kernels(rows: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """(Q, 2^d) basis rows as Q convolution kernels of shape (Q, 1, 2, ..., 2)."""
    dims = like.ndim - 1
    return constant(("q1 rows", rows.shape, rows.tobytes()), lambda: rows.reshape(-1, 1, *(2,) * dims), like)


def at_gauss_points(field: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
    """Apply basis rows to a nodal field at every element.

    Parameters
    ----------
    field : torch.Tensor
        Nodal values, shape (S, *grid), ``grid`` 2-D or 3-D.
    rows : numpy.ndarray
        (Q, 2^d) weights on the element's nodes (rows of :func:`gauss_basis` outputs).

    Returns
    -------
    torch.Tensor
        Shape (S, Q, *(n - 1 for n in grid)).
    """
    return conv(field[:, None], _kernels(rows, field))


def _conv(dims: int):
    """Convolution and its input-gradient for 2 (bilinear) or 3 (trilinear elements) spatial dimensions,
    looked up when called."""
    return getattr(F, f"conv{dims}d"), getattr(torch.nn.grad, f"conv{dims}d_input")


class _QuadraticEnergy(torch.autograd.Function):
    """Per sample, 1/2 sum over Gauss points q and elements of c_q |D_q u|^2, memory-lean.

    D_q is a stack of 2x2 (2-D) or 2x2x2 (3-D) convolutions (the gradient at Gauss point q) and c_q the
    coefficient interpolated there. Autograd would keep every D_q u and c_q for the
    backward pass -- a dozen full-size fields per sample, a real share of the memory at
    1024^2 once the network's activations are checkpointed. Here the forward pass keeps
    only u and the nodal coefficient, works one Gauss point at a time, and the backward
    pass recomputes D_q u to form the gradient sum_q D_q^T (c_q D_q u) with a transposed
    convolution. An optional element weight (S, 1, *cells) multiplies c_q element by element (the
    immersed energies: 1 inside, a small weight on cut elements, 0 outside).
    """

    @staticmethod
    def forward(ctx, u: torch.Tensor, coeff: torch.Tensor, interp: torch.Tensor, ops: torch.Tensor,
                weight: torch.Tensor | None) -> torch.Tensor:
        # u, coeff: (S, 1, *grid); interp: (Q, 1, 1, 2, 2[, 2]); ops: (Q, D, 1, 2, 2[, 2]).
        ctx.save_for_backward(u, coeff, interp, ops, weight)
        convolve, _ = _conv(u.ndim - 2)
        total = u.new_zeros(u.shape[0])
        with no_tf32():
            for q in range(ops.shape[0]):
                c_q = convolve(coeff, interp[q])
                if weight is not None:
                    c_q = c_q * weight
                total += (c_q * convolve(u, ops[q]).square()).sum(dim=tuple(range(1, u.ndim)))
        return 0.5 * total

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        u, coeff, interp, ops, weight = ctx.saved_tensors
        convolve, convolve_input = _conv(u.ndim - 2)
        need_u, need_c = ctx.needs_input_grad[:2]
        grad_u = torch.zeros_like(u) if need_u else None
        grad_c = torch.zeros_like(coeff) if need_c else None
        with no_tf32():
            for q in range(ops.shape[0]):
                c_q = convolve(coeff, interp[q])
                if weight is not None:
                    c_q = c_q * weight
                du = convolve(u, ops[q])
                if need_u:
                    grad_u += convolve_input(u.shape, ops[q], c_q * du)
                if need_c:
                    half = 0.5 * du.square().sum(dim=1, keepdim=True)
                    grad_c += convolve_input(coeff.shape, interp[q], half if weight is None else half * weight)
        scale = grad.reshape(-1, *([1] * (u.ndim - 1)))
        return (grad_u * scale if need_u else None), (grad_c * scale if need_c else None), None, None, None


def quadratic_energy(u: torch.Tensor, coeff: torch.Tensor, interp: np.ndarray, ops: list[np.ndarray],
                     weight: torch.Tensor | None = None) -> torch.Tensor:
    """1/2 sum_q sum_e w_e (interp_q . coeff) |ops_q u|^2 per sample (S,) for nodal u, coeff (S, *grid).

    ``grid`` is 2-D (bilinear elements, 4 nodes) or 3-D (trilinear, 8 nodes). ``interp`` is
    (Q, nodes) basis rows interpolating the coefficient to the Q Gauss points; ``ops`` a list
    of (Q, nodes) basis rows whose values at point q form D_q; ``weight`` (S, *cells) the element
    weights w_e (default 1).
    """
    stacked = np.stack(ops, axis=1)
    kernel = (2,) * (u.ndim - 1)
    interp_k = constant(("q1 interp", interp.shape, interp.tobytes()), lambda: interp.reshape(-1, 1, 1, *kernel), u)
    ops_k = constant(("q1 ops", stacked.shape, stacked.tobytes()),
                     lambda: stacked.reshape(interp.shape[0], len(ops), 1, *kernel), u)
    w = None if weight is None else weight[:, None].to(u.dtype)
    return _QuadraticEnergy.apply(u[:, None], coeff[:, None].to(u.dtype), interp_k, ops_k, w)


def quadratic_stencil(coeff: torch.Tensor, interp: np.ndarray, ops: list[np.ndarray]) -> torch.Tensor:
    """The Hessian of :func:`quadratic_energy` in u as a 3^d-point stencil, per sample.

    The energy is 1/2 uᵀ H u with H = sum over elements and Gauss points q of c_q D_qᵀ D_q, so
    each element adds c_q (D_qᵀ D_q)[a, b] to the coupling of its node a to its node b.

    Parameters
    ----------
    coeff : torch.Tensor
        Nodal coefficient (S, *grid), ``grid`` 2-D or 3-D.
    interp, ops : numpy.ndarray
        As for :func:`quadratic_energy`.

    Returns
    -------
    torch.Tensor
        (S, 3^d, *grid): entry k at node i is H[i, i + o_k], the offsets o_k in
        ``itertools.product((-1, 0, 1), repeat=d)`` order (:mod:`diffnet.multigrid.vcycle`'s layout).
    """
    pairs = np.einsum("dqa,dqb->qab", np.stack(ops), np.stack(ops))  # (Q, nodes, nodes): sum_d D_qa D_qb
    return element_stencils(coeff[:, None], interp, pairs[None, None])[:, 0]


def element_stencils(coeff: torch.Tensor, interp: np.ndarray, pairs: np.ndarray) -> torch.Tensor:
    """The operators H_p = sum over elements, coefficients g and Gauss points q of c_gq B_pgq, as 3^d-point stencils.

    Each element adds sum_g c_gq B_pgq[a, b] to the coupling of its node a to its node b (a, b in
    :func:`element_nodes` order), c_gq the nodal coefficient g interpolated by ``interp``'s rows.

    Parameters
    ----------
    coeff : torch.Tensor
        Nodal coefficients (S, G, *grid), ``grid`` 2-D or 3-D.
    interp : numpy.ndarray
        (Q, 2^d): a coefficient's weights at each Gauss point.
    pairs : numpy.ndarray
        (P, G, Q, 2^d, 2^d): the element matrices B_pgq per operator p, coefficient g and Gauss point q
        (not necessarily symmetric: an off-diagonal block of a vector Hessian).

    Returns
    -------
    torch.Tensor
        (S, P, 3^d, *grid) in :mod:`diffnet.multigrid.vcycle`'s layout.
    """
    dims = coeff.ndim - 2
    convolve, _ = _conv(dims)
    kernel = (2,) * dims
    s, groups = coeff.shape[:2]
    c = coeff.reshape(s * groups, 1, *coeff.shape[2:])
    # The element's tables as constants (built once per dtype and device: no host-to-device copy in a step).
    rows = constant(("q1 coefficient rows", interp.shape, interp.tobytes()),
                    lambda: interp.reshape(-1, 1, 1, *kernel), c)
    with no_tf32():
        c_q = [convolve(c, rows[q])[:, 0] for q in range(len(interp))]
    cells, n_ops, n_nodes = tuple(c_q[0].shape[1:]), pairs.shape[0], 2**dims
    # Per element node a, its rows of every element's (nodes x nodes) block, one matrix product over the
    # coefficients and Gauss points, each added into its nodes' slice in place. One node's rows at a time: all
    # blocks at once wrote (and read back) 2^d times the stencil's memory (61 MB for four 32^3 instances), the
    # larger part of the assembly; summing the blocks one by one and padding each took 5x as long (3-D).
    pair_rows = constant(("q1 pairs by row", pairs.shape, pairs.tobytes()),  # (a, b P, g q)
                         lambda: np.moveaxis(pairs, (0, 1, 2, 3, 4), (2, 3, 4, 0, 1)).reshape(n_nodes, -1, groups * len(c_q)),
                         coeff)
    values = torch.stack(c_q, dim=1).reshape(s, groups * len(c_q), -1)  # (S, g q, cells)
    return _scatter(pair_rows, values, n_ops, cells)


def gauss_point_stencils(values: torch.Tensor, pairs: np.ndarray) -> torch.Tensor:
    """The operators H_p = sum over elements, groups g and Gauss points q of c_pgq B_gq, as 3^d-point stencils, for
    coefficients given at the Gauss points themselves (a nonlinear energy's Hessian at the current field: 3 u_q^2
    of a cubic reaction, a hyperelastic solid's tangent moduli).

    Parameters
    ----------
    values : torch.Tensor
        (S, P, G, Q, *cells): coefficient g of operator p at Gauss point q of every element (cells: the grid's
        nodes less one per axis).
    pairs : numpy.ndarray
        (G, Q, 2^d, 2^d): the element matrices B_gq (weights included), shared by the operators.

    Returns
    -------
    torch.Tensor
        (S, P, 3^d, *grid) in :mod:`diffnet.multigrid.vcycle`'s layout.
    """
    s, n_ops, groups, points, *cells = values.shape
    n_nodes = pairs.shape[-1]
    # (a, b, g q): node a's rows of every element's block, one matrix product over the groups and Gauss points.
    pair_rows = constant(("q1 gauss-point pairs by row", pairs.shape, pairs.tobytes()),
                         lambda: np.moveaxis(pairs, (0, 1, 2, 3), (2, 3, 0, 1)).reshape(n_nodes, n_nodes, -1), values)
    flat = values.reshape(s * n_ops, groups * points, -1)
    stencil = _scatter(pair_rows, flat, 1, tuple(cells))
    return stencil.reshape(s, n_ops, *stencil.shape[2:])


def _scatter(pair_rows: torch.Tensor, values: torch.Tensor, n_ops: int, cells: tuple[int, ...]) -> torch.Tensor:
    """Element blocks into stencils: node a's rows ``pair_rows[a]`` (2^d nodes x P, K) times the coefficients ``values``
    (S, K, cells), added at each element's nodes: (S, P, 3^d, *grid)."""
    dims = len(cells)
    corners = list(itertools.product((0, 1), repeat=dims))  # the kernel's (and the basis's) node order
    offsets = list(itertools.product((-1, 0, 1), repeat=dims))
    s, n_nodes = values.shape[0], len(corners)
    grid = tuple(n + 1 for n in cells)
    stencil = values.new_zeros(s, n_ops, len(offsets), *grid)
    for a, ca in enumerate(corners):
        at = tuple(slice(o, o + n) for o, n in zip(ca, cells))  # the element at e sits at node e + ca
        rows = (pair_rows[a] @ values).reshape(s, n_nodes, n_ops, *cells)
        for b, cb in enumerate(corners):
            k = offsets.index(tuple(j - i for i, j in zip(ca, cb)))
            stencil[(slice(None), slice(None), k, *at)] += rows[:, b]
    return stencil


def _basis(u: torch.Tensor, spacing: tuple[float, ...]) -> tuple[np.ndarray, list[np.ndarray], float]:
    """gauss_basis(*spacing) as (values, gradients, weight), checked against u's grid (S, *grid)."""
    if len(spacing) != u.ndim - 1:
        raise ValueError(f"need one spacing per axis of the grid {tuple(u.shape[1:])} (x first), got {len(spacing)}")
    values, *grads, w = gauss_basis(*spacing)
    return values, grads, w


def dirichlet_energy(u: torch.Tensor, nu: torch.Tensor, *spacing: float) -> torch.Tensor:
    """J(u) = integral of 1/2 nu |grad u|^2 over the Q1 elements, per sample.

    Parameters
    ----------
    u, nu : torch.Tensor
        Nodal field and nodal diffusivity, shape (S, N_y, N_x) or (S, N_z, N_y, N_x); nu is
        interpolated multilinearly to the Gauss points.
    *spacing : float
        Node spacings, x first: ``hx, hy`` (and ``hz``).

    Returns
    -------
    torch.Tensor
        Shape (S,). Equals 1/2 u^T K u with K the Q1 stiffness matrix of nu.
    """
    if nu.shape != u.shape:
        raise ValueError(f"need u and nu of one shape, got {tuple(u.shape)} and {tuple(nu.shape)}")
    values, grads, w = _basis(u, spacing)
    return w * quadratic_energy(u, nu, values, grads)


def dirichlet_stencil(nu: torch.Tensor, *spacing: float) -> torch.Tensor:
    """The Hessian of :func:`dirichlet_energy` (the Q1 stiffness matrix K of nu) as a 3^d-point stencil (S, 3^d, *grid)."""
    values, grads, w = _basis(nu, spacing)
    return w * quadratic_stencil(nu, values, grads)


def reaction_diffusion_stencil(nu: torch.Tensor, kappa: float, *spacing: float) -> torch.Tensor:
    """The Hessian of :func:`reaction_diffusion_energy`, K + kappa^2 M, as a 3^d-point stencil (S, 3^d, *grid)."""
    values, grads, w = _basis(nu, spacing)
    return w * (quadratic_stencil(nu, values, grads) + kappa**2 * quadratic_stencil(torch.ones_like(nu), values, [values]))


def reaction_diffusion_energy(
    u: torch.Tensor,
    nu: torch.Tensor,
    kappa: float,
    f: torch.Tensor | float,
    *spacing: float,
) -> torch.Tensor:
    """J(u) = integral of [1/2 nu |grad u|^2 + 1/2 kappa^2 u^2 - f u], per sample.

    Parameters
    ----------
    u, nu : torch.Tensor
        Nodal field and diffusivity, shape (S, *grid), ``grid`` 2-D or 3-D.
    kappa : float
        Reaction coefficient; the reaction term is kappa^2 u.
    f : torch.Tensor or float
        Source: a constant, or nodal values of shape (S, *grid) interpolated multilinearly.
    *spacing : float
        Node spacings, x first: ``hx, hy`` (and ``hz``).

    Returns
    -------
    torch.Tensor
        Shape (S,). Equals 1/2 u^T (K + kappa^2 M) u - b^T u with the Q1 stiffness K,
        mass M and load b integrated by the same rule.
    """
    values, grads, w = _basis(u, spacing)
    diffusion = quadratic_energy(u, nu, values, grads)
    # The mass term is the same quadratic form with the basis values and a unit coefficient.
    mass = quadratic_energy(u, torch.ones_like(u), values, [values])
    return w * (diffusion + kappa**2 * mass) - source_work(u, f, *spacing)


def source_work(u: torch.Tensor, f: torch.Tensor | float, *spacing: float) -> torch.Tensor:
    """The source's work, the integral of f u over the Q1 elements, per sample (S,): f a constant or nodal values
    (S, *grid), both interpolated multilinearly to the Gauss points (the load b^T u of the assembled system's
    right-hand side, :func:`diffnet.solvers.fem.dirichlet_system`'s ``f``)."""
    values, _, w = _basis(u, spacing)
    over = tuple(range(1, u.ndim + 1))  # the Gauss points and the elements
    if isinstance(f, torch.Tensor):
        return w * (at_gauss_points(f, values) * at_gauss_points(u, values)).sum(dim=over)
    return w * f * at_gauss_points(u, values).sum(dim=over)
