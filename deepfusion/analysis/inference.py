"""The accuracy of fields: the relative L2 error against a reference, and that error measured against the grid's
discretisation floor, inside a cut domain where the family has one.

The primitives every command and report uses (the fields themselves are the product's,
:class:`diffnet.product.product.Product`); the run's evaluation report is :mod:`deepfusion.analysis.evaluate`, the
error's structure :mod:`deepfusion.analysis.diagnostics`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from deepfusion.analysis import reference_cache
from diffnet.grid.nodal import inside_only, node_data

if TYPE_CHECKING:
    from diffnet.protocol.family import Family

__all__ = ["domain_of", "on_domain", "relative_l2", "FloorReport", "against_floor", "EvaluationError",
           "instance_labels", "check_measurable"]


def domain_of(family, instances: np.ndarray) -> np.ndarray | None:
    """The signed distance at the nodes (S, *grid) of a family with the ``domain`` capability, else None.

    One value per instance and node whatever the number of unknowns: a family's ``domain`` may return
    (S, *grid) or (S, 1, *grid); any other shape raises ``ValueError`` saying which is right."""
    if not family.has("domain"):
        return None
    instances = np.asarray(instances)
    return node_data(family.domain(instances), len(instances), tuple(family.resolution), f"{family.name}.domain(instances)")


def on_domain(family, instances: np.ndarray, fields: np.ndarray, domain: np.ndarray | None = None) -> np.ndarray:
    """``fields`` (S, *grid) or (S, C, *grid) of ``instances`` with every unknown zero at the nodes outside each
    instance's own domain (a family with the ``domain`` capability; ``domain``: its signed distance when already
    at hand), else as they are. Every field a report or file shows goes through here: the network's, the
    truth, the floor, a classical solve's, a polished one."""
    domain = domain_of(family, instances) if domain is None else domain
    return fields if domain is None else inside_only(fields, domain)


