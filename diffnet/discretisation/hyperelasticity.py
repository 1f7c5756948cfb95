"""A compressible Neo-Hookean solid on the Q1 grid: its stored energy, its Hessian (the tangent stiffness) as a
block stencil, and whether a displacement inverts an element.

The displacement u is nodal (S, d, *grid), components x first, as linear elasticity's
(:mod:`diffnet.discretisation.elasticity`); at each element's 2^d Gauss points F = I + ∇u, J = det F and

    W(F) = mu/2 (|F|² - d) - mu ln J + lambda/2 (ln J)²,

mu and lambda nodal (interpolated to the Gauss points), plane strain in 2-D (F₃₃ = 1, so |F|² - 2 there). At
F = I its Hessian is linear elasticity's: for small loads the solid is the linear one.

**The guard.** ln J has no value where J <= 0, and a network's early fields invert elements. Below
:data:`J_GUARD` the volumetric part f(J) = -mu ln J + lambda/2 (ln J)² is continued by its second-order
Taylor polynomial at J_GUARD: finite, twice differentiable and convex in J, growing as the element inverts, so a
loss is a number, a gradient pushes J back up, and no NaN ends a run. A solution whose J falls below the guard
anywhere is not the Neo-Hookean one: the references refuse it (:func:`smallest_jacobian`), the configuration
refuses a load that does so.

**Tangent.** With P = ∂W/∂F = mu F + f'(J) cof F and ∂J/∂F = cof F,

    ∂²W/∂F_iJ ∂F_kL = mu δ_ik δ_JL + f''(J) cof_iJ cof_kL + f'(J) ∂²J/∂F_iJ ∂F_kL,

∂²J = ε_ik ε_JL in 2-D and ε_ikm ε_JLn F_mn in 3-D: polynomial in F, no division by J. The element block (a, b)
at a Gauss point is sum_{J,L} w C_aJbL G_J G_Lᵀ, G_J the basis' x_J-derivatives there
(:func:`~diffnet.discretisation.energy.gauss_point_stencils`).
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from diffnet.discretisation.elasticity import displacement_gradients
from diffnet.discretisation.energy import at_gauss_points, gauss_point_stencils
from diffnet.grid.element import gauss_basis

__all__ = ["J_GUARD", "neo_hookean_energy", "neo_hookean_stencil", "smallest_jacobian", "cauchy_stress"]

# Where the volumetric energy's guard starts (J = det F): far below any Neo-Hookean solution the families accept.
J_GUARD = 0.1


def _deformation(u: torch.Tensor, spacing: tuple[float, ...]) -> list[list[torch.Tensor]]:
    """F = I + ∇u at every element's Gauss points: ``F[i][j]`` (S, Q, *cells)."""
    grad = displacement_gradients(u, spacing)
    dims = len(grad)
    return [[grad[i][j] + (1.0 if i == j else 0.0) for j in range(dims)] for i in range(dims)]


def _cofactor(F: list[list[torch.Tensor]]) -> tuple[torch.Tensor, list[list[torch.Tensor]]]:
    """det F and cof F (= ∂ det F / ∂F) per Gauss point."""
    if len(F) == 2:
        cof = [[F[1][1], -F[1][0]], [-F[0][1], F[0][0]]]
        return F[0][0] * F[1][1] - F[0][1] * F[1][0], cof
    cof = [[F[(i + 1) % 3][(j + 1) % 3] * F[(i + 2) % 3][(j + 2) % 3] - F[(i + 1) % 3][(j + 2) % 3] * F[(i + 2) % 3][(j + 1) % 3]
            for j in range(3)] for i in range(3)]
    return sum(F[0][j] * cof[0][j] for j in range(3)), cof


def _volumetric(J: torch.Tensor, mu: torch.Tensor, lam: torch.Tensor, order: int) -> list[torch.Tensor]:
    """f(J), and f'(J), f''(J) up to ``order``, of f = -mu ln J + lam/2 (ln J)², continued below J_GUARD by its
    Taylor polynomial there."""
    g = torch.as_tensor(J_GUARD, dtype=J.dtype, device=J.device)
    safe = torch.clamp(J, min=J_GUARD)  # ln of the guard where J is below it: no NaN in either branch's gradient
    log = torch.log(safe)
    f = -mu * log + 0.5 * lam * log**2
    f1 = (-mu + lam * log) / safe
    f2 = (mu + lam - lam * log) / safe**2
    below = J < g
    dj = torch.where(below, J - g, torch.zeros_like(J))
    out = [f + f1 * dj + 0.5 * f2 * dj**2]
    if order >= 1:
        out.append(torch.where(below, f1 + f2 * dj, f1))
    if order >= 2:
        out.append(f2)  # constant below the guard: the quadratic continuation's
    return out


def _moduli(shear: torch.Tensor, nu: torch.Tensor, values: np.ndarray, dims: int) -> tuple[torch.Tensor, torch.Tensor]:
    """mu and lambda at the Gauss points (S, Q, *cells) of a nodal shear modulus (S, *grid) and Poisson ratios (S,)."""
    mu = at_gauss_points(shear, values)
    ratio = (2.0 * nu / (1.0 - 2.0 * nu)).reshape(-1, *([1] * (dims + 1)))
    return mu, ratio * mu


