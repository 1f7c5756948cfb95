"""The Hessian of a family's loss in its field, as the torch multigrid's stencil: the family's own
(``hessian(u, instances)``, capability ``precondition``) or, by default, read off the loss by probing.

**Probing** (:func:`probe_stencil`). Where the loss couples each node only to its 3^d neighbours (the Q1
energies, linear or not), the Hessian is a 3^d-point stencil, and 3^d Hessian-vector products with
coloured probes (1 on the nodes whose index is c modulo 3 along each axis) give every entry: each
neighbour of a node has its own colour; for C unknowns the probes colour nodes *and* components (C 3^d
products). The products are autograd's (the gradient differentiated again), exact at the current field.

This default lives here, with the multigrid that needs it, and not on :class:`~diffnet.protocol.family.Family`:
the protocol imports nothing above it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from diffnet.multigrid.stencil import (apply_blocks, apply_stencil, as_blocks, as_fields, components, neighbour_offsets,
                                      shifted)

if TYPE_CHECKING:
    from diffnet.protocol.family import Family

__all__ = ["hessian_of", "block_hessian", "probe_stencil", "fixed_nodes", "loss_gradient", "energy_norms",
           "is_quadratic", "stencil_mismatch", "STENCIL_TOLERANCE"]

# The largest relative difference between an energy's stencil and autograd's Hessian-vector product that is taken for
# rounding and the probe's differences (measured on 17 nodes a side: 2e-16 to 3e-14 for the built-in and example
# energies, declared or probed); a loss whose Hessian reaches past the 3^d neighbours (a residual's squares) is off by
# 0.1-1 (tests/methods/test_loss.py).
STENCIL_TOLERANCE = 1e-8


def hessian_of(family: Family, u: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
    """The Hessian of the family's summed loss terms in the field at u: the family's ``hessian(u, instances)``
    where it writes one (a known quadratic form, at a tenth of the cost), else :func:`probe_stencil`.
    (S, 3^d, *grid) for fields (S, *grid); (S, C, C, 3^d, *grid) for C unknowns."""
    own = family.loss().hessian
    return own(u, instances) if own is not None else probe_stencil(family, u, instances)


def fixed_nodes(family: Family, instances: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(S, *grid) bool ((S, C, *grid) for C unknowns): the nodes the family's field does not take from the network's output.

    Found by comparing two fields, unless the family says itself (a ``fixed_nodes(instances, dtype)``
    member: a field corrected on a coarse space, :class:`diffnet.multigrid.corrected.CoarseCorrected`, moves every
    free node however it is probed)."""
    own = getattr(family, "fixed_nodes", None)
    if own is not None:
        return own(instances, dtype)
    raw = torch.zeros(instances.shape[0], components(family), *family.resolution, dtype=dtype, device=instances.device)
    return family.field(raw + 1.0, instances) == family.field(raw, instances)


