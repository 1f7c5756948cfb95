"""The Karhunen-Loève expansion of the exponential covariance exp(-|s - t| / eta) on [0, 1]: its
eigenpairs (the roots of a transcendental equation) and the tensor-product basis of the
log-diffusivity in 2-D and 3-D.

The eigenvalues decay like 1 / (eta w_i)^2; a product over d axes of modes weighted by lambda_i^p
keeps the field's variance finite as d grows only for p >= d / 2 (2-D: p = 1, 3-D: 3/2; with
p = 1 in 3-D the diffusivity spans 15 decades at 33^3).
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np
from scipy.optimize import brentq

__all__ = ["kl_roots", "kl_modes", "kl_basis"]


def kl_roots(eta: float, m: int) -> np.ndarray:
    """The first m positive roots of tan(w) = 2 eta w / (eta^2 w^2 - 1).

    Written without poles as g(w) = (eta^2 w^2 - 1) sin w - 2 eta w cos w, which changes
    sign once in (0, pi) and once in every (k pi, (k+1) pi); each root is bracketed
    there and found by Brent's method.
    """
    if not (eta > 0 and m >= 1):
        raise ValueError(f"need eta > 0 and m >= 1, got eta={eta}, m={m}")

    def g(w: float) -> float:
        return (eta * eta * w * w - 1.0) * np.sin(w) - 2.0 * eta * w * np.cos(w)

    roots = []
    for k in range(m):
        lo, hi = (k * np.pi, (k + 1) * np.pi)
        lo = max(lo, 1e-9)  # g(0) = 0 is not a root of the eigenproblem
        roots.append(brentq(g, lo + 1e-12 * hi, hi, xtol=1e-14, rtol=1e-15))
    return np.asarray(roots)


def kl_modes(eta: float, m: int, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues lambda_i = 2 eta / (1 + (eta w_i)^2) and modes phi_i(s) = eta w_i cos(w_i s) + sin(w_i s).

    Returns ``lam`` (m,) and ``phi`` (m, len(s)).
    """
    w = kl_roots(eta, m)
    s = np.asarray(s, dtype=np.float64)
    lam = 2.0 * eta / (1.0 + (eta * w) ** 2)
    phi = eta * w[:, None] * np.cos(w[:, None] * s[None, :]) + np.sin(w[:, None] * s[None, :])
    return lam, phi


def kl_basis(eta: float, m: int, axes: Sequence[np.ndarray], exponent: float, tensor: bool = False) -> np.ndarray:
    """lambda_i^exponent prod_k phi_i(s_k) on the tensor grid of ``axes`` (outermost first),
    shape (m, len(axes[0]), ..., len(axes[-1])).

    The factors multiply in the order given (the weight, then each axis outermost first), the
    order the 2-D and 3-D families always used, so their fields are unchanged bit for bit.

    ``tensor``: the separable covariance's own modes instead, prod_k phi_{i_k}(s_k) for the m multi-indices
    (i_1, ..., i_d) of largest eigenvalue prod_k lambda_{i_k} (ties in index order), weighted by that eigenvalue to
    the power ``exponent / d`` (so the diagonal modes keep their weights). The diagonal basis makes every field
    point-symmetric (a KL Poisson instance's head h then satisfies h(x, y) + h(1 - x, 1 - y) = 1); these do not.
    """
    d = len(axes)
    if tensor:
        modes = [kl_modes(eta, m, s) for s in axes]
        lam, phis = modes[0][0], [phi for _, phi in modes]  # the eigenvalues do not depend on the axis
        chosen = sorted(itertools.product(range(m), repeat=d), key=lambda ix: (-np.prod(lam[list(ix)]), ix))[:m]
        out = np.empty((m, *(len(s) for s in axes)))
        for n, ix in enumerate(chosen):
            mode = np.prod(lam[list(ix)]) ** (exponent / d)
            for k, (i, phi) in enumerate(zip(ix, phis)):
                mode = mode * phi[i].reshape((1,) * k + (-1,) + (1,) * (d - 1 - k))
            out[n] = mode
        return out
    out = None
    for k, s in enumerate(axes):
        lam, phi = kl_modes(eta, m, s)  # the eigenvalues do not depend on the axis
        if out is None:
            out = (lam**exponent).reshape((m,) + (1,) * d)
        out = out * phi.reshape((m,) + (1,) * k + (len(s),) + (1,) * (d - 1 - k))
    return out
