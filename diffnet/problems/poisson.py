"""Poisson family -div(nu grad u) = 0 with a Karhunen-Loeve log-diffusivity, and that KL family."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from diffnet.classical import Q1Classical
from diffnet.constants import constant
from diffnet.energy import dirichlet_energy, dirichlet_stencil
from diffnet.family import Family, ParameterSpec
from diffnet.kl import kl_basis, kl_modes, kl_roots
from diffnet.options import integer_in, interval, option, positive
from diffnet.tiling import axis_coordinates, element_sum, zero_boundary

__all__ = [
    "kl_roots",
    "kl_modes",
    "KLOptions",
    "KLCoefficients",
    "KLFamily",
    "LiftedEnergy",
    "PoissonProblem",
]


@dataclass(frozen=True)
class KLOptions:
    """``[poisson]``: the Karhunen-Loève diffusivity family and the evaluation's reference."""

    kl_terms: int = option(6, "m, KL terms", integer_in(1, 64))
    kl_eta: float = option(0.5, "correlation length η (the roots ω_i are computed for any η)", positive)
    coeff_range: tuple[float, ...] = option((-3.0, 3.0), "range of each coefficient a_i", interval)
    # The independent reference is the Q1 FEM on a grid with this many times the intervals
    # in each direction (its nodes include ours).
    truth_refine: int = option(4, "evaluation: the independent reference is the Q1 FEM on a grid with this many "
                               "times the intervals (2..16)", integer_in(2, 16))


class KLCoefficients:
    """The instances of a KL diffusivity family, 2-D or 3-D: coefficient rows a (S, m) in the box
    ``coeff_range``^m, or nodal diffusivity fields in their place. Mixed into a :class:`Family`
    with ``kl_terms``, ``coeff_range``, ``dims`` and ``diffusivity(params)``."""

    @classmethod
    def check_options(cls, options, *, n_train: int, sampling: str) -> None:
        m = options.kl_terms
        if sampling == "uniform" and round(n_train ** (1.0 / m)) ** m != n_train:
            raise ValueError(f"data.n_train: uniform sampling of {m} coefficients is a tensor grid and needs "
                             f"n_train = k^{m} (got {n_train}); use sampling = 'sobol' or 'random'")

    @property
    def parameters(self) -> ParameterSpec:
        lo, hi = self.coeff_range
        return ParameterSpec("a", (self.kl_terms,), lo, hi, field="nu", distributions=("uniform", "normal"),
                             description="KL coefficients")

    def draw(self, n: int, distribution: str, seed: int) -> np.ndarray:
        """Uniform on the training range, or standard normal (the Karhunen-Loève expansion's own law)."""
        if distribution == "normal":
            return np.random.default_rng(seed).standard_normal((n, self.kl_terms))
        return super().draw(n, distribution, seed)

    def input_fields(self, params: np.ndarray) -> tuple[np.ndarray, list[str]]:
        """log10 of each instance's diffusivity, with its coefficients as the label."""
        labels = ["ν" if np.asarray(p).ndim == self.dims else "ν, a = (" + ", ".join(f"{v:.1f}" for v in p) + ")"
                  for p in params]
        return np.log10(self.diffusivity_numpy(params)), labels

    def diffusivity_numpy(self, params: np.ndarray) -> np.ndarray:
        """``diffusivity`` in float64 numpy, for the reference solver."""
        return self.diffusivity(torch.as_tensor(np.asarray(params, dtype=np.float64))).numpy()


