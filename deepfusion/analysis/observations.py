"""Observations of a field at points, for an inverse problem: a CSV of ``x,y[,z],output,value,sigma`` read and checked.

Each row observes one unknown of the family's field (``output``: ``u``, or ``u_x``, ``u_y``, ... for several
unknowns) at a point of the unit square or cube, with its value and the standard deviation of its Gaussian noise.
The field is read at the point by the element's shape functions (:mod:`diffnet.grid.points`). Derived fields and
quantities of interest are not differentiable in the instances yet, and are refused in one line.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["Observations", "read_observations", "MAX_OBSERVATIONS"]

MAX_OBSERVATIONS = 100_000


@dataclass(frozen=True)
class Observations:
    """Values of a field's unknowns at points: ``points`` (P, d) x first, ``unknown`` (P,) the index of the observed
    unknown, ``values`` and ``sigma`` (P,)."""

    points: np.ndarray
    unknown: np.ndarray
    values: np.ndarray
    sigma: np.ndarray
    names: tuple[str, ...]  # the observed unknown of each row, as written

    def __len__(self) -> int:
        return len(self.values)


def read_observations(path: Path, family) -> Observations:
    """The observations of ``path`` for ``family``'s field, checked: every problem a ``ValueError`` of one line naming
    the row (``deepfusion invert`` prints it and exits with status 2)."""
    path = Path(path)
    dims = len(family.resolution)
    axes = ("x", "y", "z")[:dims]
    unknowns = tuple(family.unknowns)
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
    points, unknown, values, sigma, names = [], [], [], [], []
    for line, row in enumerate(rows, start=2):
        where = f"--observations: {path}, line {line}"
        name = (row["output"] or "").strip()
        if name not in unknowns:
            others = f"; derived fields and quantities ({name}) are not differentiable in the instances yet" \
                if name and family.has("derived") else ""
            raise ValueError(f"{where}: output {name!r} is not one of the field's unknowns "
                             f"({', '.join(unknowns)}){others}")
        try:
            numbers = [float(row[k]) for k in (*axes, "value", "sigma")]
        except (TypeError, ValueError):
            raise ValueError(f"{where}: {', '.join(axes)}, value and sigma must be numbers") from None
        if not np.isfinite(numbers).all():
            raise ValueError(f"{where}: NaN or Inf")
        *point, value, noise = numbers
        if not all(0.0 <= c <= 1.0 for c in point):
            raise ValueError(f"{where}: the point ({', '.join(f'{c:g}' for c in point)}) lies outside the unit "
                             f"{'square' if dims == 2 else 'cube'}")
        if not noise > 0:
            raise ValueError(f"{where}: sigma must be > 0, got {noise:g}")
        points.append(point)
        unknown.append(unknowns.index(name))
        values.append(value)
        sigma.append(noise)
        names.append(name)
    return Observations(np.asarray(points), np.asarray(unknown), np.asarray(values), np.asarray(sigma), tuple(names))
