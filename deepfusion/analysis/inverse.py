"""Inverse problems: the instance that explains observations, through a trained surrogate or the classical solver.

The posterior of the instance p given observations d_j = y_j(p) + noise (independent Gaussian, standard deviations
σ_j) and the prior of the family's own distribution (:class:`Prior`):

    Φ(p) = ½ Σ_j ((y_j(p) - d_j) / σ_j)² - log π(p),

with y_j(p) the observed field (an unknown, or a derived field such as a flux) read at the observation's point. A
forward model is a function of a batch of instances (S, *shape) to their predictions (S, P), differentiable in them:
the surrogate's exact gradients (:meth:`deepfusion.surrogate.Surrogate.evaluate`) or the classical solve of the
grid's system with its adjoint (:class:`ClassicalSolve`: the same implicit-function-theorem term as the surrogate's
correction, with V = I). A family that is not differentiable in its instances (the plate, whose cut geometry moves
with the hole) gets its gradients by central differences of either side's values (:func:`differenced_forward`).

* **MAP** (:func:`map_estimate`): L-BFGS from several starts at once, each its own minimisation, their
  evaluations one batched forward and backward (:mod:`deepfusion.analysis.minimise`), inside the training range
  (the surrogate's is where it was trained; the classical side searches the same box).
* **Laplace** (:func:`laplace`): the Gauss-Newton Hessian Jᵀ Σ⁻¹ J (+ the prior's) at the MAP, its inverse the
  covariance; directions the data do not see (an eigenvalue below 1e-10 of the largest) are counted and left at
  the prior's spread.
* **MCMC**: :mod:`deepfusion.analysis.mcmc`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

__all__ = ["Prior", "prior_of", "surrogate_forward", "classical_forward", "ClassicalSolve", "WarmStarts",
           "CentralDifferences", "differenced_forward", "objective",
           "MapResult", "map_estimate", "jacobian", "laplace", "parameter_names"]

Forward = Callable[[torch.Tensor], torch.Tensor]


def parameter_names(family) -> list[str]:
    """The name of every entry of the family's parameter, in its order (``a_1``, ..., or ``hole_x``, ...)."""
    spec = family.parameters
    return [spec.entry(index) for index in np.ndindex(*spec.shape)] if spec.shape else [spec.name]


@dataclass(frozen=True)
class Prior:
    """The prior of the instances: ``uniform`` on the box [low, high] or a standard ``normal`` per entry (the KL
    families' coefficients), searched inside the box either way (the surrogate's training range)."""

    kind: str
    low: np.ndarray
    high: np.ndarray

    def neg_log(self, p: torch.Tensor) -> torch.Tensor:
        """-log π(p) up to a constant, per instance (S,)."""
        flat = p.reshape(len(p), -1)
        return 0.5 * flat.square().sum(1) if self.kind == "normal" else flat.new_zeros(len(p))

    def hessian(self, m: int) -> np.ndarray:
        return np.eye(m) if self.kind == "normal" else np.zeros((m, m))

    def draw(self, n: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        if self.kind == "normal":
            return np.clip(rng.standard_normal((n, *self.low.shape)), self.low, self.high)
        return rng.uniform(self.low, self.high, (n, *self.low.shape))

    def inside(self, p: np.ndarray) -> np.ndarray:
        flat = p.reshape(len(p), -1)
        return ((flat >= self.low.reshape(-1)) & (flat <= self.high.reshape(-1))).all(1)


def prior_of(family, kind: str) -> Prior:
    """The family's own law ``kind`` (one of ``parameters.distributions``) as a prior on its training range."""
    spec = family.parameters
    if kind not in spec.distributions:
        raise ValueError(f"--prior: the {family.name} family draws its instances from {', '.join(spec.distributions)} "
                         f"(got {kind!r})")
    low, high = spec.bounds()
    return Prior(kind, np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64))


def surrogate_forward(surrogate, observations) -> Forward:
    """The surrogate's predictions of ``observations``: its fields, or what is derived from them, read at their points
    (:func:`~deepfusion.analysis.observations.predict`), differentiable: exactly, or by central differences where
    the surrogate has no exact gradients (:attr:`~deepfusion.surrogate.Surrogate.exact_gradients`:
    :func:`differenced_forward`)."""
    from deepfusion.analysis.observations import predict

    family = surrogate.family
    weights = observations.weights(tuple(family.resolution))
    if not surrogate.exact_gradients:
        return differenced_forward(lambda p: predict(family, observations, p, surrogate.fields(surrogate.instances(p)),
                                                     weights), prior_of(family, "uniform"))
    return lambda p: predict(family, observations, p, surrogate.evaluate(p), weights)


