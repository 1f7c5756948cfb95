"""Q1 finite elements on the pixel grid: 2x2 Gauss quadrature as convolutions, and energies.

Each cell between four neighbouring nodes is one bilinear (Q1) element. A 2x2
convolution over the nodal field gives, for every element at once, the value or a
derivative of the interpolant at one Gauss point, so an integral over the domain is a
weighted sum of convolution outputs. With the 2x2 Gauss rule the integrals below are
exact for a bilinear diffusivity, which is why minimising these energies over nodal
values gives exactly the Q1 finite-element solution assembled by
:mod:`diffnet.solvers.poisson` from the same :func:`gauss_basis`.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from diffnet.constants import constant
from diffnet.precision import conv2d, no_tf32

__all__ = [
    "ELEMENT_NODES",
    "gauss_basis",
    "at_gauss_points",
    "quadratic_energy",
    "quadratic_stencil",
    "dirichlet_energy",
    "dirichlet_stencil",
    "reaction_diffusion_energy",
    "reaction_diffusion_stencil",
]

# An element's nodes as (dy, dx) offsets from its lower-left node: the order of gauss_basis's
# columns, and of every element matrix built from it (diffnet/solvers/).
ELEMENT_NODES = ((0, 0), (0, 1), (1, 0), (1, 1))

# Gauss points of the 2-point rule on [0, 1]; each carries weight 1/2.
_G = (0.5 - 0.5 / math.sqrt(3.0), 0.5 + 0.5 / math.sqrt(3.0))


def gauss_basis(hx: float, hy: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """The bilinear basis on one element, evaluated at its four Gauss points.

    Element nodes are ordered (0,0), (0,1), (1,0), (1,1) as (dy, dx) offsets from the
    element's lower-left node; Gauss points likewise, (eta, xi) with xi along x.

    Returns
    -------
    values, grad_x, grad_y : numpy.ndarray
        Shape (4 Gauss points, 4 nodes): N_a, dN_a/dx, dN_a/dy at each point.
    weight : float
        The quadrature weight of every point including the Jacobian, hx * hy / 4.
    """
    values = np.empty((4, 4))
    gx = np.empty((4, 4))
    gy = np.empty((4, 4))
    for q, (eta, xi) in enumerate((e, x) for e in _G for x in _G):
        for a, (dy, dx) in enumerate(ELEMENT_NODES):
            fx = xi if dx else 1.0 - xi
            fy = eta if dy else 1.0 - eta
            values[q, a] = fx * fy
            gx[q, a] = (1.0 if dx else -1.0) * fy / hx
            gy[q, a] = (1.0 if dy else -1.0) * fx / hy
    return values, gx, gy, hx * hy / 4.0


def _kernels(rows: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """(Q, 4) basis rows as Q conv2d kernels of shape (Q, 1, 2, 2)."""
    return constant(("q1 rows", rows.shape, rows.tobytes()), lambda: rows.reshape(-1, 1, 2, 2), like)


def at_gauss_points(field: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
    """Apply basis rows to a nodal field at every element.

    Parameters
    ----------
    field : torch.Tensor
        Nodal values, shape (S, N_y, N_x).
    rows : numpy.ndarray
        (Q, 4) weights on the element's nodes (rows of :func:`gauss_basis` outputs).

    Returns
    -------
    torch.Tensor
        Shape (S, Q, N_y - 1, N_x - 1).
    """
    return conv2d(field[:, None], _kernels(rows, field))


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
    convolution.
    """

    @staticmethod
    def forward(ctx, u: torch.Tensor, coeff: torch.Tensor, interp: torch.Tensor, ops: torch.Tensor) -> torch.Tensor:
        # u, coeff: (S, 1, *grid); interp: (Q, 1, 1, 2, 2[, 2]); ops: (Q, D, 1, 2, 2[, 2]).
        ctx.save_for_backward(u, coeff, interp, ops)
        conv, _ = _conv(u.ndim - 2)
        total = u.new_zeros(u.shape[0])
        with no_tf32():
            for q in range(ops.shape[0]):
                c_q = conv(coeff, interp[q])
                total += (c_q * conv(u, ops[q]).square()).sum(dim=tuple(range(1, u.ndim)))
        return 0.5 * total

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        u, coeff, interp, ops = ctx.saved_tensors
        conv, conv_input = _conv(u.ndim - 2)
        need_u, need_c = ctx.needs_input_grad[:2]
        grad_u = torch.zeros_like(u) if need_u else None
        grad_c = torch.zeros_like(coeff) if need_c else None
        with no_tf32():
            for q in range(ops.shape[0]):
                c_q = conv(coeff, interp[q])
                du = conv(u, ops[q])
                if need_u:
                    grad_u += conv_input(u.shape, ops[q], c_q * du)
                if need_c:
                    grad_c += conv_input(coeff.shape, interp[q], 0.5 * du.square().sum(dim=1, keepdim=True))
        scale = grad.reshape(-1, *([1] * (u.ndim - 1)))
        return (grad_u * scale if need_u else None), (grad_c * scale if need_c else None), None, None


