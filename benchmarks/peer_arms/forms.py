"""The strong forms a physics-informed network trains on, for the shipped 2-D Poisson KL and plane-elasticity
families (DeepXDE's ``pde(x, y)`` and boundary operators), with each instance's parameters as further inputs.

Each is written in its best-conditioned form, as a fair PINN expert would: the coefficient spans decades (nu or E
= exp of a KL sum), so the equation is divided by it and reads in its logarithm's gradient, which is smooth and
known in closed form (-div(nu grad u) = 0  ->  lap u + grad log nu . grad u = 0; div(E s(eps)) = 0  ->
div s + s grad log E = 0, s the stress per unit E). Dirichlet sides are exact by the output's form (DeepXDE's
``apply_output_transform``), the flux and traction sides penalised (DeepXDE's ``OperatorBC``).
The coefficient is the family's own (its KL roots and weights, :func:`diffnet.instances.kl.kl_modes`), the material
law the project's (:func:`diffnet.grid.material.lame`); a test checks both against the family's grid fields.
"""

from __future__ import annotations

import re

import numpy as np
import torch

from diffnet.grid.material import lame
from diffnet.instances.kl import kl_roots

__all__ = ["form_of", "PoissonForm", "ElasticityForm"]


class _KLForm:
    """What the two forms share: the inputs (x, y, then the instance's parameters, unless ``fixed`` holds one
    instance), the KL log-coefficient at points, and the held-out grid's points."""

    channels = 1

    def __init__(self, family, fixed: np.ndarray | None = None) -> None:
        if family.dims != 2 or getattr(family, "kl_modes", "diagonal") != "diagonal" or getattr(family, "constant", 0):
            raise ValueError(f"peers: the PINN is written for the 2-D diagonal KL family (got {family.describe()})")
        self.family = family
        self.terms, self.eta = family.kl_terms, family.eta
        w = kl_roots(self.eta, self.terms)
        self.omega = torch.tensor(w, dtype=torch.float32)
        # The family's weight lambda_i^{d/2} = lambda_i in 2-D (diffnet.families.kl_family.kl_log_field).
        self.weight = torch.tensor(2.0 * self.eta / (1.0 + (self.eta * w) ** 2), dtype=torch.float32)
        self.low, self.high = (v.ravel() for v in family.parameters.bounds())
        self.fixed = None if fixed is None else torch.tensor(np.asarray(fixed, dtype=np.float32)).reshape(1, -1)

    @property
    def box(self) -> tuple[list[float], list[float]]:
        """The inputs' box: the unit square, and the parameters' ranges for the parametric PINN."""
        if self.fixed is not None:
            return [0.0, 0.0], [1.0, 1.0]
        return [0.0, 0.0, *self.low], [1.0, 1.0, *self.high]

    def params(self, X: torch.Tensor) -> torch.Tensor:
        return X[:, 2:] if self.fixed is None else self.fixed.to(X).expand(X.shape[0], -1)

    def features(self, X: torch.Tensor) -> torch.Tensor:
        """Each input mapped to [-1, 1] (DeepXDE's ``apply_feature_transform``)."""
        centred = 2.0 * X[:, :2] - 1.0
        if self.fixed is not None:
            return centred
        low, high = (torch.tensor(v, dtype=X.dtype, device=X.device) for v in (self.low, self.high))
        return torch.cat([centred, 2.0 * (X[:, 2:] - low) / (high - low) - 1.0], dim=1)

    def log_coefficient(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """L = sum_i a_i lambda_i phi_i(x) phi_i(y) and its x and y derivatives at the points, each (n, 1)."""
        a = self.params(X)[:, : self.terms] * self.weight.to(X)
        w = self.omega.to(X)
        # phi = eta w cos(w s) + sin(w s) and phi' = w (cos(w s) - eta w sin(w s)) along each axis, its cosine and sine
        # taken once (this runs at every point of every PINN iteration).
        (phi_x, dphi_x), (phi_y, dphi_y) = (
            (self.eta * w * c + s, w * (c - self.eta * w * s))
            for c, s in ((torch.cos(t), torch.sin(t)) for t in (X[:, 0:1] * w, X[:, 1:2] * w)))
        return tuple((a * f * g).sum(1, keepdim=True) for f, g in ((phi_x, phi_y), (dphi_x, phi_y), (phi_x, dphi_y)))

    def grid_points(self, instances: np.ndarray) -> np.ndarray:
        """The family's nodes for each instance, (S * N_y * N_x, inputs), [y, x] order within an instance."""
        coords = self.family.coordinates()
        yy, xx = np.meshgrid(coords["y"], coords["x"], indexing="ij")
        xy = np.stack([xx.ravel(), yy.ravel()], axis=1)
        if self.fixed is not None:
            return np.tile(xy, (len(instances), 1)).astype(np.float32)
        rows = [np.hstack([xy, np.repeat(p[None], len(xy), axis=0)]) for p in np.asarray(instances, dtype=np.float64)]
        return np.concatenate(rows).astype(np.float32)

    def to_fields(self, values: np.ndarray, count: int) -> np.ndarray:
        """Values at :meth:`grid_points` -> fields (S, *grid) or (S, C, *grid)."""
        grid = tuple(self.family.resolution)
        v = np.asarray(values, dtype=np.float64).reshape(count, -1, self.channels)
        fields = np.moveaxis(v, 2, 1).reshape(count, self.channels, *grid)
        return fields[:, 0] if self.channels == 1 else fields


class PoissonForm(_KLForm):
    """-div(nu grad u) = 0, u = 1 at x = 0 and 0 at x = 1 (exact: u = 1 - x + x (1 - x) N), zero flux at y = 0, 1
    (penalised), as ``lap u + grad L . grad u = 0`` with L = log nu."""

    def __init__(self, family, fixed: np.ndarray | None = None) -> None:
        if family.sides != family.default_sides():
            raise ValueError("peers: the Poisson PINN is written for the shipped sides (u = 1 at x = 0, u = 0 at x = 1, "
                             f"zero flux at y = 0, 1); got {family.sides}")
        super().__init__(family, fixed)

    def output(self, X: torch.Tensor, N: torch.Tensor) -> torch.Tensor:
        x = X[:, 0:1]
        return 1.0 - x + x * (1.0 - x) * N

    def pde(self, X: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
        import deepxde as dde

        _, lx, ly = self.log_coefficient(X)
        u_x, u_y = dde.grad.jacobian(U, X, i=0, j=0), dde.grad.jacobian(U, X, i=0, j=1)
        return dde.grad.hessian(U, X, i=0, j=0) + dde.grad.hessian(U, X, i=1, j=1) + lx * u_x + ly * u_y

    def conditions(self, geometry) -> list:
        import deepxde as dde

        def flux(X, U, _):
            return dde.grad.jacobian(U, X, i=0, j=1)

        sides = lambda X, on: on and (np.isclose(X[1], 0.0) or np.isclose(X[1], 1.0))  # noqa: E731
        return [dde.icbc.OperatorBC(geometry, flux, sides)]


class ElasticityForm(_KLForm):
    """Plane elasticity div sigma = 0, sigma = E s(eps): clamped at x = 0 (exact: u = 4 |t| x N), the traction t at x = 1
    and free at y = 0, 1 (penalised, divided by E: s n = t / E), as ``div s + s grad log E = 0``."""

    channels = 2

    def __init__(self, family, fixed: np.ndarray | None = None) -> None:
        sides = {"x0": family.x0, "x1": family.x1, "y0": family.y0, "y1": family.y1}
        load = re.fullmatch(r"traction=([^,]+),([^,]+)", family.x1.replace(" ", ""))
        if sides["x0"].replace(" ", "") not in ("u=0", "u=0,0") or load is None or sides["y0"] != "free" \
                or sides["y1"] != "free" or family.pin != "none":
            raise ValueError("peers: the elasticity PINN is written for the shipped sides (x0 = 'u=0', x1 = "
                             f"'traction=T_X,T_Y', y0 = y1 = 'free'); got {sides}")
        super().__init__(family, fixed)
        self.traction = (float(load.group(1)), float(load.group(2)))
        self.plane = family.plane
        # The output's scale, as DeepXDE advises (outputs of order one): the square cantilever's tip deflection under
        # its end load at E = 1 (the KL field's median), P L^3 / (3 E I) = 4 |t| with L = H = 1, I = 1/12. Unscaled
        # (the network's outputs of order 0.1 against displacements up to 15), the parametric PINN stayed at 0.997.
        self.scale = 4.0 * max(abs(v) for v in self.traction)

    def output(self, X: torch.Tensor, N: torch.Tensor) -> torch.Tensor:
        return self.scale * X[:, 0:1] * N

    def _stress(self, X: torch.Tensor, U: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The stress per unit E, (s_xx, s_yy, s_xy), at the points."""
        import deepxde as dde

        lam, mu = lame(self.params(X)[:, -1:], self.plane)
        ux_x, ux_y = dde.grad.jacobian(U, X, i=0, j=0), dde.grad.jacobian(U, X, i=0, j=1)
        uy_x, uy_y = dde.grad.jacobian(U, X, i=1, j=0), dde.grad.jacobian(U, X, i=1, j=1)
        trace = lam * (ux_x + uy_y)
        return trace + 2 * mu * ux_x, trace + 2 * mu * uy_y, mu * (ux_y + uy_x)

    def pde(self, X: torch.Tensor, U: torch.Tensor) -> list[torch.Tensor]:
        import deepxde as dde

        _, lx, ly = self.log_coefficient(X)
        sxx, syy, sxy = self._stress(X, U)
        d = lambda s, j: dde.grad.jacobian(s, X, i=0, j=j)  # noqa: E731
        return [d(sxx, 0) + d(sxy, 1) + sxx * lx + sxy * ly, d(sxy, 0) + d(syy, 1) + sxy * lx + syy * ly]

    def conditions(self, geometry) -> list:
        import deepxde as dde

        def traction(component: int, free: bool):
            def residual(X, U, _):
                log_e, _, _ = self.log_coefficient(X)
                sxx, syy, sxy = self._stress(X, U)
                if free:
                    return (sxy, syy)[component]
                return (sxx, sxy)[component] - self.traction[component] * torch.exp(-log_e)
            return residual

        end = lambda X, on: on and np.isclose(X[0], 1.0)  # noqa: E731
        sides = lambda X, on: on and (np.isclose(X[1], 0.0) or np.isclose(X[1], 1.0))  # noqa: E731
        return [dde.icbc.OperatorBC(geometry, traction(c, False), end) for c in (0, 1)] + \
               [dde.icbc.OperatorBC(geometry, traction(c, True), sides) for c in (0, 1)]


def form_of(family, fixed: np.ndarray | None = None):
    """The strong form of ``family`` (its name decides), for the parametric PINN or, with ``fixed``, one instance."""
    forms = {"poisson": PoissonForm, "elasticity": ElasticityForm}
    if family.name not in forms:
        raise ValueError(f"peers: no PINN form for the family {family.name!r} (written: {', '.join(forms)})")
    return forms[family.name](family, fixed)
