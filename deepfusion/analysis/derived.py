"""The outputs an engineer reads besides the solution: a family's derived fields (stresses, strains, fluxes),
scalar quantities of interest (a stress concentration factor) and the error in the energy norm (the norm the
energy loss minimises, which weighs the field's gradient), of the network's fields, measured as the solution is:
against the truth's own (the reference's stress, its K_t) beside the floor's (the grid's best field's).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from deepfusion.analysis.inference import relative_l2
from deepfusion.analysis.reference_cache import truth_side

__all__ = ["Derived", "NORMS", "derived_fields", "scalar_parts", "quantities", "truth_quantities", "energy_errors", "measure"]


def derived_fields(family, instances: np.ndarray, fields: np.ndarray) -> dict[str, np.ndarray]:
    """The family's derived fields of ``fields`` (name -> (S, *grid) or a tensor (S, K, *grid)); none without the
    ``derived`` capability."""
    return dict(family.derived(instances, fields)) if family.has("derived") else {}


def scalar_parts(derived: dict, dims: int) -> dict:
    """A family's derived fields (name -> (S, *grid), or a symmetric tensor (S, K, *grid)) as scalar fields: a tensor's
    components named ``NAME_xx``, ... (:data:`~diffnet.grid.material.COMPONENT_NAMES`), numpy or torch as given."""
    from diffnet.grid.material import COMPONENT_NAMES

    out = {}
    for name, value in derived.items():
        if value.ndim == 1 + dims:
            out[name] = value
        else:
            out |= {f"{name}_{c}": value[:, k] for k, c in enumerate(COMPONENT_NAMES[dims])}
    return out


def truth_derived(family, instances: np.ndarray, truth: np.ndarray) -> dict[str, np.ndarray]:
    """The truth's derived fields: the reference's own where the family gives them, else derived from its fields."""
    if not family.has("derived"):
        return {}
    own = getattr(family, "truth_derived", None)
    return truth_side(family, "truth_derived", instances, lambda: own(instances)) if own is not None \
        else dict(family.derived(instances, truth))


def quantities(family, instances: np.ndarray, fields: np.ndarray) -> dict[str, np.ndarray]:
    """The family's quantities of interest of ``fields`` (name -> (S,)); none without the ``quantities`` capability."""
    return {k: np.asarray(v, dtype=np.float64) for k, v in family.quantities(instances, fields).items()} \
        if family.has("quantities") else {}


def truth_quantities(family, instances: np.ndarray, truth: np.ndarray) -> dict[str, np.ndarray]:
    """The truth's quantities: the reference's own where the family gives them, else of its fields."""
    if not family.has("quantities"):
        return {}
    own = getattr(family, "truth_quantities", None)
    values = truth_side(family, "truth_quantities", instances, lambda: own(instances)) if own is not None \
        else family.quantities(instances, truth)
    return {k: np.asarray(v, dtype=np.float64) for k, v in values.items()}


@dataclass(frozen=True)
class Derived:
    """What :func:`measure` found: the derived fields of the network's and the truth's solutions, each derived
    field's relative L2 error (network and floor) against the truth's, and each quantity's values and relative
    error."""

    fields: dict[str, np.ndarray] = field(default_factory=dict)
    truth_fields: dict[str, np.ndarray] = field(default_factory=dict)
    errors: dict[str, dict] = field(default_factory=dict)
    quantities: dict[str, dict] = field(default_factory=dict)
    energy: dict = field(default_factory=dict)  # the relative error in the energy norm (:func:`energy_errors`)

    def report(self) -> dict:
        """``eval.json``'s entries (none for a family with neither capability)."""
        return {**({"derived": self.errors} if self.errors else {}),
                **({"quantities": self.quantities} if self.quantities else {}),
                **({self.energy["name"].lower().replace(" ", "_").replace("-", "_"): self.energy} if self.energy else {})}

    def lines(self, width: int) -> list[str]:
        """The evaluation table's rows: the energy norm, one per derived field (error, floor, ratio), one per
        quantity."""
        rows = ([(self.energy["name"], self.energy, f"the error's {self.energy['name']} over the truth's")]
                if self.energy else []) + \
            [(name, row, "derived, mean over the instances") for name, row in self.errors.items()]
        out = [f"{name:>{width}}   {row['mean_rel_l2']:.4f}               {row['mean_floor']:.4f}   "
               f"{row['ratio_to_floor']:5.2f}   ({what})" for name, row, what in rows]
        for name, row in self.quantities.items():
            out.append(f"{name:>{width}}   mean {np.mean(row['values']):.4g} (truth {np.mean(row['truth']):.4g}): "
                       f"error {row['mean_rel_error']:.2%} (max {row['max_rel_error']:.2%}), the floor's "
                       f"{row['floor_mean_rel_error']:.2%} (max {row['floor_max_rel_error']:.2%})")
        return out


