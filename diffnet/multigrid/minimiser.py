"""The coarse correction of a nonlinear energy: its exact minimiser over ũ + range(P), by damped Newton.

For a quadratic energy the best field in ũ + range(P) is one closed-form solve (:mod:`.coarse`). For any other
loss E (the cubic reaction, a hyperelastic solid) it is

    u = ũ + P c*,    c* = argmin_c E(ũ + P c),

found here by Newton's method on the coarse unknowns, batched over the instances, in float64: at the iterate w,
the fine Hessian H(w) (the family's ``hessian`` or probed), A_c = Pᵀ H P and its factor (:class:`.CoarseSpace`,
shifted where H is indefinite away from the minimiser), the step -P A_c⁻¹ Pᵀ ∇E(w), and a backtracking line
search on E (Armijo) that keeps a field the family calls admissible so where a step allows (a solid's
det F > 0: ``admissible(u, instances)``, when the network's field was; where the minimiser over the coarse space
itself is not, as a guarded energy's may be for a poor network field, the largest decrease is taken, so that
Newton converges rather than stalls at the boundary). It stops when the step is below :data:`TOLERANCE` of
the field (max-norms), taking that step whole; an instance that does not get there in :data:`MAX_ITERATIONS` is a
:class:`CoarseNewtonError` naming it, its iterations and its last step, never a silent NaN.

**Gradient.** At c*, Pᵀ ∇E(u) = 0; differentiating in ũ (implicit function theorem),
du/dũ = I - P A_c⁻¹ Pᵀ H with H and A_c at the corrected u, so the backward pass is
g ↦ g - H P A_c⁻¹ Pᵀ g: the quadratic case's, with the space built at the minimiser (the Newton iteration's
last one: a step of at most 1e-6 of the field from the minimiser). For the energy loss Pᵀ ∇E(u) = 0 makes it ∇E(u) unchanged (the envelope theorem). Measured against
a dense Newton oracle and by ``gradcheck`` (tests/science/test_coarse_minimiser.py).

A one-step version (the linearisation at ũ, trained through with its gradient) trained the cubic-reaction
plugin to 563x its floor (docs/results.md): a minimiser it is not, and its gradient is not the loss's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from diffnet.backend.clock import GRADIENT, LINE_SEARCH, MINIMISED, NEWTON_STEPS, SOLVES, PartClock
from diffnet.multigrid.coarse import CoarseSpace, coarse_grid, corrected_field
from diffnet.multigrid.factor import solve_factors
from diffnet.multigrid.sweeps import apply_sweeps
from diffnet.multigrid.stencil import as_fields, components
from diffnet.multigrid.vcycle import dense_interpolation

if TYPE_CHECKING:
    from diffnet.protocol.family import Family

__all__ = ["CoarseNewtonError", "MAX_ITERATIONS", "TOLERANCE", "coarse_minimiser", "minimise_on_coarse_space",
           "refuse_not_finite"]

TOLERANCE = 1e-6  # a Newton step's max-norm over the field's, taken as the last: the minimiser to about 1e-12
MAX_ITERATIONS = 50
_ARMIJO = 1e-4  # sufficient decrease: E(w + a s) <= E(w) + 1e-4 a ∇E(w)·s
_HALVINGS = 40
_ADMISSIBLE_HALVINGS = 12  # an admissible step sought down to 2^-12 of Newton's, then any that lowers E
# Below this step (of the field) a step that does not lower E in float64 is rounding: taken, Newton's local
# convergence is quadratic there.
_ROUNDING_STEP = 1e-7


class CoarseNewtonError(RuntimeError):
    """The coarse minimiser was not found for some instances (one line: which, after how many iterations)."""


def refuse_not_finite(loss: torch.Tensor, where: str) -> None:
    """A :class:`CoarseNewtonError` naming the instances whose loss ``loss`` (S,) is not finite at the network's field
    (the coarse grid ``where``, as '17x17')."""
    bad = (~torch.isfinite(loss)).nonzero().flatten().tolist()
    if bad:
        raise CoarseNewtonError(f"the coarse correction on {where}: the loss is not finite at the network's field "
                                f"for instance(s) {bad}")


def _energy(family: Family, u: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
    """The family's summed loss terms per sample (S,)."""
    with torch.no_grad():
        return family.loss().value(u, instances)


