"""Observations of a field and of what is derived from it, at points, for an inverse problem: a CSV of
``x,y[,z],output,value,sigma`` read and checked, and the predictions of a batch of fields at them.

Each row observes one scalar field at a point of the family's box (the unit square or cube, or its own: the
cylinder's channel), with its value and the standard deviation
of its Gaussian noise: an unknown of the family's field (``u``, or ``u_x``, ``u_y``, ... for several unknowns) or one
of its derived fields (:func:`observable_names`: ``flux_x``, ``von_mises``, a tensor's components as ``stress_xx``,
``strain_xy``, ...). Each is read at the point by the element's shape functions (:mod:`diffnet.grid.points`), the
derived ones from their values recovered to the nodes, as the evaluation reports them. A row may also observe one of
the family's quantities (:func:`quantity_names`: the plate's stress concentration factor ``K_t``), which has no
coordinates: its x, y[, z] are left empty and its points are NaN.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["Observations", "read_observations", "observable_names", "quantity_names", "observable_fields", "predict",
           "MAX_OBSERVATIONS"]

MAX_OBSERVATIONS = 100_000


@dataclass(frozen=True)
class Observations:
    """Values of scalar fields at points: ``points`` (P, d) x first, ``names`` (P,) the observed field of each row
    (:func:`observable_names`), ``values`` and ``sigma`` (P,)."""

    points: np.ndarray
    names: tuple[str, ...]
    values: np.ndarray
    sigma: np.ndarray
    extent: tuple[float, ...] | None = None  # the box's sides, x first (None: the unit square or cube)

    def __len__(self) -> int:
        return len(self.values)

    def rows(self) -> dict[str, np.ndarray]:
        """The rows observing each field, by name (in the order each first appears)."""
        names = np.asarray(self.names)
        return {name: np.flatnonzero(names == name) for name in dict.fromkeys(self.names)}

    def weights(self, resolution) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """The shape functions' weights (:func:`diffnet.grid.points.point_weights`) of each field's rows (:meth:`rows`)
        on the node grid ``resolution``: computed once per forward model, read at every evaluation. A quantity's rows
        (no coordinates) have none."""
        from diffnet.grid.points import point_weights

        return {name: point_weights(resolution, self.points[index], self.extent) for name, index in self.rows().items()
                if np.isfinite(self.points[index]).all()}


def observable_fields(family, instances, fields, wanted=None) -> dict:
    """The scalar fields an observation may name (:func:`observable_names`) of ``instances`` and their nodal
    ``fields`` ((S, *grid), or (S, C, *grid) for C unknowns): numpy in, numpy out; torch in, torch out,
    differentiable in both where the family is ``differentiable``. The derived fields only when ``wanted`` (names)
    asks for one of them (or is None)."""
    from deepfusion.analysis.derived import scalar_parts

    unknowns = tuple(family.unknowns)
    out = {unknowns[0]: fields} if len(unknowns) == 1 else {n: fields[:, k] for k, n in enumerate(unknowns)}
    if family.has("derived") and (wanted is None or set(wanted) - set(unknowns)):
        out |= scalar_parts(family.derived(instances, fields), len(family.resolution))
    return out


def _centre(family) -> tuple[np.ndarray, np.ndarray]:
    """The training range's centre (1, *shape) and a zero field for it: enough to learn the names a family gives."""
    low, high = family.parameters.bounds()
    centre = ((np.asarray(low, dtype=np.float64) + np.asarray(high, dtype=np.float64)) / 2)[None]
    shape = tuple(family.resolution) if len(family.unknowns) == 1 else (len(family.unknowns), *family.resolution)
    return centre, np.zeros((1, *shape))


def observable_names(family) -> tuple[str, ...]:
    """What an observation at a point may name for ``family``: its unknowns, then its derived scalar fields (read
    off the training range's centre with a zero field, which costs one derivation on the grid)."""
    if not family.has("derived"):
        return tuple(family.unknowns)
    return tuple(observable_fields(family, *_centre(family)))


def quantity_names(family) -> tuple[str, ...]:
    """What an observation with no coordinates may name for ``family``: its quantities (``K_t``), none without the
    ``quantities`` capability."""
    from deepfusion.analysis.derived import quantities

    return tuple(quantities(family, *_centre(family)))