#: the norm each kind of loss reports its error in: its name, and what it is
NORMS = {"energy": ("energy norm", "||e||_H / ||truth||_H, H the loss's Hessian at the floor's field"),
         "residual": ("Gauss-Newton norm", "||J e|| / ||J truth||, J the residual's Jacobian at the floor's field")}


def energy_errors(family, instances: np.ndarray, pred: np.ndarray, truth: np.ndarray,
                  optimum: np.ndarray | None) -> dict:
    """The relative error of ``pred`` and of the floor's field ``optimum`` against ``truth`` (all at the grid's
    nodes) in the norm of the family's loss at the floor's field (:data:`NORMS`): for an energy its energy norm
    ||e||_H / ||truth||_H (:func:`diffnet.multigrid.hessian.energy_norms`), for a residual its Gauss-Newton norm
    ||J e|| / ||J truth|| (:func:`diffnet.multigrid.gauss_newton.gauss_newton_norms`); none ({}) for a loss of no
    declared kind. Both weigh the field's gradient: a field at its floor in L2 whose gradient is not shows here."""
    kind = family.loss().kind
    if kind not in NORMS or optimum is None:
        return {}
    import torch

    if kind == "energy":
        from diffnet.multigrid.hessian import energy_norms as norms
    else:
        from diffnet.multigrid.gauss_newton import gauss_newton_norms as norms

    t = lambda x: torch.as_tensor(np.asarray(x, dtype=np.float64))  # noqa: E731
    mine, floor, size = (v.numpy() for v in norms(family, t(instances), t(optimum), t(pred - truth),
                                                   t(optimum - truth), t(truth)))
    error, floor = mine / size, floor / size
    name, norm = NORMS[kind]
    return {"name": name, "mean_rel_l2": float(error.mean()), "rel_l2": error.tolist(), "mean_floor": float(floor.mean()),
            "floor_rel_l2": floor.tolist(), "ratio_to_floor": float(error.mean() / floor.mean()), "norm": norm}


def measure(family, instances: np.ndarray, pred: np.ndarray, truth: np.ndarray,
            optimum: np.ndarray | None) -> Derived:
    """The derived fields and quantities of ``pred`` against the truth's (``truth``: its fields) and the floor's
    (``optimum``: the grid's best fields, or None), and the error in the energy norm (:func:`energy_errors`)."""
    energy = energy_errors(family, instances, pred, truth, optimum)
    if not (family.has("derived") or family.has("quantities")):
        return Derived(energy=energy)
    mine, theirs = derived_fields(family, instances, pred), truth_derived(family, instances, truth)
    floor = derived_fields(family, instances, optimum) if optimum is not None else {}
    errors = {}
    for name, value in mine.items():
        error = relative_l2(value, theirs[name])
        row = {"mean_rel_l2": float(error.mean()), "rel_l2": error.tolist()}
        if name in floor:
            floor_error = relative_l2(floor[name], theirs[name])
            row |= {"mean_floor": float(floor_error.mean()), "ratio_to_floor": float(error.mean() / floor_error.mean())}
        else:
            row |= {"mean_floor": float("nan"), "ratio_to_floor": float("nan")}
        errors[name] = row
    values, exact = quantities(family, instances, pred), truth_quantities(family, instances, truth)
    at_floor = quantities(family, instances, optimum) if optimum is not None else {}
    rows = {}
    for name, value in values.items():
        off = np.abs(value - exact[name]) / np.abs(exact[name])
        off_floor = (np.abs(at_floor[name] - exact[name]) / np.abs(exact[name]) if name in at_floor
                     else np.full_like(off, np.nan))
        rows[name] = {"values": value.tolist(), "truth": exact[name].tolist(),
                      "floor": at_floor[name].tolist() if name in at_floor else None,
                      "mean_rel_error": float(off.mean()), "max_rel_error": float(off.max()),
                      "floor_mean_rel_error": float(off_floor.mean()), "floor_max_rel_error": float(off_floor.max())}
    return Derived(mine, theirs, errors, rows, energy)