@dataclass
class WarmStarts:
    """The last ``size`` solved instances and their fields: each new instance's solve starts from the field of its
    nearest one (distance in units of the prior box's width), as a classical inverse solver would (a chain's
    proposal, a line search's trial lie near an instance already solved). The families whose ``discrete_optimum``
    iterates use it (Newton on the Neo-Hookean plate 64² from a neighbour's field: 3 steps, 0.20 s, against 8 steps,
    0.49 s); a direct solve ignores it. ``size`` 0 for a family whose optimum depends on its start
    (``unique_optimum`` False: Burgers' roots). The window keeps the ``size`` fields used or solved last: a start
    moves to its newest end when used, so each chain's state, the start of its every proposal, stays in it however
    long the chain stays put (with the last ``size`` solves alone, 16 chains at a few per cent acceptance lost their
    states: 355 ms a solve on the plate where a neighbour's start takes 196 ms)."""

    scale: np.ndarray
    size: int = 64
    instances: np.ndarray | None = None
    fields: np.ndarray | None = None

    def solve(self, family, instances: np.ndarray) -> np.ndarray:
        """``family.discrete_optimum`` of ``instances`` (S, *shape) from the nearest kept fields; again from its own
        start where a warm-started one is not a root."""
        flat = instances.reshape(len(instances), -1)
        initial = None
        if self.instances is not None and self.size:
            distance = (((flat[:, None, :] - self.instances[None]) / self.scale) ** 2).sum(-1)
            nearest = distance.argmin(1)
            initial = self.fields[nearest]
            used = np.unique(nearest)
            order = np.concatenate([np.setdiff1d(np.arange(len(self.instances)), used), used])
            self.instances, self.fields = self.instances[order], self.fields[order]
        fields, roots = family.discrete_optimum(instances, initial=initial)
        fields = np.asarray(fields, dtype=np.float64)
        if initial is not None and not np.all(roots):
            fields[~roots] = np.asarray(family.discrete_optimum(instances[~roots])[0], dtype=np.float64)
        kept = (flat, fields) if self.instances is None else (np.concatenate([self.instances, flat]),
                                                           np.concatenate([self.fields, fields]))
        self.instances, self.fields = kept[0][-self.size:], kept[1][-self.size:]
        return fields


class ClassicalSolve(torch.autograd.Function):
    """The grid's own solution u_h(p) (the family's ``discrete_optimum``: the minimiser of its energy on this grid,
    from :class:`WarmStarts`) forward; backward the adjoint (:func:`diffnet.multigrid.sensitivity.minimiser_vjp`, each
    solve a sparse Cholesky of the Hessian at u_h)."""

    @staticmethod
    def forward(ctx, instances: torch.Tensor, family, counter: list, warm: WarmStarts) -> torch.Tensor:
        fields = warm.solve(family, instances.detach().cpu().numpy())
        counter[0] += len(instances)
        ctx.family, ctx.counter = family, counter
        u = torch.as_tensor(np.asarray(fields, dtype=np.float64))
        ctx.save_for_backward(instances.detach(), u)
        return u

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        from diffnet.multigrid.sensitivity import minimiser_vjp
        from diffnet.solvers.cholesky import cholesky_solve

        instances, u = ctx.saved_tensors
        ctx.counter[1] += len(u)
        return (minimiser_vjp(ctx.family, u, instances.double(), grad, cholesky_solve).to(instances.dtype),
                None, None, None)


