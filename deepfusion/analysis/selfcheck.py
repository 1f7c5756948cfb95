"""A family checked against itself before training: on one instance and a small grid, its truth, reference
and floor give fields of the declared shape, and its loss is stationary at its own same-grid solution.

The configuration tries the members that are cheap on the run's grid (the inputs against ``in_channels``, the
field's shape, the domain's, a load). What it cannot afford there, and what otherwise surfaces only after a
whole training (a truth that cannot be computed, a reference of another problem than the loss's), is tried
here, on the coarsest multigrid level's grid (at most 33 nodes a side without levels), for the first training
instance. The central test: the loss's gradient at the family's own same-grid solution (its floor, else its
reference) is ~0 next to its gradient at the zero field. A loss and a reference written for different
problems (a coefficient read in one and not the other) give a gradient of the order of the zero field's,
and training would chase a floor that is not its own.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np
import torch

from deepfusion.analysis import reference_cache
from deepfusion.analysis.inference import instance_labels
from diffnet.protocol.family import Family

__all__ = ["GRADIENT_TOLERANCE", "FamilyMismatch", "SelfCheck", "check_family", "check_grid", "stationarity"]

# The gradient at the family's own solution over the gradient at the zero field above which the loss and the
# solution are taken for different problems. For a linear family the ratio is the residual of the solution's part
# the network gives relative to the zero field's: a solution 10 % off gives 0.1. Measured (benchmarks/family_check.py,
# docs/results.md): 1e-15 to 2e-10 for the built-in and example families solved to a tolerance (direct, AMG-CG,
# Newton), 7e-4 for the 3-D Poisson floor (FMG to a tenth of the discretisation error, by design); 0.1 to 0.2 for
# every family's solution 10 % off, 0.9 to 60 for another instance's solution in most.
GRADIENT_TOLERANCE = 1e-2

# The largest grid the check runs on without multigrid levels (per axis): the truth of a 3-D family is a solve
# on a grid several times finer.
SMALL = 33


class FamilyMismatch(ValueError):
    """The family disagrees with itself (one line naming the members that disagree)."""


@dataclass(frozen=True)
class SelfCheck:
    """What the check found: the grid and instance, the gradient ratio (None without a same-grid solution) and
    the members it ran."""

    grid: tuple[int, ...]
    instance: str
    ratio: float | None
    solution: str
    members: tuple[str, ...]
    seconds: float

    def line(self) -> str:
        """One line for the training log."""
        ran = ", ".join(self.members) or "nothing to run"
        gradient = "" if self.ratio is None else (f"; the loss's gradient at {self.solution} is {self.ratio:.1e} of "
                                                  "its gradient at the zero field")
        return (f"family check on {'x'.join(map(str, self.grid))}, one instance ({self.instance}): {ran} "
                f"gave fields of the declared shape{gradient} ({self.seconds:.1f} s)")


def check_grid(resolution: tuple[int, ...], levels: tuple[int, ...]) -> tuple[int, ...]:
    """The grid the check runs on: the coarsest multigrid level's, else the run's with at most :data:`SMALL`
    nodes a side."""
    if levels:
        return (levels[0],) * len(resolution)
    return tuple(min(n, SMALL) for n in resolution)


def stationarity(family, instances: np.ndarray, u: np.ndarray) -> float:
    """|g(u)| / |g(0)|: the loss's gradient, in the directions the network's output moves the field, at the field
    ``u`` (1, *grid) or (1, C, *grid) over that at the field of a zero output, for the instances ``instances`` (1, ...).

    The directions are those of ``field``: g(u) = d/dδ L(u + field(δ) - field(0)) at δ = 0 (exact for a field affine
    in the output, as a held boundary value and a mask make it), so held nodes, where an energy's gradient is a
    reaction and not zero, are left out as training leaves them out. On a family with a domain only the nodes
    whose neighbours all lie inside it count: a solution is reported inside its domain alone (zero outside,
    where the loss may still have an extension of it), and a node's gradient reads its neighbours."""
    p = torch.as_tensor(instances, dtype=torch.float64)
    shape = (len(p), len(family.unknowns), *family.resolution)
    zero = torch.zeros(shape, dtype=torch.float64)
    base = family.field(zero, p).detach()
    weight = torch.as_tensor(_interior(family, instances)[:, None].astype(np.float64)).expand(shape)

    def gradient(at: torch.Tensor) -> float:
        delta = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
        u = at + family.field(delta, p) - base
        loss = sum(v.sum() for v in family.loss_terms(u, p).values())
        (g,) = torch.autograd.grad(loss, delta, allow_unused=True)
        return 0.0 if g is None else float(torch.linalg.vector_norm(g * weight))

    at_zero = gradient(base)
    at_u = gradient(torch.as_tensor(u, dtype=torch.float64).reshape(base.shape))
    return at_u / at_zero if at_zero > 0 else (0.0 if at_u == 0 else float("inf"))


