"""Posterior samples by Markov chain Monte Carlo: batched random-walk Metropolis chains, preconditioned by the
Laplace covariance, and their effective sample size.

The chains run together (one batched forward per step, no gradient), each proposing x' = x + L z with L Lᵀ the
Laplace covariance scaled by 2.38² / m (Roberts, Gelman & Gilks' optimal scaling for a Gaussian target, about 23 %
acceptance in high dimensions) and the prior's box enforced by rejection. The effective sample size per entry is
Geyer's initial positive sequence estimator on the chains' mean autocorrelation (the estimator of Stan and ArviZ).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

__all__ = ["Chains", "metropolis", "effective_sample_size"]


@dataclass
class Chains:
    """``samples`` (K chains, N steps, m); ``accepted`` (K,) the share of proposals each chain took; ``evaluations``
    the forward evaluations (instances)."""

    samples: np.ndarray
    accepted: np.ndarray
    evaluations: int

    def kept(self, burn_in: int) -> np.ndarray:
        """The samples after ``burn_in`` steps of every chain, (K (N - burn_in), m)."""
        return self.samples[:, burn_in:].reshape(-1, self.samples.shape[2])


def metropolis(log_posterior: Callable[[np.ndarray], np.ndarray], starts: np.ndarray, covariance: np.ndarray,
               steps: int, inside: Callable[[np.ndarray], np.ndarray], seed: int = 0,
               progress: Callable[[int, float], None] | None = None) -> Chains:
    """``steps`` random-walk Metropolis steps of K chains from ``starts`` (K, m): ``log_posterior`` of a batch
    (K', m) -> (K',), up to a constant; ``inside`` (K', m) -> bool, the prior's support; ``progress(step, acceptance)``
    now and then."""
    rng = np.random.default_rng(seed)
    k, m = starts.shape
    scale = 2.38 / np.sqrt(m)
    values, vectors = np.linalg.eigh(0.5 * (covariance + covariance.T))
    root = vectors * np.sqrt(np.clip(values, 0.0, None)) * scale
    x = starts.astype(np.float64).copy()
    lp = log_posterior(x)
    evaluations = k
    out = np.empty((k, steps, m))
    accepted = np.zeros(k)
    report = max(1, steps // 20)
    for t in range(steps):
        proposal = x + rng.standard_normal((k, m)) @ root.T
        ok = inside(proposal)
        lp_new = np.full(k, -np.inf)
        if ok.any():
            lp_new[ok] = log_posterior(proposal[ok])
            evaluations += int(ok.sum())
        take = np.log(rng.random(k)) < lp_new - lp
        x[take], lp[take] = proposal[take], lp_new[take]
        accepted += take
        out[:, t] = x
        if progress is not None and ((t + 1) % report == 0 or t + 1 == steps):
            progress(t + 1, float(accepted.sum() / (k * (t + 1))))
    return Chains(out, accepted / steps, evaluations)


def effective_sample_size(samples: np.ndarray) -> np.ndarray:
    """Per entry, the effective number of independent samples of chains (K, N, m): K N / (2 Σ Γ_i - 1), Γ_i =
    ρ_2i + ρ_2i+1 the pairs of the chains' mean autocorrelation, summed while positive (Geyer 1992); NaN for an entry
    no chain moved in (no proposal accepted: nothing to estimate)."""
    k, n, m = samples.shape
    centred = samples - samples.mean(axis=1, keepdims=True)
    size = 1 << int(np.ceil(np.log2(2 * n)))
    spectrum = np.fft.rfft(centred, n=size, axis=1)
    auto = np.fft.irfft(spectrum * np.conj(spectrum), n=size, axis=1)[:, :n].real  # (K, N, m)
    variance = auto[:, :1]
    rho = np.where(variance > 0, auto / np.where(variance > 0, variance, 1.0), 0.0).mean(axis=0)  # (N, m)
    out = np.full(m, np.nan)
    for j in range(m):
        if not (variance[:, 0, j] > 0).any():
            continue
        total = 0.0  # Σ of the pairs Γ_i = ρ_2i + ρ_2i+1 while positive
        for t in range(0, n - 1, 2):
            pair = rho[t, j] + rho[t + 1, j]
            if pair <= 0:
                break
            total += pair
        out[j] = k * n / max(2.0 * total - 1.0, 1e-12)
    return out