def classical_forward(family, observations, counter: list | None = None) -> Forward:
    """The classical solve's predictions of ``observations`` with adjoint gradients (:class:`ClassicalSolve`), or by
    central differences where the family is not ``differentiable`` (:func:`differenced_forward`), each solve warm
    started (:class:`WarmStarts`); ``counter`` [forward solves, adjoint solves], counted as they happen."""
    from deepfusion.analysis.observations import predict

    counter = counter if counter is not None else [0, 0]
    weights = observations.weights(tuple(family.resolution))
    box = prior_of(family, "uniform")
    warm = WarmStarts((box.high - box.low).reshape(-1), size=64 if family.unique_optimum else 0)
    if not family.has("differentiable"):
        def values(p: np.ndarray) -> np.ndarray:
            counter[0] += len(p)
            return predict(family, observations, p, warm.solve(family, p), weights)

        return differenced_forward(values, box)
    return lambda p: predict(family, observations, p.double(),
                             ClassicalSolve.apply(p.double(), family, counter, warm), weights)


class CentralDifferences(torch.autograd.Function):
    """Predictions (S, P) of ``values`` (numpy (S', m) -> (S', P)) forward; when a gradient is wanted, the Jacobian by
    central differences in the same batch (the 2m + 1 instances of each point), kept for the backward pass. At the
    prior's bounds the stencil is one-sided (p ± h clipped into the box; the difference divided by the clipped
    width): instances outside the training range are never asked for."""

    @staticmethod
    def forward(ctx, instances: torch.Tensor, values: Callable, steps: np.ndarray, low: np.ndarray,
                high: np.ndarray) -> torch.Tensor:
        p = instances.detach().cpu().numpy().reshape(len(instances), -1)
        ctx.shape = instances.shape
        if not instances.requires_grad:
            return torch.as_tensor(np.asarray(values(p.reshape(instances.shape)), dtype=np.float64))
        s, m = p.shape
        shifted = p[:, None, :] + np.eye(m) * steps                      # (S, m, m): entry i moved by its step
        plus = np.minimum(shifted, high)
        minus = np.maximum(p[:, None, :] - np.eye(m) * steps, low)
        out = np.asarray(values(np.concatenate([p, plus.reshape(-1, m), minus.reshape(-1, m)]).reshape(
            -1, *instances.shape[1:])), dtype=np.float64)
        width = (np.einsum("sii->si", plus) - np.einsum("sii->si", minus))[:, :, None]  # (S, m, 1)
        ctx.save_for_backward(torch.as_tensor((out[s:s + s * m].reshape(s, m, -1) - out[s + s * m:].reshape(s, m, -1))
                                              / width))
        return torch.as_tensor(out[:s])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (jac,) = ctx.saved_tensors  # (S, m, P)
        shape = ctx.shape  # the instances' own shape: (S,) for a scalar instance (a Reynolds number), (S, m) else
        return torch.einsum("smp,sp->sm", jac, grad.to(jac.dtype)).reshape(shape), None, None, None, None


def differenced_forward(values: Callable[[np.ndarray], np.ndarray], prior: Prior, step: float = 1e-3) -> Forward:
    """A forward whose gradients are central differences of ``values`` (numpy instances (S, *shape) -> predictions
    (S, P); the surrogate's or the classical solve's) with steps of ``step`` times the prior box's width per entry
    (1e-3: the float32 network's rounding, ~1e-7, stays 1e-4 of the difference; the stencil spans a fraction of a
    cell for a hole's position): 2m + 1 evaluations per gradient, in one batch (:class:`CentralDifferences`)."""
    low, high = prior.low.reshape(-1), prior.high.reshape(-1)
    steps = step * (high - low)
    return lambda p: CentralDifferences.apply(p.double(), values, steps, low, high)


def objective(forward: Forward, observations, prior: Prior, p: torch.Tensor) -> torch.Tensor:
    """Φ per instance (S,): half the squared misfit in units of σ plus the prior's -log."""
    values = torch.as_tensor(observations.values)
    sigma = torch.as_tensor(observations.sigma)
    return 0.5 * ((forward(p) - values) / sigma).square().sum(1) + prior.neg_log(p)


@dataclass
class MapResult:
    """The MAP of several starts: ``map`` the best one's instance, ``objective`` its Φ, ``misfit_rms`` its root-mean-
    square misfit in units of σ; per start its end, Φ there and at the start; the forward evaluations (instances)
    and seconds."""

    map: np.ndarray
    objective: float
    misfit_rms: float
    ends: np.ndarray
    objectives: np.ndarray
    initial: np.ndarray
    evaluations: int
    seconds: float
    message: str
    iterations: int
    extra: dict = field(default_factory=dict)