def quadratic_energy(u: torch.Tensor, coeff: torch.Tensor, interp: np.ndarray, ops: list[np.ndarray]) -> torch.Tensor:
    """1/2 sum_q sum_e (interp_q . coeff) |ops_q u|^2 per sample (S,) for nodal u, coeff (S, *grid).

    ``grid`` is 2-D (bilinear elements, 4 nodes) or 3-D (trilinear, 8 nodes). ``interp`` is
    (Q, nodes) basis rows interpolating the coefficient to the Q Gauss points; ``ops`` a list
    of (Q, nodes) basis rows whose values at point q form D_q.
    """
    stacked = np.stack(ops, axis=1)
    kernel = (2,) * (u.ndim - 1)
    interp_k = constant(("q1 interp", interp.shape, interp.tobytes()), lambda: interp.reshape(-1, 1, 1, *kernel), u)
    ops_k = constant(("q1 ops", stacked.shape, stacked.tobytes()),
                     lambda: stacked.reshape(interp.shape[0], len(ops), 1, *kernel), u)
    return _QuadraticEnergy.apply(u[:, None], coeff[:, None].to(u.dtype), interp_k, ops_k)


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
        ``itertools.product((-1, 0, 1), repeat=d)`` order (:mod:`diffnet.vcycle`'s layout).
    """
    import itertools

    dims = coeff.ndim - 1
    corners = list(itertools.product((0, 1), repeat=dims))  # the kernel's (and the basis's) node order
    offsets = list(itertools.product((-1, 0, 1), repeat=dims))
    pairs = np.einsum("dqa,dqb->qab", np.stack(ops), np.stack(ops))  # (Q, nodes, nodes): sum_d D_qa D_qb
    conv, _ = _conv(dims)
    kernel = (2,) * dims
    c = coeff[:, None]
    with no_tf32():
        c_q = [conv(c, torch.as_tensor(row.reshape(1, 1, *kernel), dtype=c.dtype, device=c.device))[:, 0]
               for row in interp]
    grid = coeff.shape[1:]
    stencil = coeff.new_zeros(coeff.shape[0], len(offsets), *grid)
    for a, ca in enumerate(corners):
        pad = []
        for o in reversed(ca):  # the element at e sits at node e + ca in the node grid
            pad += [o, 1 - o]
        for b, cb in enumerate(corners):
            element = sum(float(pairs[q, a, b]) * c_q[q] for q in range(len(c_q)))
            k = offsets.index(tuple(j - i for i, j in zip(ca, cb)))
            stencil[:, k] += F.pad(element, pad)
    return stencil


def dirichlet_energy(u: torch.Tensor, nu: torch.Tensor, hx: float, hy: float) -> torch.Tensor:
    """J(u) = integral of 1/2 nu |grad u|^2 over the Q1 elements, per sample.

    Parameters
    ----------
    u, nu : torch.Tensor
        Nodal field and nodal diffusivity, shape (S, N_y, N_x); nu is interpolated
        bilinearly to the Gauss points.
    hx, hy : float
        Node spacings.

    Returns
    -------
    torch.Tensor
        Shape (S,). Equals 1/2 u^T K u with K the Q1 stiffness matrix of nu.
    """
    values, gx, gy, w = gauss_basis(hx, hy)
    return w * quadratic_energy(u, nu, values, [gx, gy])


def dirichlet_stencil(nu: torch.Tensor, hx: float, hy: float) -> torch.Tensor:
    """The Hessian of :func:`dirichlet_energy` (the Q1 stiffness matrix K of nu) as a 9-point stencil (S, 9, N_y, N_x)."""
    values, gx, gy, w = gauss_basis(hx, hy)
    return w * quadratic_stencil(nu, values, [gx, gy])


def reaction_diffusion_stencil(nu: torch.Tensor, kappa: float, hx: float, hy: float) -> torch.Tensor:
    """The Hessian of :func:`reaction_diffusion_energy`, K + kappa^2 M, as a 9-point stencil (S, 9, N_y, N_x)."""
    values, gx, gy, w = gauss_basis(hx, hy)
    return w * (quadratic_stencil(nu, values, [gx, gy]) + kappa**2 * quadratic_stencil(torch.ones_like(nu), values, [values]))


def reaction_diffusion_energy(
    u: torch.Tensor,
    nu: torch.Tensor,
    kappa: float,
    f: torch.Tensor | float,
    hx: float,
    hy: float,
) -> torch.Tensor:
    """J(u) = integral of [1/2 nu |grad u|^2 + 1/2 kappa^2 u^2 - f u], per sample.

    Parameters
    ----------
    u, nu : torch.Tensor
        Nodal field and diffusivity, shape (S, N_y, N_x).
    kappa : float
        Reaction coefficient; the reaction term is kappa^2 u.
    f : torch.Tensor or float
        Source: a constant, or nodal values of shape (S, N_y, N_x) interpolated bilinearly.
    hx, hy : float
        Node spacings.

    Returns
    -------
    torch.Tensor
        Shape (S,). Equals 1/2 u^T (K + kappa^2 M) u - b^T u with the Q1 stiffness K,
        mass M and load b integrated by the same rule.
    """
    values, gx, gy, w = gauss_basis(hx, hy)
    diffusion = quadratic_energy(u, nu, values, [gx, gy])
    # The mass term is the same quadratic form with the basis values and a unit coefficient.
    mass = quadratic_energy(u, torch.ones_like(u), values, [values])
    if isinstance(f, torch.Tensor):
        load = (at_gauss_points(f, values) * at_gauss_points(u, values)).sum(dim=(1, 2, 3))
    else:
        load = f * at_gauss_points(u, values).sum(dim=(1, 2, 3))
    return w * (diffusion + kappa**2 * mass - load)