def _admissible(family: Family, u: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
    """(S,) bool: the family's ``admissible(u, instances)`` (a solid: det F > 0 everywhere), or every field."""
    own = family.loss().admissible
    if own is None:
        return torch.ones(u.shape[0], dtype=torch.bool, device=u.device)
    with torch.no_grad():
        return own(u, instances).to(torch.bool)


def _max_norm(x: torch.Tensor) -> torch.Tensor:
    return x.abs().flatten(1).amax(dim=1)


def _line_search(family: Family, w: torch.Tensor, instances: torch.Tensor, step: torch.Tensor, e0: torch.Tensor,
                 slope: torch.Tensor, small: torch.Tensor, admissible: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per instance, the largest of 1, 1/2, ... with sufficient decrease of E along ``step`` whose field the family
    calls admissible where ``admissible`` (the network's field was); where no admissible one decreases E within
    :data:`_ADMISSIBLE_HALVINGS` (the minimiser over the coarse space itself leaves the admissible set: the energy's
    guard, not its barrier, is met), the largest that decreases E. Returns the steps (0: none found), the energies
    there, and which instances found one."""
    shape = (-1,) + (1,) * (w.ndim - 1)
    alpha = torch.ones(len(w), dtype=w.dtype, device=w.device)
    kept = torch.zeros_like(alpha)  # admissible and decreasing
    plain = torch.zeros_like(alpha)  # decreasing
    e_kept, e_plain = e0.clone(), e0.clone()
    for halving in range(_HALVINGS):
        trial = w + alpha.reshape(shape) * step
        e = _energy(family, trial, instances)
        decrease = torch.isfinite(e) & ((e <= e0 + _ARMIJO * alpha * slope) | small)
        fresh = decrease & (kept == 0) & (_admissible(family, trial, instances) | ~admissible)
        kept, e_kept = torch.where(fresh, alpha, kept), torch.where(fresh, e, e_kept)
        fresh = decrease & (plain == 0)
        plain, e_plain = torch.where(fresh, alpha, plain), torch.where(fresh, e, e_plain)
        if bool((kept > 0).all()) or (halving >= _ADMISSIBLE_HALVINGS and bool(((kept > 0) | (plain > 0)).all())):
            break
        alpha = 0.5 * alpha
    chosen = torch.where(kept > 0, kept, plain)
    return chosen, torch.where(kept > 0, e_kept, e_plain), chosen > 0


def minimise_on_coarse_space(family: Family, u: torch.Tensor, instances: torch.Tensor, nodes: int,
                             clock: PartClock | None = None) -> tuple[torch.Tensor, CoarseSpace, torch.Tensor]:
    """The minimiser of ``family``'s loss over u + range(P) for float64 fields ``u`` (S, [C,] *grid).

    Returns
    -------
    w : torch.Tensor
        The minimisers, like ``u``.
    space : CoarseSpace
        The coarse space at ``w`` (its Hessian and A_c's factor: the backward pass's).
    iterations : torch.Tensor
        (S,) int: each instance's Newton iterations.

    Raises
    ------
    CoarseNewtonError
        When an instance's loss is not finite at ``u``, or Newton does not converge for it.
    """
    clock = clock if clock is not None else PartClock()
    vector = components(family) > 1
    grid = tuple(u.shape[2:] if vector else u.shape[1:])
    coarse = coarse_grid(grid, nodes)
    transfers = [dense_interpolation(n, m, u) for n, m in zip(grid, coarse)]
    where = "x".join(map(str, coarse))
    s = u.shape[0]
    with clock.part(LINE_SEARCH, u.device):
        energy = _energy(family, u, instances)
        start_admissible = _admissible(family, u, instances)
    refuse_not_finite(energy, where)
    w = u.clone()
    parts: list[torch.Tensor | None] = [None] * s
    iterations = torch.zeros(s, dtype=torch.long)
    last = torch.zeros(s, dtype=torch.float64)
    active = list(range(s))
    for it in range(MAX_ITERATIONS + 1):
        index = torch.as_tensor(active, device=u.device)
        wa, pa = w.index_select(0, index), instances.index_select(0, index.to(instances.device))
        built = CoarseSpace._build_new(family, wa, pa, transfers, coarse, vector, clock, shift=True)
        for k, part in zip(active, built):
            parts[k] = part
        space = CoarseSpace.of(transfers, built, vector)
        free = as_fields(space.free, vector)
        with clock.part(GRADIENT, u.device):
            g = space.gradient(wa) * free
        with clock.part(SOLVES, u.device):
            rc = space.restrict(g)
            step = -space.prolong(solve_factors(space.factors, rc.reshape(len(active), -1, 1)).reshape(rc.shape))
        size = _max_norm(step) / _max_norm(wa).clamp_min(1e-300)
        last[index.cpu()] = size.cpu()
        going = (size > TOLERANCE).cpu()
        # A step below the tolerance is Newton's in its quadratic regime: taken whole, it leaves an error of about
        # its square (1e-12 of the field), and no further Hessian is formed (one build fewer per pass).
        done = (~going).nonzero().flatten().to(u.device)
        w[index[done]] = wa[done] + step[done]
        if it == MAX_ITERATIONS or not bool(going.any()):
            break
        keep = going.nonzero().flatten()
        active = [active[k] for k in keep.tolist()]
        iterations[active] += 1
        keep = keep.to(u.device)
        wa, pa, step, e0 = wa[keep], pa[keep], step[keep], energy[torch.as_tensor(active, device=u.device)]
        slope = (g[keep] * step).flatten(1).sum(1)  # < 0: A_c (shifted or not) is positive definite
        small = size[keep] <= _ROUNDING_STEP
        admissible_start = start_admissible[torch.as_tensor(active, device=u.device)]
        with clock.part(LINE_SEARCH, u.device):
            alpha, e, ok = _line_search(family, wa, pa, step, e0, slope, small, admissible_start)
        index = torch.as_tensor(active, device=u.device)
        w[index] = wa + alpha.reshape((-1,) + (1,) * (wa.ndim - 1)) * step
        energy[index] = torch.where(ok, e, e0)
        # An instance whose step lowers E nowhere along it has stalled (its step stays above the tolerance: reported).
        active = [k for k, moved in zip(active, ok.tolist()) if moved]
        if not active:
            break
    failed = (last > TOLERANCE).nonzero().flatten().tolist()
    if failed:
        steps = ", ".join(f"{float(last[k]):.1e}" for k in failed[:4])
        raise CoarseNewtonError(f"the coarse correction on {where}: damped Newton did not reach a step of "
                                f"{TOLERANCE:g} of the field for instance(s) {failed} in {MAX_ITERATIONS} iterations "
                                f"(last steps {steps})")
    clock.count(NEWTON_STEPS, int(iterations.sum()))
    clock.count(MINIMISED, s)
    return w, CoarseSpace.of(transfers, parts, vector), iterations


def coarse_minimiser(family: Family, u: torch.Tensor, instances: torch.Tensor, nodes: int,
                     clock: PartClock | None = None, sweeps: int = 0) -> torch.Tensor:
    """The field ``u`` (S, [C,] *grid) corrected to the minimiser of ``family``'s loss over u + range(P); differentiable
    in u (the module docstring's backward pass). Fields in any floating dtype, solved in float64. ``sweeps``:
    symmetric Gauss-Seidel sweeps after it with the linearisation at the minimiser (:mod:`.sweeps`)."""
    clock = clock if clock is not None else PartClock()
    with torch.inference_mode(False), torch.enable_grad():
        u64 = u.detach().clone().double()
        p64 = instances.detach().clone()
        p64 = p64.double() if p64.is_floating_point() else p64
        w, space, _ = minimise_on_coarse_space(family, u64, p64, nodes, clock)
    corrected = corrected_field(u, (w - u64).to(u.dtype), instances, space, clock, family, w)
    if sweeps and instances.requires_grad and torch.is_grad_enabled():
        # The sweeps minimise the linearisation at the minimiser, which itself moves with p: a third derivative.
        raise NotImplementedError("gradients in the parameters through Gauss-Seidel sweeps on a nonlinear energy are "
                                  "not available: evaluate with sweeps = 0")
    return apply_sweeps(corrected, space.hessian, space.free, space.load, sweeps, space.vector, clock)