def neo_hookean_energy(u: torch.Tensor, shear: torch.Tensor, nu: torch.Tensor | float,
                       spacing: tuple[float, ...]) -> torch.Tensor:
    """The stored energy ∫ W(F) per sample (S,) of displacements u (S, d, *grid).

    Parameters
    ----------
    u : torch.Tensor
        Nodal displacements, components x first.
    shear : torch.Tensor
        Nodal shear modulus mu (S, *grid), positive.
    nu : torch.Tensor or float
        Poisson ratio (per sample (S,) or one), in (-1, 1/2): lambda = 2 mu nu / (1 - 2 nu).
    spacing : tuple of float
        Node spacings, x first.
    """
    dims = u.ndim - 2
    values, *_, w = gauss_basis(*spacing)
    F = _deformation(u, spacing)
    J, _ = _cofactor(F)
    mu, lam = _moduli(shear.to(u.dtype), torch.as_tensor(nu, dtype=u.dtype, device=u.device), values, dims)
    (f,) = _volumetric(J, mu, lam, 0)
    stretch = sum(F[i][j] ** 2 for i in range(dims) for j in range(dims)) - dims
    return w * (0.5 * mu * stretch + f).flatten(1).sum(1)


def neo_hookean_stencil(u: torch.Tensor, shear: torch.Tensor, nu: torch.Tensor | float,
                        spacing: tuple[float, ...]) -> torch.Tensor:
    """The Hessian of :func:`neo_hookean_energy` at u, the tangent stiffness, as a block stencil (S, d, d, 3^d, *grid)."""
    dims = u.ndim - 2
    values, *grads, w = gauss_basis(*spacing)
    F = _deformation(u, spacing)
    J, cof = _cofactor(F)
    mu, lam = _moduli(shear.to(u.dtype), torch.as_tensor(nu, dtype=u.dtype, device=u.device), values, dims)
    _, f1, f2 = _volumetric(J, mu, lam, 2)
    zero = torch.zeros_like(J)
    moduli = []  # C[a, J, b, L] at the Gauss points, (a, b) outer, (J, L) inner
    for a, b in itertools.product(range(dims), repeat=2):
        for j, l in itertools.product(range(dims), repeat=2):
            c = f2 * cof[a][j] * cof[b][l] + f1 * _second_jacobian(F, a, j, b, l, zero)
            if a == b and j == l:
                c = c + mu
            moduli.append(c)
    field = torch.stack(moduli, dim=1).reshape(u.shape[0], dims * dims, dims * dims, *J.shape[1:])
    g = np.stack(grads)  # (d, Q, nodes)
    pairs = w * np.einsum("jqm,lqn->jlqmn", g, g).reshape(dims * dims, *g.shape[1:], g.shape[-1])
    stencil = gauss_point_stencils(field, pairs)
    return stencil.reshape(u.shape[0], dims, dims, *stencil.shape[2:])


def _second_jacobian(F: list[list[torch.Tensor]], i: int, j: int, k: int, l: int, zero: torch.Tensor) -> torch.Tensor:
    """∂² det F / ∂F_ij ∂F_kl: ε_ik ε_jl in 2-D, ε_ikm ε_jln F_mn in 3-D."""
    if len(F) == 2:
        sign = _levi_civita((i, k)) * _levi_civita((j, l))
        return zero + sign if sign else zero
    out = zero
    for m, n in itertools.product(range(3), repeat=2):
        sign = _levi_civita((i, k, m)) * _levi_civita((j, l, n))
        if sign:
            out = out + sign * F[m][n]
    return out


def _levi_civita(index: tuple[int, ...]) -> int:
    """The permutation symbol of ``index``: 0 with a repeated entry, else the sign of its inversions."""
    if len(set(index)) < len(index):
        return 0
    return -1 if sum(a > b for a, b in itertools.combinations(index, 2)) % 2 else 1


def smallest_jacobian(u: torch.Tensor, spacing: tuple[float, ...]) -> torch.Tensor:
    """min det F over every element's Gauss points, per sample (S,): at or below 0 the displacement inverts an
    element; below :data:`J_GUARD` the energy is the guard's, not the solid's."""
    J, _ = _cofactor(_deformation(u, spacing))
    return J.flatten(1).amin(dim=1)


def cauchy_stress(grad: list[list[np.ndarray]], mu: np.ndarray, lam: np.ndarray) -> list[np.ndarray]:
    """The Cauchy stress σ = (1/J) P Fᵀ = mu/J (F Fᵀ - I) + lambda ln J / J I of the Neo-Hookean energy above, for a
    displacement gradient ``grad[i][j]`` = du_i/dx_j (numpy arrays or torch tensors of one shape) and moduli of that shape: in 2-D
    (plane strain, F₃₃ = 1) σ_xx, σ_yy, σ_zz, σ_xy; in 3-D the six of
    :data:`~diffnet.grid.material.SYMMETRIC`'s order. At F = I + ε it is linear elasticity's to first order."""
    dims = len(grad)
    F = [[grad[i][j] + (1.0 if i == j else 0.0) for j in range(dims)] for i in range(dims)]
    J = F[0][0] * F[1][1] - F[0][1] * F[1][0] if dims == 2 else \
        sum(F[0][j] * (F[1][(j + 1) % 3] * F[2][(j + 2) % 3] - F[1][(j + 2) % 3] * F[2][(j + 1) % 3]) for j in range(3))
    log = torch.log(J.clamp_min(J_GUARD)) if isinstance(J, torch.Tensor) else np.log(np.maximum(J, J_GUARD))
    volumetric = lam * log / J

    def b(i: int, j: int) -> np.ndarray:  # (F Fᵀ)_ij
        return sum(F[i][k] * F[j][k] for k in range(dims))

    normal = lambda i: mu / J * (b(i, i) - 1.0) + volumetric  # noqa: E731
    if dims == 2:
        return [normal(0), normal(1), volumetric, mu / J * b(0, 1)]
    return [normal(0), normal(1), normal(2), mu / J * b(0, 1), mu / J * b(1, 2), mu / J * b(0, 2)]