def relative_l2(pred: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per-sample ||pred - ref||_2 / ||ref||_2 over all nodes; shape (S,)."""
    if pred.shape != ref.shape:
        raise ValueError(f"shapes differ: {pred.shape} vs {ref.shape}")
    diff = (pred - ref).reshape(len(ref), -1)
    return np.linalg.norm(diff, axis=1) / np.linalg.norm(ref.reshape(len(ref), -1), axis=1)


@dataclass
class FloorReport:
    """Accuracy of predicted fields against the independent reference and the grid's floor.

    ``error`` is each instance's relative L2 distance to the truth (``truth_name``);
    ``floor`` the same for the best field the grid allows under the trained loss
    (``floor_name``: the zero-residual field or energy minimiser); ``ratio`` is mean error
    over mean floor, 1 when the network has done all its grid allows. A family that
    declares no floor gets NaN floors and ratio.
    """

    truth: np.ndarray
    error: np.ndarray
    floor: np.ndarray
    floor_is_root: np.ndarray
    truth_name: str
    floor_name: str
    truth_seconds: float
    floor_seconds: float
    optimum: np.ndarray | None = None  # the floor's fields themselves

    @property
    def ratio(self) -> float:
        return float(self.error.mean() / self.floor.mean())

    def as_dict(self) -> dict:
        return {
            "truth": self.truth_name,
            "floor_field": self.floor_name,
            "rel_l2": self.error.tolist(),
            "mean_rel_l2": float(self.error.mean()),
            "max_rel_l2": float(self.error.max()),
            "floor_rel_l2": self.floor.tolist(),
            "mean_floor": float(self.floor.mean()),
            "ratio_to_floor": self.ratio,
            "floor_is_root": self.floor_is_root.tolist(),
            "truth_seconds": self.truth_seconds,
            "floor_seconds": self.floor_seconds,
        }


def against_floor(family, instances: np.ndarray, pred: np.ndarray, truth: np.ndarray | None = None,
                  progress=None) -> FloorReport:
    """Measure ``pred`` (S, ...) against ``problem.truth`` and the floor ``problem.discrete_optimum``
    (the family's ``reference`` and ``floor`` capabilities; without a floor, NaN floors).

    The floor's direct solve starts from the truth, so where the trained loss has several
    optima (the central Burgers residual) the one nearest the truth is taken. Both come from the
    reference cache when ``DEEPFUSION_REFERENCE_CACHE`` names one (:mod:`~deepfusion.analysis.reference_cache`).
    On a family with a domain every field is measured inside each instance's own domain
    (:func:`on_domain`). A field that is not finite, or a truth that is zero (a relative error against it
    means nothing), raises :class:`EvaluationError` naming the instance.
    """
    domain = domain_of(family, instances)
    pred = on_domain(family, instances, pred, domain)
    check_measurable(family, instances, pred, "DiffNet's field")
    t0 = time.perf_counter()
    if truth is None:
        truth = reference_cache.truth(family, instances, progress)
    truth = on_domain(family, instances, truth, domain)
    check_measurable(family, instances, truth, f"the reference ({family.truth_name()})", nonzero=True)
    t1 = time.perf_counter()
    if family.has("floor"):
        optimum, roots = reference_cache.discrete_optimum(family, instances, truth)
        optimum = on_domain(family, instances, optimum, domain)
        check_measurable(family, instances, optimum, f"the floor's field ({family.floor_name()})")
        floor, floor_name = relative_l2(optimum, truth), family.floor_name()
    else:
        optimum, roots, floor, floor_name = None, np.zeros(len(truth), dtype=bool), np.full(len(truth), np.nan), "none"
    t2 = time.perf_counter()
    return FloorReport(truth, relative_l2(pred, truth), floor, roots, family.truth_name(), floor_name,
                       t1 - t0, t2 - t1, optimum)


class EvaluationError(ValueError):
    """A field an evaluation measures is not finite, or the reference it is measured against is zero: the
    command stops with one line naming the instance (exit status 2) instead of a table of NaN."""


def instance_labels(family, instances: np.ndarray) -> list[str]:
    """One short label per instance, its parameter values by name: ``c = 4.1``, ``cx = 0.5, r = 0.12`` (named
    entries, up to four), or ``a = (0.31, -1.2, 2.9, 0.5, …)``."""
    spec = family.parameters
    out = []
    for row in np.asarray(instances, dtype=np.float64).reshape(len(instances), -1):
        if spec.shape == ():
            out.append(f"{spec.name} = {row[0]:.3g}")
        elif spec.names and len(row) <= 4:
            out.append(", ".join(f"{name} = {v:.3g}" for name, v in zip(spec.names, row)))
        else:
            out.append(f"{spec.name} = ({', '.join(f'{v:.2g}' for v in row[:4])}{', …' if len(row) > 4 else ''})")
    return out


def check_measurable(family, instances: np.ndarray, fields: np.ndarray, what: str, nonzero: bool = False) -> None:
    """Raise :class:`EvaluationError` naming the first instance whose ``fields`` hold NaN or Inf or, with
    ``nonzero``, are zero at every node (inside its domain)."""
    rows = np.asarray(fields, dtype=np.float64).reshape(len(fields), -1)
    bad = ~np.isfinite(rows).all(axis=1)
    zero = ~bad & (np.abs(rows).max(axis=1, initial=0.0) == 0.0) if nonzero else np.zeros_like(bad)
    if not (bad.any() or zero.any()):
        return
    k = int(np.flatnonzero(bad | zero)[0])
    instances = np.asarray(instances)
    label = instance_labels(family, instances[k : k + 1])[0] if instances.shape[1:] == family.parameters.shape else \
        f"its {family.parameters.field or 'input'} field"
    if bad[k]:
        count = int((~np.isfinite(rows[k])).sum())
        raise EvaluationError(f"instance {k} ({label}): {what} has NaN or Inf at {count} of {rows[k].size} values; "
                              "no error can be measured against it")
    raise EvaluationError(f"instance {k} ({label}): {what} is zero at every node"
                          + (" inside its domain" if family.has("domain") else "")
                          + ": a relative error against a zero solution has no meaning (does the family as "
                          "configured have a load: a source, a traction, a held value other than 0?)")
