"""The product's derivative in the instances' parameters, by the implicit function theorem.

Every stage after the network minimises the family's energy E(·; p) over a subspace: the coarse correction over
ũ + range(P) (:mod:`.coarse`, :mod:`.minimiser`), each colour step of a Gauss-Seidel sweep over that colour's free
unknowns (:mod:`.smoother`). A stage maps x to x' with Vᵀ ∇E(x'; p) = 0 and x' - x in range(V); differentiating
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
-∂_p [w · ∇E(u_h; p)] with A w = ḡ (``deepfusion invert --classical``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from diffnet.protocol.family import Family

__all__ = ["parameter_vjp"]

# Pairs (x', w) per double backward: a sweep's colour steps come 2 * 2^d per sweep, each a batch of instances.
_CHUNK = 64


def parameter_vjp(family: Family, states: list[torch.Tensor], directions: list[torch.Tensor],
                  params: torch.Tensor) -> torch.Tensor:
    """-∂_p Σ_j w_j · ∇E(x'_j; p), summed over the stages j: each ``states[j]`` x'_j and ``directions[j]`` w_j a batch
    of fields (S, [C,] *grid) of the instances ``params`` (S, ...); float64, of ``params``' shape.

    ∇E is the gradient in the field of the family's summed loss terms (the one the correction and the sweeps
    minimise); a family whose loss does not depend on some entry of ``params`` gives zero there."""
    p = params.detach().double().requires_grad_(True)
    total = torch.zeros_like(p)
    s = p.shape[0]
    pairs = [(x, w) for x, w in zip(states, directions)]
    per_chunk = max(1, _CHUNK // max(s, 1))
    with torch.inference_mode(False), torch.enable_grad():
        for start in range(0, len(pairs), per_chunk):
            chunk = pairs[start:start + per_chunk]
            x = torch.cat([a.detach().double() for a, _ in chunk]).requires_grad_(True)
            w = torch.cat([b.detach().double() for _, b in chunk])
            repeated = p.repeat(len(chunk), *([1] * (p.ndim - 1)))
            energy = sum(t.sum() for t in family.loss_terms(x, repeated).values())
            (g,) = torch.autograd.grad(energy, x, create_graph=True)
            (grad,) = torch.autograd.grad((g * w).sum(), p, allow_unused=True)
            if grad is not None:
                total = total - grad
    return total