def _interior(family, instances: np.ndarray) -> np.ndarray:
    """(S, *grid) bool: every node, or on a family with a domain the nodes whose 3^d neighbours lie inside it (the
    box's edge counts as inside)."""
    from diffnet.grid.nodal import node_data

    grid = tuple(family.resolution)
    if not family.has("domain"):
        return np.ones((len(instances), *grid), dtype=bool)
    outside = node_data(family.domain(instances), len(instances), grid, f"{family.name}.domain(instances)") > 0
    padded = np.pad(outside, [(0, 0)] + [(1, 1)] * len(grid))
    near = np.zeros_like(outside)
    for offset in itertools.product(range(3), repeat=len(grid)):  # a node next to an outside one, itself included
        near |= padded[(slice(None), *(slice(o, o + n) for o, n in zip(offset, grid)))]
    return ~near


def _fields(family, name: str, value, count: int = 1) -> np.ndarray:
    """``value`` checked as ``count`` fields of the family's unknowns on its grid, finite."""
    grid, c = tuple(family.resolution), len(family.unknowns)
    expected = (count, *grid) if c == 1 else (count, c, *grid)
    arr = np.asarray(value, dtype=np.float64) if value is not None else None
    if arr is None or arr.shape != expected:
        got = "None" if arr is None else list(arr.shape)
        raise FamilyMismatch(f"problem.family: {family.name}.{name} returned {got} for {count} instance on "
                             f"{list(grid)}; the engine needs {list(expected)} (one field per unknown "
                             f"{list(family.unknowns)})")
    if not np.isfinite(arr).all():
        raise FamilyMismatch(f"problem.family: {family.name}.{name} returned NaN or Inf on {list(grid)}")
    return arr


def _residual_is_the_loss(small, instances: np.ndarray, label: str) -> None:
    """A :class:`~diffnet.protocol.loss.Residual`'s promise, at a random field: the residual has the field's shape and
    its squares sum to the summed loss terms (a residual scaled otherwise would give another correction than the
    loss's, silently)."""
    p = torch.as_tensor(instances, dtype=torch.float64)
    raw = torch.randn(1, len(small.unknowns), *small.resolution, dtype=torch.float64,
                      generator=torch.Generator().manual_seed(0))
    loss_object = small.loss()
    with torch.no_grad():
        u = small.field(raw, p)
        r = loss_object.residual(u, p)
        loss = float(loss_object.value(u, p).sum())
    if tuple(r.shape) != tuple(u.shape):
        raise FamilyMismatch(f"problem.family: {small.name}.residual returned {list(r.shape)} for one instance; the "
                             f"engine needs the field's shape {list(u.shape)} (one residual per node)")
    squares = float(r.square().sum())
    if not abs(squares - loss) <= 1e-6 * max(abs(loss), 1e-300):
        raise FamilyMismatch(f"problem.family: the {small.name} family's residual squares sum to {squares:.6g} on one "
                             f"instance ({label}) at a random field where its loss is {loss:.6g}; a Residual needs "
                             "them equal (scale the residual)")


def _stencil_is_the_hessian(small, instances: np.ndarray, label: str) -> None:
    """An :class:`~diffnet.protocol.loss.Energy`'s promise, along a random vector: its Hessian stencil (its own, or
    probed from its loss by 3^d products) is the loss's Hessian, as autograd's Hessian-vector product gives it
    (:func:`diffnet.multigrid.hessian.stencil_mismatch`). A loss whose Hessian reaches past the 3^d neighbours (a
    residual's squares) would be preconditioned, corrected and swept with another operator than its own, silently."""
    from diffnet.multigrid.hessian import STENCIL_TOLERANCE, stencil_mismatch

    gap = stencil_mismatch(small, torch.as_tensor(instances, dtype=torch.float64))
    if not gap <= STENCIL_TOLERANCE:
        declared = ("its hessian(u, instances)" if small.loss().hessian is not None else
                    "the 3^d-point stencil read off its loss")
        raise FamilyMismatch(
            f"problem.family: the {small.name} family's loss is an energy (its Hessian coupling each node to its 3^d "
            f"neighbours only), but {declared} differs from autograd's Hessian-vector product by {gap:.2g} (relative, "
            f"at most {STENCIL_TOLERANCE:g}) on one instance ({label}) on {'x'.join(map(str, small.resolution))}: a "
            "loss that reaches farther, such as a residual's squares, is a diffnet.Residual (docs/families.md, "
            "'The loss')")


