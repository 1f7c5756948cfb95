"""The product's derivative in the instances' parameters, by the implicit function theorem.

Every stage after the network minimises the family's energy E(·; p) over a subspace: the coarse correction over
ũ + range(P) (:mod:`.coarse`, :mod:`.minimiser`), each colour step of a Gauss-Seidel sweep over that colour's free
unknowns (:mod:`.sweeps`). A stage maps x to x' with Vᵀ ∇E(x'; p) = 0 and x' - x in range(V); differentiating
in p with x held,

    dx'/dp = -V (Vᵀ H V)⁻¹ Vᵀ ∂_p ∇E(x'; p),

so for an upstream gradient ḡ the parameters receive

    -∂_p [w · ∇E(x'; p)],    w = V (Vᵀ H V)⁻¹ Vᵀ ḡ,

with w and x' held: one double backward through the family's loss, whatever the stage (:func:`parameter_vjp`).
w is what the stage's backward pass in the field computes anyway (the correction's P A_c⁻¹ Pᵀ ḡ; a colour step's
D_c⁻¹ ḡ on its nodes). For a quadratic energy the one-solve correction u = ũ - P A_c⁻¹ Pᵀ ∇E(ũ) is exactly such a
minimiser, and ∂_p ∇E(ũ) - (∂_p A)(ũ - u) = ∂_p ∇E(u): the formula at the corrected field. Holding A fixed, as
the field's backward pass does, leaves out all of this (a relative error of 1.0 in the gradient, issue 75).

A classical solve is the same stage with V = I: the adjoint gradient of an observation of the grid's solution is
-∂_p [w · ∇E(u_h; p)] with H w = ḡ on the free nodes, H the Hessian at u_h (:func:`minimiser_vjp`: ``deepfusion
invert --classical``, and the product's polish, whose Newton steps end at u_h).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from diffnet.multigrid.hessian import hessian_of
from diffnet.multigrid.stencil import as_blocks, components, neighbour_offsets, shifted

if TYPE_CHECKING:
    from diffnet.protocol.family import Family

__all__ = ["minimiser_vjp", "parameter_vjp"]

# Pairs (x', w) per double backward: a sweep's colour steps come 2 * 2^d per sweep, each a batch of instances.
_CHUNK = 64


def parameter_vjp(family: Family, states: list[torch.Tensor], directions: list[torch.Tensor],
                  instances: torch.Tensor, quadratic: bool = False) -> torch.Tensor:
    """-∂_p Σ_j w_j · ∇E(x'_j; p), summed over the stages j: each ``states[j]`` x'_j and ``directions[j]`` w_j a batch
    of fields (S, [C,] *grid) of the instances ``instances`` (S, ...); float64, of ``instances``' shape.

    ∇E is the gradient in the field of the family's summed loss terms (the one the correction and the sweeps
    minimise); a family whose loss does not depend on some entry of ``instances`` gives zero there. With ``quadratic``
    (E is: ∇E(x; p) = A(p) x - b(p)) and the family's own Hessian differentiable in p, the sum over many stages is
    Σ_j w_jᵀ A(p) (x'_j - x'_0) + (Σ_j w_j) · ∇E(x'_0; p): the products w_j (x'_j - x'_0) shifted by each stencil
    offset summed without a graph, then one Hessian and one double backward (a sweep's 2^(d+1) colour steps each,
    instead of one double backward per step: 20x cheaper at 64²)."""
    p = instances.detach().double().requires_grad_(True)
    with torch.inference_mode(False), torch.enable_grad():
        if quadratic and len(states) > 1 and family.loss().hessian is not None:
            hessian = hessian_of(family, states[0].detach().double(), p)
            if hessian.requires_grad:
                total = _bilinear(hessian, states, directions, components(family) > 1)
                total = total + _pairs(family, [states[0]], [sum(w.detach().double() for w in directions)], p)
                (grad,) = torch.autograd.grad(total, p, allow_unused=True)
                return -grad if grad is not None else torch.zeros_like(p)
        total = torch.zeros_like(p)
        per_chunk = max(1, _CHUNK // max(p.shape[0], 1))
        for start in range(0, len(states), per_chunk):
            value = _pairs(family, states[start:start + per_chunk], directions[start:start + per_chunk], p)
            if value.requires_grad:
                (grad,) = torch.autograd.grad(value, p, allow_unused=True)
                total = total - (grad if grad is not None else 0.0)
    return total


def _pairs(family: Family, states: list[torch.Tensor], directions: list[torch.Tensor], p: torch.Tensor) -> torch.Tensor:
    """Σ_j w_j · ∇E(x'_j; p) with its graph in p: the pairs as one batch, one double backward."""
    x = torch.cat([a.detach().double() for a in states]).requires_grad_(True)
    w = torch.cat([b.detach().double() for b in directions])
    repeated = p.repeat(len(states), *([1] * (p.ndim - 1)))
    energy = family.loss().value(x, repeated).sum()
    (g,) = torch.autograd.grad(energy, x, create_graph=True)
    return (g * w).sum()


def _bilinear(hessian: torch.Tensor, states: list[torch.Tensor], directions: list[torch.Tensor],
              vector: bool) -> torch.Tensor:
    """Σ_j w_jᵀ A (x'_j - x'_0) for A the Hessian stencil (its graph in p kept): entry [a, b, k, i] of the block
    stencil meets Σ_j w_j[a, i] (x'_j - x'_0)[b, i + o_k], summed over the stages first."""
    blocks = hessian if vector else hessian[:, None, None]
    x0 = as_blocks(states[0].detach().double(), vector)
    dims = x0.ndim - 2
    with torch.no_grad():
        products = torch.zeros(blocks.shape, dtype=torch.float64, device=x0.device)
        for x, w in zip(states[1:], directions[1:]):
            d, w = as_blocks(x.detach().double(), vector) - x0, as_blocks(w.detach().double(), vector)
            for k, offset in enumerate(neighbour_offsets(dims)):
                products[:, :, :, k] += w[:, :, None] * shifted(d, offset)[:, None]
    return (blocks * products).sum()


def minimiser_vjp(family: Family, fields: torch.Tensor, instances: torch.Tensor, grad: torch.Tensor,
                  solve: Callable | None = None) -> torch.Tensor:
    """The adjoint of the grid's minimiser u_h(p) of the family's energy: for each instance w with H w = ḡ on the free
    nodes (H the Hessian at ``fields`` (S, [C,] *grid), zero on the held ones; ``solve(matrix, rhs)``, default scipy's
    sparse direct solve: the classical route passes its sparse Cholesky, a floor above this one), then
    -∂_p [w · ∇E(u_h; p)] (:func:`parameter_vjp`); float64, of ``instances``' shape. Exact where ``fields`` is the
    minimiser; one factorisation per instance."""
    from scipy.sparse.linalg import spsolve

    from diffnet.multigrid.hessian import block_hessian
    from diffnet.multigrid.stencil import sparse_operator

    solve = solve if solve is not None else (lambda matrix, rhs: spsolve(matrix.tocsc(), rhs))
    u, p = fields.detach().double().cpu(), instances.detach().double().cpu()
    w = torch.zeros_like(u)
    for k in range(len(u)):
        with torch.inference_mode(False), torch.enable_grad():
            hessian, free = block_hessian(family, u[k:k + 1], p[k:k + 1])
        matrix, index = sparse_operator(hessian[0].detach().numpy(), free[0].numpy())
        rhs = grad[k].detach().double().cpu().reshape(-1).numpy()
        flat = np.zeros(rhs.size)
        flat[index] = solve(matrix, rhs[index])
        w[k] = torch.as_tensor(flat.reshape(u.shape[1:]))
    return parameter_vjp(family, [u], [w], p).to(instances.device)