def loss_gradient(family: Family, u: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
    """g = dL/du of the family's summed loss terms at the field u (no graph kept)."""
    v = u.detach().requires_grad_(True)
    total = family.loss().value(v, instances).sum()
    return torch.autograd.grad(total, v)[0]


def _colours(grid: tuple[int, ...], device) -> torch.Tensor:
    """(*grid) int: the colour of each node, sum over axes of (index mod 3) 3^axis."""
    colour = torch.zeros(grid, dtype=torch.long, device=device)
    for axis, n in enumerate(grid):
        shape = [1] * len(grid)
        shape[axis] = n
        colour = colour + (torch.arange(n, device=device) % 3).reshape(shape) * 3**axis
    return colour


def probe_stencil(family: Family, u: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
    """The Hessian of the family's summed loss at the field u (S, *grid) as a stencil (S, 3^d, *grid),
    read off 3^d Hessian-vector products with coloured probes (exact: the loss's gradient differentiated again by
    autograd, one first backward for all of them); for C unknowns, fields (S, C, *grid), a block stencil
    (S, C, C, 3^d, *grid) from C 3^d products (each probe one colour of one component).

    Valid where the loss couples each node to its 3^d neighbours only (the engine's Hessian where a family writes none;
    checked before training, :func:`stencil_mismatch`). Central differences of the gradient, the earlier way, were off
    by 2 % at 33^2 for a Neo-Hookean energy near its lift (a step of 1e-3 of the field is a large strain there)."""
    vector = components(family) > 1
    blocks = as_blocks(u, vector)
    grid = tuple(blocks.shape[2:])
    dims = len(grid)
    colour = _colours(grid, u.device)
    stencil = torch.empty(u.shape[0], blocks.shape[1], blocks.shape[1], 3**dims, *grid, dtype=u.dtype, device=u.device)
    with torch.enable_grad():
        x = u.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(family.loss().value(x, instances).sum(), x, create_graph=True)
    for b in range(blocks.shape[1]):
        products = []
        for c in range(3**dims):
            e = torch.zeros_like(blocks)
            e[:, b] = (colour == c).to(u.dtype)
            (hv,) = torch.autograd.grad(g, x, as_fields(e, vector), retain_graph=True, allow_unused=True)
            products.append(as_blocks(torch.zeros_like(u) if hv is None else hv.detach(), vector))
        for k, offset in enumerate(neighbour_offsets(dims)):
            # The neighbour i + offset has colour(i + offset): read that probe's product at i.
            target = shifted(colour[None].to(u.dtype), offset)[0].round().long()
            inside = shifted(torch.ones(1, *grid, dtype=u.dtype, device=u.device), offset)[0] > 0
            entry = torch.zeros_like(blocks)
            for c in range(3**dims):
                entry = torch.where((target == c) & inside, products[c], entry)
            stencil[:, :, b, k] = entry
    return stencil if vector else stencil[:, 0, 0]


def block_hessian(family: Family, u: torch.Tensor, instances: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The family's Hessian at u, at every node, and its free nodes, in the block layout: (S, C, C, 3^d, *grid)
    and (S, C, *grid) bool (C = 1 for a scalar family: the same values). The V-cycle and the coarse
    correction build their operators from it (:func:`on_free_nodes`)."""
    free = fixed_nodes(family, instances, u.dtype).logical_not()
    hessian = hessian_of(family, u, instances).to(u.dtype)
    if components(family) == 1:
        free, hessian = free[:, None], hessian[:, None, None]
    return hessian, free



def energy_norms(family: Family, instances: torch.Tensor, at: torch.Tensor, *fields: torch.Tensor) -> list[torch.Tensor]:
    """Each of ``fields`` (S, [C,] *grid) in the energy norm of the family's loss, ||x||_H = sqrt(xᵀ H x) per instance
    (S,), H the Hessian of the summed loss at the field ``at`` (a quadratic energy's stiffness; a nonlinear one's
    linearisation there), formed once, in float64. For an energy the norm it minimises: E(v) - E(u_h) = ½||v - u_h||²_H
    for the grid's minimiser u_h; its error weighs a field's gradient, so high-frequency error that L2 barely sees
    shows. A family on a cut domain's Hessian holds the inside only."""
    with torch.inference_mode(False), torch.enable_grad():
        at = at.detach().clone().double()
        p = instances.detach().clone()
        p = p.double() if p.is_floating_point() else p
        hessian = hessian_of(family, at, p).double()
        out = []
        for x in fields:
            x = x.detach().double()
            quadratic = (x * apply_stencil(hessian, x)).flatten(1).sum(1)
            out.append(quadratic.clamp_min(0.0).sqrt())
    return out


def _probe_point(family: Family, instances: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A field of ``family`` near its lift (the field of a zero output plus a small random one: a solid stays
    admissible) and a random vector on its free nodes, float64, for one instance."""
    generator = torch.Generator().manual_seed(seed)
    shape = (instances.shape[0], components(family), *family.resolution)
    zero = torch.zeros(shape, dtype=torch.float64)
    with torch.no_grad():
        lift = family.field(zero, instances)
        scale = float(lift.abs().max().clamp_min(1.0))
        u = lift + 1e-2 * scale * (family.field(torch.randn(shape, generator=generator, dtype=torch.float64),
                                                instances) - lift)
    free = fixed_nodes(family, instances, torch.float64).logical_not()
    v = torch.randn(u.shape, generator=generator, dtype=torch.float64) * free
    return u, v


def stencil_mismatch(family: Family, instances: torch.Tensor) -> float:
    """|H v - S v| / |H v| on the free nodes: the energy's Hessian-vector product by autograd (a double backward of its
    terms) against its stencil's (declared, or probed by :func:`probe_stencil`) along a random vector v, at a field near
    the lift, for ``instances`` (float64, a row or a few). About rounding for a loss whose Hessian couples each node
    to its 3^d neighbours only (:data:`STENCIL_TOLERANCE`); of order one for one that reaches farther (a residual's
    squares, whose J^T J couples nodes twice its reach apart), whose stencil would then precondition, correct and
    sweep with another operator than the loss's."""
    with torch.inference_mode(False), torch.enable_grad():
        u, v = _probe_point(family, instances, 0)
        free = v != 0
        stencil = hessian_of(family, u, instances).detach().double()
        vector = components(family) > 1
        sv = as_fields(apply_blocks(stencil if vector else stencil[:, None, None], as_blocks(v, vector)), vector)
        x = u.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(family.loss().value(x, instances).sum(), x, create_graph=True)
        (hv,) = torch.autograd.grad((g * v).sum(), x, allow_unused=True)
        hv = torch.zeros_like(v) if hv is None else hv.detach()
    size = float(torch.linalg.vector_norm(hv * free))
    gap = float(torch.linalg.vector_norm((hv - sv) * free))
    return gap / size if size > 0 else (0.0 if gap == 0 else float("inf"))


def is_quadratic(family: Family, instances: torch.Tensor) -> bool:
    """Whether the family's loss is quadratic in the field: its Hessian stencil the same at two different fields, for
    ``instances`` (float64); give it the family on a small grid (the probe is 32 s at 128^3, 0.1 s at 17^3). An energy
    that declares ``quadratic`` is taken at its word."""
    declared = getattr(family.loss(), "quadratic", None)
    if declared is not None:
        return bool(declared)
    grid = tuple(family.resolution)
    channels = components(family)
    rows = [torch.zeros(instances.shape[0], channels, *grid, dtype=torch.float64),
            torch.randn(instances.shape[0], channels, *grid, generator=torch.Generator().manual_seed(0),
                        dtype=torch.float64)]
    with torch.no_grad():
        fields = [family.field(raw, instances).detach() for raw in rows]
    a = hessian_of(family, fields[0], instances).detach()
    family.clear_caches()  # a family that keeps its Hessian per instance must probe it again
    b = hessian_of(family, fields[1], instances).detach()
    return bool((a - b).abs().max() <= 1e-8 * max(float(a.abs().max()), 1e-300))