def predict(family, observations: Observations, instances, fields, weights=None):
    """The predictions (S, P) of ``observations`` by the nodal ``fields`` of ``instances``: each row's field
    (:func:`observable_fields`) read at its point by the element's shape functions (``weights``: the observations'
    :meth:`Observations.weights` on the family's grid, computed here when not given); torch in, torch out,
    differentiable in the fields and the instances; numpy in, numpy out."""
    import torch

    from diffnet.grid.points import read_at

    grid = tuple(family.resolution)
    rows = observations.rows()
    weights = observations.weights(grid) if weights is None else weights
    scalars = observable_fields(family, instances, fields, [name for name in rows if name in weights])
    if set(rows) - set(weights):  # quantities: one value per instance, however many rows observe it
        if isinstance(fields, torch.Tensor):
            raise TypeError(f"the {family.name} family's quantities are not differentiable: observed through its "
                            "values (deepfusion.analysis.inverse.differenced_forward)")
        from deepfusion.analysis.derived import quantities

        scalars |= {name: np.repeat(value[:, None], len(rows[name]), axis=1)
                    for name, value in quantities(family, instances, fields).items() if name in rows}
    missing = [name for name in rows if name not in scalars]
    if missing:
        raise ValueError(f"the {family.name} family gives no field {', '.join(missing)} to observe")
    order = np.argsort(np.concatenate(list(rows.values())))
    if not isinstance(fields, torch.Tensor):
        return np.concatenate([read_at(np.asarray(scalars[name]), grid, weights[name]) if name in weights
                               else scalars[name] for name in rows], axis=1)[:, order]
    parts = []
    for name in rows:
        value = scalars[name]
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"the {family.name} family's derived field {name!r} is not a torch tensor of torch inputs: "
                            f"its `derived` must take tensors to be observed (docs/families.md, `differentiable`)")
        parts.append(read_at(value, grid, weights[name]))
    return torch.cat(parts, dim=1)[:, torch.as_tensor(order)]


def read_observations(path: Path, family) -> Observations:
    """The observations of ``path`` for ``family``'s field, checked: every problem a ``ValueError`` of one line naming
    the row (``deepfusion invert`` prints it and exits with status 2)."""
    path = Path(path)
    from diffnet.grid.points import box_text, extent_of

    dims = len(family.resolution)
    axes = ("x", "y", "z")[:dims]
    extent = extent_of(family)
    if not path.is_file():
        raise ValueError(f"--observations: {path}: no such file")
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
            header = tuple(rows[0].keys()) if rows else ()
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise ValueError(f"--observations: {path}: not a readable CSV ({e})") from None
    wanted = (*axes, "output", "value", "sigma")
    if not rows:
        raise ValueError(f"--observations: {path}: no rows (a header {','.join(wanted)} and one row per observation)")
    if set(header) != set(wanted):
        raise ValueError(f"--observations: {path}: the columns must be {','.join(wanted)} for this "
                         f"{dims}-D family, got {','.join(str(h) for h in header)}")
    if len(rows) > MAX_OBSERVATIONS:
        raise ValueError(f"--observations: {path}: {len(rows)} rows, more than {MAX_OBSERVATIONS}")
    observable, scalar = observable_names(family), quantity_names(family)
    points, values, sigma, names = [], [], [], []
    for line, row in enumerate(rows, start=2):
        where = f"--observations: {path}, line {line}"
        name = (row["output"] or "").strip()
        if name not in observable + scalar:
            derived = observable[len(family.unknowns):]
            raise ValueError(f"{where}: output {name!r} is not one of the field's unknowns "
                             f"({', '.join(family.unknowns)})" + (f" nor its derived fields ({', '.join(derived)})"
                                                                  if derived else "")
                             + (f" nor its quantities ({', '.join(scalar)})" if scalar else ""))
        blank = [not (row[k] or "").strip() for k in axes]
        if name in scalar and not all(blank):
            raise ValueError(f"{where}: {name} is a quantity of the whole field: leave {', '.join(axes)} empty")
        try:
            numbers = [float("nan") if name in scalar else float(row[k]) for k in axes] + \
                [float(row[k]) for k in ("value", "sigma")]
        except (TypeError, ValueError):
            raise ValueError(f"{where}: {', '.join(axes)}, value and sigma must be numbers") from None
        if not np.isfinite(numbers[len(axes) if name in scalar else 0:]).all():
            raise ValueError(f"{where}: NaN or Inf")
        *point, value, noise = numbers
        if name not in scalar and not all(0.0 <= c <= e for c, e in zip(point, extent)):
            raise ValueError(f"{where}: the point ({', '.join(f'{c:g}' for c in point)}) lies outside "
                             f"{box_text(extent)}")
        if not noise > 0:
            raise ValueError(f"{where}: sigma must be > 0, got {noise:g}")
        points.append(point)
        values.append(value)
        sigma.append(noise)
        names.append(name)
    return Observations(np.asarray(points), tuple(names), np.asarray(values), np.asarray(sigma), extent)
