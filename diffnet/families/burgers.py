"""Space-time Burgers family u_t + u u_x = nu u_xx with initial condition 1/2 (1 - cos 2 pi c x)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from diffnet.protocol.loss import Loss, Residual
from diffnet.protocol.family import Family, ParameterSpec
from diffnet.discretisation.finite_difference import central_residual
from diffnet.discretisation.finite_volume import conservative_residual, implicit_diffusion_inverse
from diffnet.protocol.options import all_positive, interval, nonnegative, one_of, option, positive

__all__ = [
    "BurgersFamily",
    "initial_condition",
    "first_shock_time",
]


def initial_condition(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """u0(x) = 1/2 (1 - cos(2 pi c x)) for each c; shape (S, N_x) from x (N_x,), c (S,)."""
    return 0.5 * (1.0 - torch.cos(2.0 * math.pi * c[:, None] * x[None, :]))


def first_shock_time(c: float) -> float:
    """Time at which the inviscid solution of the family first breaks, 1 / (pi c)."""
    return 1.0 / (math.pi * c)


@dataclass(frozen=True)
class BurgersFamily(Family):
    """The parametric Burgers family on a nodal (N_t, N_x) space-time grid, t_n = n T / (N_t - 1).

    Its configuration keys ``[burgers]`` are the fields below (each :func:`~diffnet.protocol.options.option` says
    what it means). The conservative residual is the implicit finite-volume scheme of
    :mod:`diffnet.discretisation.finite_volume`, whose zero-residual field is the entropy-consistent discrete
    solution (the right choice when nu = 0); the central ones are the pointwise PDE residual.
    """

    resolution: tuple[int, int]
    viscosity: float = option(0.01, "ν ≥ 0", nonnegative)
    stencil: str = option("sobel", "the loss: 3×3 central kernels with `sobel` (1,2,1) or `scharr` (3,10,3) weights, "
                          "or `conservative` (an implicit finite-volume scheme; see docs/physics.md)",
                          one_of("sobel", "scharr", "conservative"), key="residual")
    scheme_order: int = option(2, "conservative residual: 1 (backward Euler, first-order states) or 2 (BDF2, minmod "
                               "MUSCL states)", lambda v: None if v in (1, 2) else "must be 1 or 2")
    flux: str = option("godunov", "conservative residual: `godunov` or `engquist_osher` numerical flux",
                       one_of("godunov", "engquist_osher"))
    preconditioner: str = option("none", "conservative residual: `implicit_diffusion` weights each residual row by "
                                 "(I − ν Δt D_xx)⁻¹ before squaring (same zero, better conditioned; docs/physics.md)",
                                 one_of("none", "implicit_diffusion"))
    boundary: str = option("exact", "IC/BC by construction, u = u₀(x) + M·N(·) with M = 0 on the IC row and inflow "
                           "column; or `\"penalty\"`", one_of("exact", "penalty"))
    penalty: float = option(1.0, "λ of the boundary term with `boundary = \"penalty\"`", positive)
    t_final: float = option(1.0 / 3.0, "T", positive)
    c_range: tuple[float, ...] = option((3.0, 6.0), "range of the IC parameter c", interval)
    c_values: tuple[float, ...] = option((), "a fixed list of training c (with `data.sampling = \"list\"`)",
                                         all_positive)
    test_c: tuple[float, ...] = option((3.3, 4.1, 4.77, 5.5, 5.9), "held-out c for the accuracy table (random "
                                       "draws when empty)", all_positive)

    name = "burgers"
    smooth_error_lever = "burgers.preconditioner"  # the implicit-diffusion weighting of the residual
    samplings = ("uniform", "random", "sobol", "list")
    in_channels = 3
    polish_step = "Newton step"  # one iteration of :meth:`polish`: a Newton iteration on every time row, marching

    @classmethod
    def check_options(cls, options, *, n_train: int, sampling: str, resolution: tuple[int, ...]) -> None:
        if options.preconditioner != "none" and options.residual != "conservative":
            raise ValueError(f"preconditioner: applies to the conservative residual (residual = 'conservative'; "
                             f"got {options.residual!r})")
        if sampling == "list":
            if not options.c_values:
                raise ValueError("c_values: must list the training c when data.sampling = 'list'")
            if len(options.c_values) != n_train:
                raise ValueError(f"c_values: data.n_train must equal the length of c_values ({len(options.c_values)}) "
                                 f"when data.sampling = 'list' (got {n_train})")

    @property
    def capabilities(self) -> frozenset[str]:
        # Polishing marches the conservative scheme; the central residual has none to march.
        return frozenset({"reference", "floor", "classical", "differentiable"}
                         | ({"polish"} if self.stencil == "conservative" else set()))

    def loss(self) -> Loss:
        """The conservative scheme's residual with exact boundaries: a residual's squares, one per unknown node
        (:meth:`residual`); else (the central stencils' mean squares, or a boundary penalty beside them) a loss of no
        declared kind."""
        if self.stencil == "conservative" and self.boundary == "exact":
            return Residual(self.loss_terms, self.residual)
        return Loss(self.loss_terms)

    def describe(self) -> str:
        scheme = f" (order {self.scheme_order}, {self.flux} flux)" if self.stencil == "conservative" else ""
        return f"nu={self.viscosity} residual={self.stencil}{scheme}"

    @property
    def parameters(self) -> ParameterSpec:
        lo, hi = self.c_range
        return ParameterSpec("c", (), lo, hi, positive=True, description="the initial-condition parameter c")

    def sample(self, n: int, sampling: str, seed: int) -> np.ndarray:
        """Training c: ``list`` is ``c_values``; otherwise the family's box (:func:`diffnet.protocol.family.sample_box`)."""
        if sampling == "list":
            return np.asarray(self.c_values, dtype=np.float64)
        return super().sample(n, sampling, seed)

    def fixed_heldout(self) -> np.ndarray | None:
        return np.asarray(self.test_c, dtype=np.float64) if self.test_c else None

    @property
    def dt(self) -> float:
        return self.t_final / (self.resolution[0] - 1)

    @property
    def dx(self) -> float:
        return 1.0 / (self.resolution[1] - 1)

    def coordinates(self) -> dict[str, np.ndarray]:
        """Nodal coordinates ``t`` (N_t,) and ``x`` (N_x,), float64."""
        nt, nx = self.resolution
        return {"t": np.linspace(0.0, self.t_final, nt), "x": np.linspace(0.0, 1.0, nx)}

    def inputs(self, c: torch.Tensor) -> torch.Tensor:
        """Network input (S, 3, N_t, N_x): the IC broadcast along t, then t/T and x."""
        nt, nx = self.resolution
        kw = {"dtype": c.dtype, "device": c.device}
        x = torch.linspace(0.0, 1.0, nx, **kw)
        t = torch.linspace(0.0, 1.0, nt, **kw)
        u0 = initial_condition(x, c)[:, None, :].expand(-1, nt, -1)
        tt = t[:, None].expand(nt, nx).expand(c.shape[0], nt, nx)
        xx = x[None, :].expand(nt, nx).expand(c.shape[0], nt, nx)
        return torch.stack([u0, tt, xx], dim=1)

    def field(self, raw: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """Turn the network output (S, 1, N_t, N_x) into the field u (S, N_t, N_x).

        With exact boundaries, u = u0(x) + M * N where the mask M is 0 on the initial row
        and the inflow column and 1 elsewhere, so u(x, 0) = u0 and u(0, t) = 0 hold for
        any network output. (A smooth factor such as t x in place of M was measured to
        train badly: the expansion fan at the corner x = t = 0, u ~ x / t, then needs
        corrections of order 1 / t^2 from the network.)
        """
        raw = raw[:, 0]
        if self.boundary == "penalty":
            return raw
        x = torch.linspace(0.0, 1.0, self.resolution[1], dtype=raw.dtype, device=raw.device)
        u0 = initial_condition(x, c.to(raw.dtype))[:, None, :]
        return u0 + F.pad(raw[:, 1:, 1:], (1, 0, 1, 0))

    def loss_terms(self, u: torch.Tensor, c: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-sample loss terms, each shape (S,); the training loss is their sum.

        ``residual`` is the mean squared PDE residual over the unknown nodes; with the
        penalty option, ``boundary`` is lambda times the mean squared IC and BC mismatch.
        """
        if self.stencil == "conservative":
            r = self._scheme_residual(u)
        else:
            r = central_residual(u, self.dt, self.dx, self.viscosity, self.stencil)
        terms = {"residual": r.pow(2).mean(dim=(1, 2))}
        if self.boundary == "penalty":
            x = torch.linspace(0.0, 1.0, self.resolution[1], dtype=u.dtype, device=u.device)
            ic = (u[:, 0, :] - initial_condition(x, c.to(u.dtype))).pow(2).mean(dim=1)
            bc = u[:, :, 0].pow(2).mean(dim=1)
            terms["boundary"] = self.penalty * (ic + bc)
        return terms

    def _scheme_residual(self, u: torch.Tensor) -> torch.Tensor:
        """The conservative scheme's residual at the unknown nodes (S, N_t - 1, N_x - 1), weighted by the
        preconditioner where one is configured."""
        r = conservative_residual(u, self.dt, self.dx, self.viscosity, self.scheme_order, self.flux)
        if self.preconditioner == "implicit_diffusion":
            r = r @ implicit_diffusion_inverse(self.resolution[1], self.dt, self.dx, self.viscosity, r).T
        return r

    def residual(self, u: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """The loss as squares (its :class:`~diffnet.protocol.loss.Residual`): (S, N_t, N_x), zero on the initial row and the inflow
        column, scaled so that its squares sum to the ``residual`` loss term (their mean)."""
        r = self._scheme_residual(u)
        return F.pad(r, (1, 0, 1, 0)) / math.sqrt(r[0].numel())

    unique_optimum = False  # the central stencils' residual has several roots: ``initial`` picks one

    def discrete_optimum(self, c: np.ndarray, initial: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The best field on this grid under the trained residual, (S, N_t, N_x), and whether each is a root.

        Conservative: the implicit scheme's solution (:meth:`scheme_solution`), always a
        root. Sobel/Scharr: the root of the central residual nearest ``initial`` (the
        converged reference, say), or the least-squares optimum there when it has none
        (:func:`diffnet.solvers.sobel.solve_sobel`). Its error against :meth:`truth` is
        the grid's floor.
        """
        if self.stencil == "conservative":
            return self.scheme_solution(c), np.ones(len(c), dtype=bool)
        from diffnet.solvers.sobel import solve_sobel

        x = torch.linspace(0.0, 1.0, self.resolution[1], dtype=torch.float64)
        u0 = initial_condition(x, torch.as_tensor(np.asarray(c, dtype=np.float64))).numpy()
        fields, roots = [], []
        for k, row in enumerate(u0):
            u, worst = solve_sobel(row, self.t_final, self.resolution[0], self.viscosity, self.stencil,
                                   initial=None if initial is None else initial[k])
            fields.append(u)
            roots.append(worst < 1e-6)
        return np.stack(fields), np.asarray(roots)

    def reference_name(self) -> str:
        from diffnet.solvers.burgers import default_cells

        return f"Godunov ({default_cells(self.resolution[1])} cells, second order)"

    def floor_name(self) -> str:
        if self.stencil == "conservative":
            return f"the conservative scheme's own solution (order {self.scheme_order}, {self.flux} flux)"
        return f"the {self.stencil} residual's nodal optimum"

    def scheme_solution(self, c: np.ndarray, initial: np.ndarray | None = None,
                        iterations: int | None = None) -> np.ndarray:
        """The exact solutions of the conservative scheme on this grid (zero residual), (S, N_t, N_x).

        Their error against :meth:`reference` is the floor a network trained on the
        conservative residual can reach. With ``initial`` fields (S, N_t, N_x) each row's
        Newton iteration starts from theirs, and with ``iterations`` it stops after that many
        (:func:`diffnet.solvers.conservative.solve_scheme`).
        """
        from diffnet.solvers.conservative import solve_scheme

        x = torch.linspace(0.0, 1.0, self.resolution[1], dtype=torch.float64)
        u0 = initial_condition(x, torch.as_tensor(np.asarray(c, dtype=np.float64))).numpy()
        starts = [None] * len(u0) if initial is None else np.asarray(initial, dtype=np.float64)
        return np.stack([solve_scheme(row, self.t_final, self.resolution[0], self.viscosity, self.scheme_order, self.flux,
                                      initial=start, iterations=iterations) for row, start in zip(u0, starts)])

    def polish(self, c: np.ndarray, fields: np.ndarray, iterations: int) -> np.ndarray:
        """``iterations`` Newton iterations of the implicit conservative scheme per time row, marching from
        the network's ``fields`` (S, N_t, N_x): "DiffNet + k Newton steps". Conservative residual only
        (the central residual has no marching scheme to polish with)."""
        if self.stencil != "conservative":
            raise ValueError(f"polish: needs the conservative residual (burgers.residual = \"conservative\"); "
                             f"this run trained the {self.stencil} residual")
        return self.scheme_solution(c, initial=fields, iterations=iterations)

    # -- classical solvers for ``compare`` (diffnet.solvers.burgers) ---------------------
    classical_methods = {"godunov1": "Godunov, first order",
                         "godunov2": "Godunov, second order (minmod MUSCL, SSP-RK2)"}
    classical_baseline = None

    def classical_configurations(self) -> dict[str, list[int]]:
        from diffnet.solvers.burgers import godunov_configurations

        return godunov_configurations(self)

    def classical_solver(self, method: str, grid: int):
        from diffnet.solvers.burgers import godunov_solver

        return godunov_solver(self, method, grid)

    def classical_to_grid(self, method: str, native: np.ndarray, instances: np.ndarray) -> np.ndarray:
        from diffnet.solvers.burgers import godunov_to_grid

        return godunov_to_grid(self, native, instances)

    def reference(self, c: np.ndarray, progress=None) -> np.ndarray:
        """Converged Godunov solutions on this grid, shape (S, N_t, N_x), float64."""
        from diffnet.solvers.burgers import solve_on_grid

        out = np.empty((len(c),) + tuple(self.resolution))
        for k, ck in enumerate(c):
            out[k] = solve_on_grid(float(ck), self.resolution, self.viscosity, self.t_final)
            if progress is not None:
                progress(k + 1, len(c))
        return out