def map_estimate(forward: Forward, observations, prior: Prior, starts: np.ndarray, max_iterations: int = 200,
                 progress: Callable[[int, float], None] | None = None) -> MapResult:
    """The MAP by L-BFGS from each of ``starts`` (S, *shape) inside the prior's box, all starts' evaluations batched
    (:func:`deepfusion.analysis.minimise.minimise_batched`), each gradient exact; ``progress(iteration, best Φ)``
    after each iteration."""
    from deepfusion.analysis.minimise import minimise_batched

    shape = starts.shape[1:]

    def value_and_gradient(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        p = torch.tensor(x.reshape(-1, *shape), dtype=torch.float64, requires_grad=True)
        phi = objective(forward, observations, prior, p)
        (grad,) = torch.autograd.grad(phi.sum(), p)
        return phi.detach().numpy().astype(np.float64), grad.numpy().reshape(len(x), -1).astype(np.float64)

    t0 = time.perf_counter()
    result = minimise_batched(value_and_gradient, starts.reshape(len(starts), -1), prior.low.reshape(-1),
                              prior.high.reshape(-1), max_iterations,
                              progress=None if progress is None else lambda it, f: progress(it, float(f.min())))
    seconds = time.perf_counter() - t0
    ends = result.x.reshape(starts.shape)
    best = int(np.argmin(result.f))
    with torch.no_grad():
        residual = (forward(torch.as_tensor(ends[best:best + 1]))[0].numpy() - observations.values) / observations.sigma
    return MapResult(ends[best], float(result.f[best]), float(np.sqrt(np.mean(residual**2))), ends, result.f,
                     result.initial, result.evaluations + 1, seconds, result.reasons[best], int(result.iterations[best]))


def jacobian(forward: Forward, p: np.ndarray, copies: bool = True, chunk: int | None = None) -> np.ndarray:
    """d predictions / d p at one instance p (*shape): (P, m). With ``copies`` batched forwards of copies of p, ``chunk``
    at a time (default: all P), and one backward pass each (row j the gradient of copy j's prediction j: a surrogate's
    batch is cheap); else one forward and a backward pass per observation (a classical solve per copy would be
    wasted)."""
    if copies:
        count = len(forward(torch.as_tensor(p[None], dtype=torch.float64)).detach()[0])
        step = count if chunk is None else chunk
        rows = []
        for start in range(0, count, step):
            n = min(step, count - start)
            x = torch.tensor(np.repeat(p[None], n, axis=0), dtype=torch.float64, requires_grad=True)
            picked = forward(x)[torch.arange(n), torch.arange(start, start + n)]
            (grad,) = torch.autograd.grad(picked.sum(), x)
            rows.append(grad.reshape(n, -1).numpy())
        return np.concatenate(rows)
    x = torch.tensor(p[None], dtype=torch.float64, requires_grad=True)
    y = forward(x)[0]
    rows = [torch.autograd.grad(y[j], x, retain_graph=j < len(y) - 1)[0].reshape(-1) for j in range(len(y))]
    return torch.stack(rows).numpy()


def laplace(forward: Forward, observations, prior: Prior, p_map: np.ndarray, copies: bool = True) -> dict:
    """The Laplace approximation at ``p_map``: ``covariance`` (m, m) of the Gauss-Newton Hessian's inverse, ``std``
    (m,), ``unidentified`` the directions the data do not see, ``hessian`` (m, m), ``jacobian`` (P, m)
    (:func:`jacobian`'s ``copies``). No direction's variance exceeds the prior's (uniform: width² / 12 on the box;
    normal: 1), so a direction the data barely see keeps the prior's spread rather than an unbounded one."""
    J = jacobian(forward, p_map, copies)
    m = J.shape[1]
    H = J.T @ (J / observations.sigma[:, None] ** 2) + prior.hessian(m)
    values, vectors = np.linalg.eigh(H)
    seen = values > 1e-10 * max(values.max(), 1e-300)
    widest = float(((prior.high - prior.low).reshape(-1) ** 2 / 12.0).mean()) if prior.kind == "uniform" else 1.0
    inverse = np.where(seen, np.minimum(1.0 / np.where(seen, values, 1.0), widest), widest)
    covariance = (vectors * inverse) @ vectors.T
    return {"covariance": covariance, "std": np.sqrt(np.diag(covariance)), "unidentified": int((~seen).sum()),
            "hessian": H, "jacobian": J}