def check_family(small, instances: np.ndarray) -> SelfCheck:
    """Check the family ``small`` (on the check's grid, :func:`check_grid`) against itself for the one instance
    ``instances`` (1, ...): every member of its ``reference``, ``floor``, ``polish`` and ``input_fields`` capabilities
    runs and gives fields of the declared shape, a Residual's squares are the loss, an Energy's Hessian stencil its
    Hessian, and the loss is stationary (:data:`GRADIENT_TOLERANCE`) at its own
    same-grid solution. Raises :class:`FamilyMismatch` (one line) on the first disagreement."""
    t0 = time.perf_counter()
    family, grid = small, tuple(small.resolution)
    label = instance_labels(family, instances)[0]
    ran, solution, own = [], None, None

    def call(member: str, fn):
        """A member's call; what it raises is reported as the member's, one line."""
        try:
            return fn()
        except (NotImplementedError, TypeError, AttributeError, ValueError, ZeroDivisionError) as e:
            text = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise FamilyMismatch(f"problem.family: {family.name}.{member} failed on one instance ({label}) on "
                                 f"{'x'.join(map(str, grid))} before training: {type(e).__name__}: {text}") from None

    if small.has("reference"):
        truth = _fields(small, "truth", call("truth", lambda: reference_cache.truth(small, instances)))
        # A family whose truth is its reference (the default, e.g. Burgers' converged Godunov) solves once.
        own_truth = getattr(type(small), "truth", Family.truth) is not Family.truth
        reference = _fields(small, "reference", call("reference", lambda: small.reference(instances))) if own_truth \
            else truth
        ran += ["truth", "reference"]
        own, solution = reference, f"its reference ({small.reference_name()})"
        if small.has("floor"):
            optimum = call("discrete_optimum", lambda: reference_cache.discrete_optimum(small, instances, truth)[0])
            own, solution = _fields(small, "discrete_optimum", optimum), f"its floor ({small.floor_name()})"
            ran.append("discrete_optimum")
    if small.has("polish") and own is not None:
        _fields(small, "polish", call("polish", lambda: small.polish(instances, own, 1)))
        ran.append("polish")
    if small.has("input_fields"):
        fields, titles = call("input_fields", lambda: small.input_fields(instances))
        if np.ndim(fields) != len(grid) + 1 or len(fields) != 1 or np.shape(fields)[1:] != tuple(grid):
            raise FamilyMismatch(f"problem.family: {family.name}.input_fields returned {list(np.shape(fields))} for "
                                 f"one instance on {list(grid)}; expected {[1, *grid]}")
        ran.append("input_fields")
    kind = call("loss", lambda: small.loss()).kind
    if kind == "residual":
        call("residual", lambda: _residual_is_the_loss(small, instances, label))
        ran.append("residual")
    if kind == "energy":
        call("hessian", lambda: _stencil_is_the_hessian(small, instances, label))
        ran.append("hessian")
    ratio = None
    if own is not None:
        ratio = call("loss_terms", lambda: stationarity(small, instances, own))
        if not ratio <= GRADIENT_TOLERANCE:
            raise FamilyMismatch(
                f"problem.family: the {family.name} family's loss and {solution} describe different problems: on one "
                f"instance ({label}) on {'x'.join(map(str, grid))}, the loss's gradient at that solution is "
                f"{ratio:.2g} of its gradient at the zero field (at most {GRADIENT_TOLERANCE:g} for a solution of the "
                "loss's own problem); check that loss_terms and the solver read the same coefficients and conditions")
    return SelfCheck(tuple(grid), label, ratio, solution or "", tuple(ran), time.perf_counter() - t0)