@dataclass(frozen=True)
class KLFamily(KLCoefficients, Q1Classical, Family):
    """Diffusivities nu(x, y) = exp(sum_i a_i lambda_i phi_i(x) phi_i(y)) on an (N_y, N_x) nodal grid of [0,1]^2.

    Instance parameters are coefficient rows a, shape (S, m); a batch of nodal
    diffusivity fields, shape (S, N_y, N_x), may be given in their place (inference on
    arbitrary positive fields). ``constant`` > 0 replaces the family by nu = constant.
    ``truth_refine`` is how much finer the grid of the independent reference (:meth:`truth`) is.
    """

    resolution: tuple[int, int]
    kl_terms: int = 6
    eta: float = 0.5
    coeff_range: tuple[float, float] = (-3.0, 3.0)
    constant: float = 0.0
    truth_refine: int = 4

    in_channels = 3
    polish_step = "V-cycle"  # one iteration of :meth:`polish`
    capabilities = frozenset({"reference", "floor", "classical", "polish", "input_fields", "precondition"})

    @classmethod
    def from_options(cls, options: KLOptions, resolution: tuple[int, ...]) -> "KLFamily":
        o = options
        return cls(resolution=tuple(resolution), kl_terms=o.kl_terms, eta=o.kl_eta, coeff_range=tuple(o.coeff_range),
                   truth_refine=o.truth_refine, **cls._extra(o))

    @staticmethod
    def _extra(options) -> dict:
        """Constructor arguments of a subclass's own keys."""
        return {}

    def describe(self) -> str:
        if self.constant > 0:
            return f"nu={self.constant}"
        return f"nu=KL(m={self.kl_terms}, eta={self.eta}, a in {list(self.coeff_range)})"

    @property
    def hx(self) -> float:
        return 1.0 / (self.resolution[1] - 1)

    @property
    def hy(self) -> float:
        return 1.0 / (self.resolution[0] - 1)

    def coordinates(self) -> dict[str, np.ndarray]:
        """Nodal coordinates ``y`` (N_y,) and ``x`` (N_x,), float64."""
        ny, nx = self.resolution
        return {"y": np.linspace(0.0, 1.0, ny), "x": np.linspace(0.0, 1.0, nx)}

    def log_modes(self) -> np.ndarray:
        """lambda_i phi_i(x) phi_i(y) on the grid, shape (m, N_y, N_x)."""
        return kl_basis(self.eta, self.kl_terms, list(self.coordinates().values()), 1.0)

    def diffusivity(self, params: torch.Tensor) -> torch.Tensor:
        """Nodal nu, shape (S, N_y, N_x), for coefficient rows (S, m) or nu fields (S, N_y, N_x)."""
        if params.ndim == 3:
            return params
        if self.constant > 0:
            return torch.full((params.shape[0], *self.resolution), self.constant, dtype=params.dtype, device=params.device)
        modes = constant(("kl", self.eta, self.kl_terms, self.resolution), self.log_modes, params)
        return torch.exp(torch.einsum("sm,myx->syx", params, modes))

    def inputs(self, params: torch.Tensor) -> torch.Tensor:
        """Network input (S, 3, N_y, N_x): log nu, then y and x."""
        nu = self.diffusivity(params)
        s = nu.shape[0]
        c = {k: constant(("grid", k, self.resolution), lambda k=k: self.coordinates()[k], nu) for k in ("y", "x")}
        yy = c["y"][:, None].expand(*self.resolution).expand(s, -1, -1)
        xx = c["x"][None, :].expand(*self.resolution).expand(s, -1, -1)
        return torch.stack([torch.log(nu), yy, xx], dim=1)

    def reference(self, params: np.ndarray, progress=None, method: str = "amg") -> np.ndarray:
        """Q1 FEM solutions on this grid, shape (S, N_y, N_x), float64."""
        return self._solutions(params, progress, method)

    def reference_name(self) -> str:
        return "the Q1 FEM on this grid"

    def _solutions(self, params: np.ndarray, progress, method: str, stride: int = 1) -> np.ndarray:
        """Each instance's FEM solution read off every ``stride``-th node (one full solution in memory at a time)."""
        shape = tuple((n - 1) // stride + 1 for n in self.resolution)
        out = np.empty((len(params), *shape))
        for k in range(len(params)):
            out[k] = self.fem_system(params[k]).solve(method)[::stride, ::stride]
            if progress is not None:
                progress(k + 1, len(params))
        return out

    def discrete_optimum(self, params: np.ndarray, initial: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The best field on this grid under the trained energy, (S, N_y, N_x): the same-grid Q1 FEM
        solution, which minimises it exactly. Its error against :meth:`truth` is the grid's floor."""
        return self.reference(params), np.ones(len(params), dtype=bool)

    def truth(self, params: np.ndarray, progress=None) -> np.ndarray:
        """The independent reference on this grid's nodes: the Q1 FEM on the grid with ``truth_refine``
        times the intervals in each direction, whose nodes include this grid's (read off there).

        Coefficient rows give the diffusivity at the fine nodes exactly; nodal fields are
        interpolated bilinearly to them, as the elements do.
        """
        r = self.truth_refine
        ny, nx = self.resolution
        fine = dataclasses.replace(self, resolution=(r * (ny - 1) + 1, r * (nx - 1) + 1))
        params = np.asarray(params, dtype=np.float64)
        if params.ndim == 3:
            params = F.interpolate(torch.as_tensor(params)[:, None], size=fine.resolution, mode="bilinear",
                                   align_corners=True)[:, 0].numpy()
        return fine._solutions(params, progress, "amg", stride=r)

    def truth_name(self) -> str:
        ny, nx = self.resolution
        r = self.truth_refine
        return f"Q1 FEM on {r * (ny - 1) + 1}x{r * (nx - 1) + 1} ({r}x finer)"

    def floor_name(self) -> str:
        return "the Q1 FEM on this grid"

    def polish(self, params: np.ndarray, fields: np.ndarray, cycles: int) -> np.ndarray:
        """``cycles`` geometric-multigrid V(1,1)-cycles on each instance's Q1 system from ``fields``
        (S, N_y, N_x): the network's output improved by a classical solver ("DiffNet + k V-cycles").

        Each V-cycle contracts the algebraic error (the distance to this grid's FEM solution,
        the floor field) by the cycle's factor; the discretisation error stays.
        """
        out = np.empty_like(np.asarray(fields, dtype=np.float64))
        for k in range(len(out)):
            out[k] = self.fem_system(params[k]).multigrid().vcycles(fields[k], cycles)
        return out

    def fem_system(self, params: np.ndarray):
        """The Q1 system of one instance, boundary conditions applied (a :class:`~diffnet.solvers.poisson.FEMSystem`).

        ``params`` is one coefficient row (m,) or one nodal diffusivity field (N_y, N_x).
        """
        return self._fem_system(self.diffusivity_numpy(np.asarray(params)[None])[0])


class LiftedEnergy:
    """The field and loss of the Poisson families in any dimension: u = 1 at x = 0, u = 0 at x = 1 (x the
    last axis), zero flux elsewhere; the family supplies ``_energy(u, nu)``, the Q1 energy per sample."""

    def _energy(self, u: torch.Tensor, nu: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _energy_stencil(self, nu: torch.Tensor) -> torch.Tensor:
        """The Hessian of ``_energy`` in u (the Q1 stiffness matrix of nu) as a 3^d-point stencil."""
        raise NotImplementedError

    def hessian(self, u: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        """The Hessian of :meth:`loss_terms` in u: the stiffness stencil divided by the lift's energy."""
        nu = self.diffusivity(params.to(u.dtype))
        scale = self._energy(self._lift(u), nu).reshape(-1, *([1] * u.ndim))
        return self._energy_stencil(nu) / scale

    def field(self, raw: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        """u = (1 - x) + M * N, with the mask M zero on the Dirichlet planes x = 0, 1."""
        x = torch.linspace(0.0, 1.0, self.resolution[-1], dtype=raw.dtype, device=raw.device)
        return (1.0 - x) + F.pad(raw[:, 0, ..., 1:-1], (1, 1))

    def loss_terms(self, u: torch.Tensor, params: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-sample energy divided by that of the lift u = 1 - x (1/2 integral of nu), shape (S,)."""
        nu = self.diffusivity(params.to(u.dtype))
        return {"energy": self._energy(u, nu) / self._energy(self._lift(u), nu)}

    def _lift(self, u: torch.Tensor) -> torch.Tensor:
        """The lift 1 - x on u's grid, dtype and device, in u's shape."""
        return (1.0 - torch.linspace(0.0, 1.0, self.resolution[-1], dtype=u.dtype, device=u.device)).expand_as(u)

    def tile_loss_terms(self, raw: torch.Tensor, params: torch.Tensor, tiling) -> dict[str, torch.Tensor]:
        """:meth:`loss_terms` under a domain split: the tile's field, the energies of its own elements
        summed over the tiles."""
        axis = len(self.resolution) - 1
        x = axis_coordinates(tiling, axis, raw)
        u = (1.0 - x) + zero_boundary(raw[:, 0], tiling, [axis])
        nu = tiling.local(self.diffusivity(params.to(u.dtype)))
        lift = (1.0 - x).expand_as(u)
        return {"energy": element_sum(self._energy, tiling, u, nu) / element_sum(self._energy, tiling, lift, nu)}


@dataclass(frozen=True)
class PoissonProblem(LiftedEnergy, KLFamily):
    """-div(nu grad u) = 0 on [0,1]^2; u = 1 at x = 0, u = 0 at x = 1, zero flux at y = 0, 1.

    The loss is the Q1 energy J(u) = integral 1/2 nu |grad u|^2 of the network's field,
    divided per sample by the energy of the lift u = 1 - x (that is 1/2 integral nu):
    over a in [-3, 3]^6 nu spans about seven decades, and without the division the
    samples with large nu would own the gradient.
    """

    name = "poisson"
    Options = KLOptions

    def _energy(self, u: torch.Tensor, nu: torch.Tensor) -> torch.Tensor:
        return dirichlet_energy(u, nu, self.hx, self.hy)

    def _energy_stencil(self, nu: torch.Tensor) -> torch.Tensor:
        return dirichlet_stencil(nu, self.hx, self.hy)

    def _fem_system(self, nu: np.ndarray):
        from diffnet.solvers.poisson import poisson_system

        return poisson_system(nu)
