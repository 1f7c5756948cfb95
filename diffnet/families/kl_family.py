"""The Karhunen-Loève diffusivity family in any dimension: its instances (coefficient rows or nodal
diffusivity fields), the network's inputs, and its Q1 finite-element references, floor and polish.

The base of the Q1 families over KL diffusivities (:mod:`diffnet.families.poisson`,
:mod:`diffnet.families.poisson3d`, :mod:`diffnet.families.reaction_diffusion`), which add their
field, loss and system; the dimension is ``dims``, everything else is written for any.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from diffnet.grid.recovery import as_tensors, recovered_flux
from diffnet.instances.boundary import SIDES, BoxBoundary, SideFields
from diffnet.solvers.classical import Q1Classical
from diffnet.backend.constants import constant
from diffnet.protocol.family import Family, ParameterSpec
from diffnet.protocol.loss import Energy
from diffnet.instances.kl import kl_basis
from diffnet.protocol.options import integer_in, interval, one_of, option, positive
from diffnet.backend.precision import no_tf32
from diffnet.solvers.fem import FEMSystem, dirichlet_system

__all__ = ["KLFamily", "kl_log_field"]


def kl_log_field(coeffs: torch.Tensor, eta: float, terms: int, resolution: tuple[int, ...],
                 tensor: bool = False) -> torch.Tensor:
    """sum_i a_i lambda_i^{d/2} prod_k phi_i(x_k) on the unit square's or cube's node grid ``resolution``,
    (S, *resolution), for coefficient rows (S, terms); ``tensor``: the separable covariance's modes of largest
    eigenvalue instead (:func:`~diffnet.instances.kl.kl_basis`). The modes are built once per process
    (diffnet.backend.constants)."""
    resolution = tuple(resolution)
    axes = [np.linspace(0.0, 1.0, n) for n in resolution]
    modes = constant(("kl", eta, terms, resolution, tensor),
                     lambda: kl_basis(eta, terms, axes, len(resolution) / 2, tensor), coeffs)
    # Not in TF32: this field is the loss's coefficient, and a CUDA matrix product in TF32 (10 mantissa bits;
    # torch 2.11's default for none, but parallel.tf32 = true turns it on) put 1e-3 into the float32 loss.
    with no_tf32():
        return torch.einsum("sm,m...->s...", coeffs, modes)


@dataclass(frozen=True)
class KLFamily(SideFields, Q1Classical, Family):
    """Diffusivities nu = exp(sum_i a_i lambda_i^{d/2} prod_k phi_i(x_k)) on a nodal grid of [0,1]^d,
    d = ``dims`` (2: (N_y, N_x); a subclass sets 3 for (N_z, N_y, N_x)).

    Instance parameters are coefficient rows a, shape (S, m); a batch of nodal
    diffusivity fields, shape (S, *resolution), may be given in their place (inference on
    arbitrary positive fields). ``constant`` > 0 replaces the family by nu = constant.
    ``truth_refine`` is how much finer the grid of the independent reference (:meth:`truth`) is.
    The weight lambda_i^{d/2} keeps the field's variance finite in any dimension (:mod:`diffnet.instances.kl`).
    """

    resolution: tuple[int, ...]
    kl_terms: int = option(6, "m, KL terms", integer_in(1, 64))
    eta: float = option(0.5, "correlation length η (the roots ω_i are computed for any η)", positive, key="kl_eta")
    coeff_range: tuple[float, ...] = option((-3.0, 3.0), "range of each coefficient a_i", interval)
    kl_modes: str = option("diagonal", "the modes: `diagonal`, φ_i(x)φ_i(y) (every field point-symmetric about the "
                           "centre), or `tensor`, φ_i(x)φ_j(y) for the m largest λ_iλ_j (any field the covariance "
                           "gives; an inverse problem's choice)", one_of("diagonal", "tensor"))
    # The independent reference is the Q1 FEM on a grid with this many times the intervals
    # in each direction (its nodes include ours).
    truth_refine: int = option(4, "evaluation: the independent reference is the Q1 FEM on a grid with this many "
                               "times the intervals (2..16)", integer_in(2, 16))
    constant: float = 0.0  # > 0: nu = constant in place of the KL family (not a key of its own; see nu_constant)

    in_channels = 3  # log nu and the d coordinates
    polish_step = "V-cycle"  # one iteration of :meth:`polish`
    # How reference, discrete_optimum and truth solve (diffnet.solvers.fem.FEMSystem.solve): AMG-CG to
    # 1e-10 in 2-D; a subclass may choose the multigrid's FMG where AMG's setup dominates (3-D).
    reference_method = "amg"
    capabilities = frozenset({"reference", "floor", "classical", "polish", "input_fields", "derived", "differentiable"})

    def loss(self) -> Energy:
        """The Q1 energy, its Hessian the stencil each family writes (``hessian``)."""
        return Energy(self.loss_terms, hessian=getattr(self, "hessian", None))

    def __post_init__(self) -> None:
        if len(self.resolution) != self.dims or min(self.resolution) < 3:
            axes = "[N_z, N_y, N_x]" if self.dims == 3 else "[N_y, N_x]"
            raise ValueError(f"problem.resolution: the {self.name} family needs {axes} with at least 3 nodes each, "
                             f"got {list(self.resolution)}")

    @classmethod
    def check_options(cls, options, *, n_train: int, sampling: str, resolution: tuple[int, ...]) -> None:
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

    def input_fields(self, instances: np.ndarray) -> tuple[np.ndarray, list[str]]:
        """log10 of each instance's diffusivity, with its coefficients as the label."""
        labels = ["ν" if np.asarray(p).ndim == self.dims else "ν, a = (" + ", ".join(f"{v:.1f}" for v in p) + ")"
                  for p in instances]
        return np.log10(self.diffusivity_numpy(instances)), labels

    def derived(self, instances, fields) -> dict:
        """The flux -ν∇u per component (``flux_x``, ``flux_y``[, ``flux_z``], each (S, *grid)): Q1 gradients at the
        Gauss points times ν there, recovered to the nodes (:func:`diffnet.grid.recovery.recovered_flux`). numpy in,
        numpy out; torch tensors in, tensors out, differentiable in both (``differentiable``)."""
        u, back = as_tensors(fields)
        flux = recovered_flux(u, self.diffusivity(torch.as_tensor(instances, dtype=u.dtype, device=u.device)), self.spacing)
        return back({f"flux_{axis}": flux[:, k] for k, axis in enumerate("xyz"[: self.dims])})

    def diffusivity_numpy(self, instances: np.ndarray) -> np.ndarray:
        """``diffusivity`` in float64 numpy, for the reference solver."""
        return self.diffusivity(torch.as_tensor(np.asarray(instances, dtype=np.float64))).numpy()

    @property
    def nu_constant(self) -> float:
        """nu where it is one constant (> 0) in place of the KL family, else 0."""
        return self.constant

    @property
    def boundary(self) -> BoxBoundary:
        """The box's conditions per side (:mod:`diffnet.instances.boundary`)."""
        return BoxBoundary.of(dict(zip(SIDES, self.sides)), self.dims)

    def describe(self) -> str:
        if self.nu_constant > 0:
            return f"nu={self.nu_constant}"
        modes = ", tensor modes" if self.kl_modes == "tensor" else ""
        return f"nu=KL(m={self.kl_terms}, eta={self.eta}{modes}, a in {list(self.coeff_range)})"

    @property
    def spacing(self) -> tuple[float, ...]:
        """The node spacings, x first: (h_x, h_y[, h_z])."""
        return tuple(1.0 / (n - 1) for n in reversed(self.resolution))

    def coordinates(self) -> dict[str, np.ndarray]:
        """Nodal coordinates per axis, outermost first (``y``, ``x``; or ``z``, ``y``, ``x``), float64."""
        names = ("z", "y", "x")[-self.dims:]
        return {k: np.linspace(0.0, 1.0, n) for k, n in zip(names, self.resolution)}

    def diffusivity(self, instances: torch.Tensor) -> torch.Tensor:
        """Nodal nu, shape (S, *resolution), for coefficient rows (S, m) or nu fields (S, *resolution)."""
        if instances.ndim == 1 + self.dims:
            return instances
        if self.nu_constant > 0:
            return torch.full((instances.shape[0], *self.resolution), self.nu_constant, dtype=instances.dtype, device=instances.device)
        return torch.exp(kl_log_field(instances, self.eta, self.kl_terms, self.resolution, self.kl_modes == "tensor"))

    def inputs(self, instances: torch.Tensor) -> torch.Tensor:
        """Network input (S, 1 + d, *resolution): log nu, then the coordinates, outermost first."""
        nu = self.diffusivity(instances)
        s = nu.shape[0]
        axes = [constant(("grid", k, self.resolution), lambda k=k: self.coordinates()[k], nu) for k in self.coordinates()]
        grids = torch.meshgrid(*axes, indexing="ij")
        return torch.stack([torch.log(nu), *(g.expand(s, *self.resolution) for g in grids)], dim=1)

    def reference(self, instances: np.ndarray, progress=None, method: str | None = None) -> np.ndarray:
        """Q1 FEM solutions on this grid, shape (S, *resolution), float64, by ``method`` (a
        :meth:`~diffnet.solvers.fem.FEMSystem.solve` method; default ``reference_method``)."""
        return self._solutions(np.asarray(instances, dtype=np.float64), progress, method or self.reference_method)

    def reference_name(self) -> str:
        return "the Q1 FEM on this grid" + (" (geometric multigrid)" if self.reference_method == "gmg" else "")

    def _solutions(self, instances: np.ndarray, progress, method: str, stride: int = 1) -> np.ndarray:
        """Each instance's FEM solution read off every ``stride``-th node (one full solution in memory at a time)."""
        shape = tuple((n - 1) // stride + 1 for n in self.resolution)
        every = (slice(None, None, stride),) * self.dims
        out = np.empty((len(instances), *shape))
        for k in range(len(instances)):
            out[k] = self.fem_system(instances[k]).solve(method)[every]
            if progress is not None:
                progress(k + 1, len(instances))
        return out

    def discrete_optimum(self, instances: np.ndarray, initial: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The best field on this grid under the trained energy, (S, *resolution): the same-grid Q1 FEM
        solution, which minimises it exactly. Its error against :meth:`truth` is the grid's floor."""
        return self.reference(instances), np.ones(len(instances), dtype=bool)

    def truth(self, instances: np.ndarray, progress=None) -> np.ndarray:
        """The independent reference on this grid's nodes: the Q1 FEM on the grid with ``truth_refine``
        times the intervals in each direction, whose nodes include this grid's (read off there).

        Coefficient rows give the diffusivity at the fine nodes exactly; nodal fields are
        interpolated multilinearly to them, as the elements do.
        """
        r = self.truth_refine
        fine = dataclasses.replace(self, resolution=tuple(r * (n - 1) + 1 for n in self.resolution))
        instances = np.asarray(instances, dtype=np.float64)
        if instances.ndim == 1 + self.dims:
            mode = "bilinear" if self.dims == 2 else "trilinear"
            instances = F.interpolate(torch.as_tensor(instances)[:, None], size=fine.resolution, mode=mode,
                                   align_corners=True)[:, 0].numpy()
        return fine._solutions(instances, progress, self.reference_method, stride=r)

    def truth_name(self) -> str:
        r = self.truth_refine
        return "Q1 FEM on " + "x".join(str(r * (n - 1) + 1) for n in self.resolution) + f" ({r}x finer)"

    def floor_name(self) -> str:
        return "the Q1 FEM on this grid"

    def polish(self, instances: np.ndarray, fields: np.ndarray, cycles: int) -> np.ndarray:
        """``cycles`` geometric-multigrid V(1,1)-cycles on each instance's Q1 system from ``fields``
        (S, *resolution): the network's output improved by a classical solver ("DiffNet + k V-cycles").

        Each V-cycle contracts the algebraic error (the distance to this grid's FEM solution,
        the floor field) by the cycle's factor; the discretisation error stays.
        """
        out = np.empty_like(np.asarray(fields, dtype=np.float64))
        for k in range(len(out)):
            out[k] = self.fem_system(instances[k]).multigrid().vcycles(fields[k], cycles)
        return out

    def fem_system(self, instances: np.ndarray) -> FEMSystem:
        """The Q1 system of one instance, boundary conditions applied (a :class:`~diffnet.solvers.fem.FEMSystem`).

        ``instances`` is one coefficient row (m,) or one nodal diffusivity field (*resolution).
        """
        return self._fem_system(self.diffusivity_numpy(np.asarray(instances)[None])[0])

    def _boundary_fields(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The free-node mask, the lift and the flux load on the grid, in ``like``'s dtype and device."""
        b, grid = self.boundary, tuple(self.resolution)
        key = ("box", tuple(map(str, b.sides.values())), grid)
        host = torch.zeros((), dtype=like.dtype)  # built in the field's dtype (1 - x to the bit), then moved
        return (constant(key + ("free",), lambda: b.free(grid, host), like),
                constant(key + ("lift",), lambda: b.lift(grid, host), like),
                constant(key + ("flux",), lambda: b.flux_load(grid), like))

    def field(self, raw: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
        """u = lift + M * N: the lift of the Dirichlet values, the mask M zero on the Dirichlet nodes."""
        free, lift, _ = self._boundary_fields(raw)
        return lift + raw[:, 0] * free

    def _flux_work(self, u: torch.Tensor, flux: torch.Tensor | None = None) -> torch.Tensor:
        """The fluxes' work integral over the flux sides of q u, per sample (zero without fluxes); ``flux``:
        the load on u's nodes (default: the whole grid's). Whether there is any is the family's, not the
        tile's, so every tile of a split takes the same path (a sum over the tiles follows)."""
        if not any(s.kind == "flux" and s.value != 0.0 for s in self.boundary.sides.values()):
            return u.new_zeros(u.shape[0])
        flux = self._boundary_fields(u)[2] if flux is None else flux
        return (flux * u).sum(dim=tuple(range(1, u.ndim)))

    def _box_system(self, nu: np.ndarray, kappa: float = 0.0, f: float = 0.0) -> FEMSystem:
        """The Q1 system on the box with the family's conditions per side."""
        fixed, values = self.boundary.fixed(nu.shape)
        return dirichlet_system(nu, fixed, values, kappa, f, flux=self.boundary.flux_load(nu.shape))

    def _fem_system(self, nu: np.ndarray) -> FEMSystem:
        raise NotImplementedError
