"""Distributed L-BFGS: a global objective every rank agrees on, full-batch and multi-batch modes.

Every evaluation returns the loss and flat gradient of the *global* mean over a set of
sample indices, summed across ranks by one Allreduce, so all ranks hold bitwise the
same numbers and take the same decisions (line search, history, termination) without
any further communication.

* Full batch: the objective is fixed (the whole training set, or a fixed large batch),
  and ``torch.optim.LBFGS`` with its strong-Wolfe line search does the work, driven by a
  closure over that global objective.
* Multi-batch (Berahas, Nocedal & Takac, 2016): each iteration uses a new batch whose
  first ``overlap`` samples are the previous batch's last ones. The curvature pair is
  s = w_{k+1} - w_k and y = g_O(w_{k+1}) - g_O(w_k) on that overlap O, so the gradient
  difference measures curvature and not batch-to-batch noise; the step is a backtracking
  (Armijo) line search on the current batch. torch has no such mode.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

__all__ = ["GlobalObjective", "two_loop", "MultiBatchLBFGS", "multibatch_indices"]


class GlobalObjective:
    """f(w) = (1/|I|) sum_{i in I} l_i(w) over a global index set I, evaluated by all ranks.

    Parameters
    ----------
    params : list of torch.Tensor
        The parameters w (leaf tensors); gradients are written into their ``.grad``.
    local_sum : callable
        ``local_sum(indices)`` returns the sum of the per-sample losses l_i for those
        global sample indices, as a tensor connected to ``params``.
    comm : Communicator
        Ranks sharing the work; rank r takes the r-th of P near-equal contiguous parts
        of I (every index is used, whatever P).
    chunk : int
        Samples per forward/backward pass on a rank (bounds memory for a full batch).
    """

    def __init__(self, weights: list[torch.Tensor], local_sum: Callable[[np.ndarray], torch.Tensor], comm, chunk: int):
        self.weights = list(weights)
        self.local_sum = local_sum
        self.comm = comm
        self.chunk = max(1, int(chunk))
        self.evaluations = 0
        self.samples = 0
        self.reused = 0
        # The last gradient evaluation (indices, parameters, loss, gradient). torch's L-BFGS,
        # stepped one iteration at a time, starts each step by evaluating the point its line
        # search has just evaluated; returning that result saves one evaluation of the
        # objective per iteration (half the work when the first trial step is accepted).
        self._last: tuple[np.ndarray, torch.Tensor, float, torch.Tensor] | None = None

    def flat(self) -> torch.Tensor:
        """The parameters as one flat vector (a copy)."""
        return torch.cat([p.detach().reshape(-1) for p in self.weights])

    def assign(self, flat: torch.Tensor) -> None:
        """Set the parameters from a flat vector."""
        offset = 0
        with torch.no_grad():
            for p in self.weights:
                p.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()

    def __call__(self, indices: np.ndarray, grad: bool = True) -> tuple[float, torch.Tensor | None]:
        """Global mean loss over ``indices`` and, with ``grad``, its flat gradient (also left in ``.grad``)."""
        indices = np.asarray(indices)
        if grad and self._last is not None:
            idx, w, loss_value, g = self._last
            if np.array_equal(idx, indices) and torch.equal(w, self.flat()):
                self.reused += 1
                self._set_grad(g)
                return loss_value, g
        mine = np.array_split(indices, self.comm.size)[self.comm.rank]
        for p in self.weights:
            p.grad = None
        total = 0.0
        for start in range(0, len(mine), self.chunk):
            part = mine[start : start + self.chunk]
            if grad:
                loss = self.local_sum(part)
                loss.backward()
            else:
                with torch.no_grad():
                    loss = self.local_sum(part)
            total += float(loss.detach())
        self.evaluations += 1
        self.samples += len(indices)
        if not grad:
            buf = np.array([total])
            self.comm.allreduce_(buf)
            return float(buf[0]) / len(indices), None
        dtype = self.weights[0].dtype
        g = torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.weights]
            + [torch.tensor([total], dtype=dtype)]
        ).contiguous()
        self.comm.allreduce_(g)
        g /= len(indices)
        loss_value = float(g[-1])
        g = g[:-1]
        self._set_grad(g)
        self._last = (indices.copy(), self.flat(), loss_value, g)
        return loss_value, g

    def _set_grad(self, g: torch.Tensor) -> None:
        offset = 0
        for p in self.weights:
            p.grad = g[offset : offset + p.numel()].view_as(p)
            offset += p.numel()


def two_loop(g: torch.Tensor, s_hist: list[torch.Tensor], y_hist: list[torch.Tensor]) -> torch.Tensor:
    """H g by the L-BFGS two-loop recursion, H0 = (s'y / y'y) I from the newest pair.

    Returns the product (the search direction is its negative). With no history, g.
    """
    q = g.clone()
    rho = [1.0 / float(y.dot(s)) for s, y in zip(s_hist, y_hist)]
    alpha = []
    for s, y, r in zip(reversed(s_hist), reversed(y_hist), reversed(rho)):
        a = r * float(s.dot(q))
        alpha.append(a)
        q.add_(y, alpha=-a)
    if s_hist:
        q.mul_(float(s_hist[-1].dot(y_hist[-1])) / float(y_hist[-1].dot(y_hist[-1])))
    for s, y, r, a in zip(s_hist, y_hist, rho, reversed(alpha)):
        b = r * float(y.dot(q))
        q.add_(s, alpha=a - b)
    return q


def multibatch_indices(permutation: np.ndarray, k: int, batch: int, overlap: int) -> np.ndarray:
    """Batch k of a multi-batch sweep: consecutive batches share ``overlap`` samples.

    Batch k starts at k (batch - overlap) in the permutation (wrapping around), so its
    first ``overlap`` indices are batch k-1's last ones.
    """
    n = len(permutation)
    start = k * (batch - overlap)
    return permutation[(start + np.arange(batch)) % n]


class MultiBatchLBFGS:
    """Stochastic multi-batch L-BFGS over a :class:`GlobalObjective`.

    Parameters
    ----------
    objective : GlobalObjective
    history : int
        Curvature pairs kept.
    lr : float
        First trial step length of the backtracking line search.
    overlap : int
        Samples shared by consecutive batches (the curvature pairs use them).
    armijo : float
        Sufficient-decrease constant c1.
    max_backtracks : int
        Halvings of the step before the iteration gives up and takes no step.
    curvature_eps : float
        A pair is kept only if y's > eps |s| |y| (else the update would not stay positive definite).
    """

    def __init__(
        self,
        objective: GlobalObjective,
        history: int = 10,
        lr: float = 1.0,
        overlap: int = 8,
        armijo: float = 1e-4,
        max_backtracks: int = 10,
        curvature_eps: float = 1e-8,
    ) -> None:
        self.objective = objective
        self.history = history
        self.lr = lr
        self.overlap = overlap
        self.armijo = armijo
        self.max_backtracks = max_backtracks
        self.curvature_eps = curvature_eps
        self.s_hist: list[torch.Tensor] = []
        self.y_hist: list[torch.Tensor] = []
        self.prev_overlap_grad: torch.Tensor | None = None  # g_O(w_k) on this batch's last `overlap` samples
        self.prev_w: torch.Tensor | None = None
        self.n_iter = 0
        self.skipped_pairs = 0

    def _grad(self, batch: np.ndarray, split: int) -> tuple[float, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Loss and gradient on the batch, built from its head [:o], middle and tail [split:] parts."""
        o = self.overlap
        parts = (batch[:o], batch[o:split], batch[split:])
        results = [self.objective(p) if len(p) else (0.0, None) for p in parts]
        n = len(batch)
        loss = sum(r[0] * len(p) for r, p in zip(results, parts)) / n
        g = sum(r[1] * (len(p) / n) for r, p in zip(results, parts) if r[1] is not None)
        return loss, g, results[0][1], results[2][1]

    def step(self, batch: np.ndarray) -> dict[str, float]:
        """One iteration on ``batch`` (from :func:`multibatch_indices`); returns its statistics."""
        o = self.overlap
        if len(batch) < 2 * o + 1:
            raise ValueError(f"batch {len(batch)} must exceed twice the overlap {o}")
        w = self.objective.flat()
        loss, g, head_grad, tail_grad = self._grad(batch, len(batch) - o)
        # The head of this batch is the previous batch's tail: finish the previous pair.
        if self.prev_overlap_grad is not None and self.prev_w is not None:
            s, y = w - self.prev_w, head_grad - self.prev_overlap_grad
            sy = float(s.dot(y))
            if sy > self.curvature_eps * float(s.norm()) * float(y.norm()):
                self.s_hist.append(s)
                self.y_hist.append(y)
                if len(self.s_hist) > self.history:
                    self.s_hist.pop(0)
                    self.y_hist.pop(0)
            else:
                self.skipped_pairs += 1
        direction = -two_loop(g, self.s_hist, self.y_hist)
        slope = float(g.dot(direction))
        if slope >= 0:  # not a descent direction (cannot happen with y's > 0): restart
            self.s_hist.clear()
            self.y_hist.clear()
            direction, slope = -g, -float(g.dot(g))
        t = self.lr if self.s_hist else min(1.0, 1.0 / max(float(g.abs().sum()), 1e-300)) * self.lr
        accepted = False
        for _ in range(self.max_backtracks + 1):
            self.objective.assign(w + t * direction)
            trial, _ = self.objective(batch, grad=False)
            if trial <= loss + self.armijo * t * slope:
                accepted = True
                break
            t *= 0.5
        if not accepted:
            self.objective.assign(w)
            t = 0.0
        self.prev_w = w
        self.prev_overlap_grad = tail_grad
        self.n_iter += 1
        return {"loss": loss, "step_length": t, "grad_norm": float(g.norm()), "pairs": len(self.s_hist)}

    def state_dict(self) -> dict[str, object]:
        """State in the shape of ``torch.optim.Optimizer.state_dict`` (one state entry)."""
        state: dict[str, object] = {
            "s_hist": list(self.s_hist),
            "y_hist": list(self.y_hist),
            "prev_overlap_grad": self.prev_overlap_grad,
            "prev_w": self.prev_w,
            "n_iter": self.n_iter,
            "skipped_pairs": self.skipped_pairs,
        }
        group = {"history": self.history, "lr": self.lr, "overlap": self.overlap, "params": [0]}
        return {"state": {0: state}, "param_groups": [group]}

    def load_state_dict(self, sd: dict[str, object]) -> None:
        state = sd["state"].get(0, {})
        self.s_hist = list(state.get("s_hist", []))
        self.y_hist = list(state.get("y_hist", []))
        self.prev_overlap_grad = state.get("prev_overlap_grad")
        self.prev_w = state.get("prev_w")
        self.n_iter = int(state.get("n_iter", 0))
        self.skipped_pairs = int(state.get("skipped_pairs", 0))
