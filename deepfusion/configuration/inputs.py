"""Checks on what a user gives us (instance parameters, arrays, output paths, grids), shared by the
commands and the Python API; every failure is an :class:`InputError` with a one-line message."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np

__all__ = ["InputError", "ParameterRangeWarning", "load_array", "instance_parameters", "by_name", "command_line_instances",
           "check_output_file", "check_resolution", "require",
           "dataset_name"]


class InputError(ValueError):
    """Bad input from the user. The command line prints the message as one line and exits with status 2."""


class ParameterRangeWarning(UserWarning):
    """Instance parameters outside the range the network was trained on: the fields are extrapolations."""


def load_array(path: Path, what: str, ndim: tuple[int, ...], max_elements: int = 2**28) -> np.ndarray:
    """A float64 array from a ``.npy`` file (never unpickled), with finite values and an allowed rank."""
    try:
        with open(path, "rb") as fh:
            fmt = np.lib.format
            version = fmt.read_magic(fh)
            read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, _, dtype = read(fh)
    except OSError as exc:
        raise InputError(f"{path}: cannot read {what} ({exc.strerror})") from None
    except ValueError as exc:
        raise InputError(f"{path}: not a .npy file ({exc})") from None
    if dtype.hasobject or dtype.kind not in "fiu":
        raise InputError(f"{path}: {what} must be a numeric array, got dtype {dtype}")
    if len(shape) not in ndim:
        raise InputError(f"{path}: {what} must have {' or '.join(map(str, ndim))} dimensions, got shape {shape}")
    if int(np.prod(shape)) > max_elements or 0 in shape:
        raise InputError(f"{path}: {what} has shape {shape}; expected a non-empty array of at most {max_elements} values")
    return np.load(path, allow_pickle=False).astype(np.float64)


def _numeric(name: str, values, ndim: tuple[int, ...]) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{name}: expected numbers, got {type(values).__name__}") from None
    if arr.ndim not in ndim or arr.size == 0:
        raise InputError(f"{name}: expected a non-empty array of {' or '.join(map(str, ndim))} dimensions, "
                         f"got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise InputError(f"{name}: contains NaN or Inf")
    return arr


def by_name(family, given: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Instances given under the family's own names (its parameter's, e.g. ``k=`` or ``a=``, and its
    field input's, e.g. ``nu=``) as the ``c``/``coeffs``/``nu`` keywords of :func:`instance_parameters`,
    and the names the messages should use for them."""
    spec = family.parameters
    keywords, names = {}, {}
    for name, value in given.items():
        if name == spec.name:
            key = "c" if spec.shape == () else "coeffs"
        elif spec.field and name == spec.field:
            key = "nu"
        else:
            takes = spec.name + (f" or {spec.field}" if spec.field else "")
            raise InputError(f"{name}: this run's family ({family.name}) takes its instances as {takes}")
        keywords[key], names[key] = value, name
    return keywords, names


def command_line_instances(family, c: list[float] | None, coeffs: Path | None, nu: Path | None, param: list[str],
                           nu_ndim: tuple[int, ...]) -> np.ndarray:
    """The checked instances of a command line (``infer``, ``reference``): ``--c`` numbers, ``--coeffs`` and
    ``--nu`` .npy paths, and ``--param NAME=VALUE`` under the family's own names (numbers for a scalar
    parameter, repeatable; a .npy path for a vector one or a field input). A file names its own errors;
    a flag not given is named as the flag that would give it."""
    names = {"c": "--c", "coeffs": str(coeffs or "--coeffs FILE.npy"), "nu": str(nu or "--nu FILE.npy")}
    given = {"c": c, "coeffs": None if coeffs is None else load_array(coeffs, "coefficients", (1, 2, 3, 4)),
             "nu": None if nu is None else load_array(nu, "fields", nu_ndim)}
    scalars: dict[str, list[float]] = {}
    files: dict[str, Path] = {}
    spec = family.parameters
    for item in param:
        name, sep, value = item.partition("=")
        if not (sep and name and value):
            raise InputError(f"--param {item!r}: expected NAME=VALUE")
        if spec.shape == () and name == spec.name:
            try:
                scalars.setdefault(name, []).append(float(value))
            except ValueError:
                raise InputError(f"--param {name}: expected a number, got {value!r}") from None
        elif name in files:
            raise InputError(f"--param {name}: given twice")
        else:
            files[name] = Path(value)
    keywords, named = by_name(family, {**scalars, **files})
    for key, value in keywords.items():
        label = f"--param {named[key]}" if key == "c" else str(value)
        if given[key] is not None:
            raise InputError(f"{label}: the instances are given twice (also as --{key})")
        names[key] = label
        given[key] = value if key == "c" else \
            load_array(value, "coefficients" if key == "coeffs" else "fields", (1, 2, 3, 4) if key == "coeffs" else nu_ndim)
    return instance_parameters(family, **given, names=names)


def instance_parameters(family, c=None, coeffs=None, nu=None, names: dict[str, str] | None = None) -> np.ndarray:
    """The instances to solve as one array, checked against the family's :class:`~diffnet.protocol.family.ParameterSpec`.

    A family with a scalar parameter takes ``c`` (S,); one with a vector parameter takes
    ``coeffs`` (S, *shape) rows; one that declares a field input (``spec.field``, e.g.
    the diffusivity) also takes ``nu`` (S, *resolution) positive nodal fields instead. One
    row or one field may drop the leading axis. An instance the family finds invalid
    (:meth:`~diffnet.protocol.family.Family.check_instances`) raises :class:`InputError` naming its index;
    values outside the training range raise a :class:`ParameterRangeWarning`. ``names`` maps ``c``/``coeffs``/``nu`` to what the
    caller calls them in messages (the CLI: ``--c``, a file).
    """
    names = {"c": "c", "coeffs": "coeffs", "nu": "nu"} | (names or {})
    spec = family.parameters
    given = [k for k, v in (("c", c), ("coeffs", coeffs), ("nu", nu)) if v is not None]
    takes = ["c"] if spec.shape == () else ["coeffs"]
    takes += ["nu"] if spec.field else []
    what = {"c": f"{names['c']} ({spec.description or spec.name})",
            "coeffs": f"{names['coeffs']} (rows of {spec.description or spec.name})",
            "nu": f"{names['nu']} (nodal {spec.field} fields)"}
    wrong = [k for k in given if k not in takes]
    if wrong or len(given) != 1:
        head = f"{names[wrong[0]]}: " if wrong else ""
        raise InputError(f"{head}this run's family ({family.name}) takes exactly one of " +
                         " or ".join(what[k] for k in takes))
    if nu is not None:
        field = _numeric(names["nu"], nu, (len(family.resolution), len(family.resolution) + 1))
        field = field if field.ndim == len(family.resolution) + 1 else field[None]
        if field.shape[1:] != tuple(family.resolution):
            raise InputError(f"{names['nu']}: fields must be {tuple(family.resolution)} (the run's resolution), "
                             f"got {field.shape[1:]}")
        if not (field > 0).all():
            raise InputError(f"{names['nu']}: {spec.field} must be > 0 everywhere (min {field.min():g})")
        return field
    key = given[0]
    rank = len(spec.shape)
    arr = _numeric(names[key], c if key == "c" else coeffs, (rank, rank + 1))
    arr = arr if arr.ndim == rank + 1 else arr[None]
    if arr.shape[1:] != tuple(spec.shape):
        raise InputError(f"{names[key]}: each instance must have shape {tuple(spec.shape)} "
                         f"({spec.description or spec.name}), got {arr.shape[1:]}")
    try:
        family.check_instances(arr)
    except ValueError as e:
        raise InputError(f"{names[key]}: {e}") from None
    low, high = spec.bounds()
    outside = (arr < low) | (arr > high)
    if outside.any():
        index = tuple(int(i) for i in np.argwhere(outside)[0])
        value, where = arr[index], index[1:]
        text = (f"{value:g} is outside the training range [{spec.low:g}, {spec.high:g}]" if not spec.per_entry else
                f"{value:g} ({spec.entry(where)}) is outside its training range [{low[where]:g}, {high[where]:g}]")
        warnings.warn(f"{names[key]}: {text}; the field is an extrapolation", ParameterRangeWarning, stacklevel=3)
    return arr


def dataset_name(family, instances: np.ndarray) -> str:
    """The field-file dataset an instance array goes by: the family's field input (e.g. ``nu``) for
    nodal fields, else its parameter's name (e.g. ``c``, ``a``)."""
    spec = family.parameters
    return spec.field if spec.field and instances.ndim == len(family.resolution) + 1 else spec.name


def require(family, capability: str, what: str) -> None:
    """Refuse, in one line, a command or option that needs a capability the family does not declare (the
    capability's description is its protocol's: :func:`diffnet.protocol.capabilities.describe`)."""
    from diffnet.protocol.capabilities import describe

    if not family.has(capability):
        raise InputError(f"{what}: the {family.name} family (as configured) does not declare the {capability!r} "
                         f"capability ({describe(capability)}; see docs/families.md)")


def check_output_file(path: Path, suffixes: tuple[str, ...] = (".h5", ".hdf5"), what: str = "field files are HDF5") -> None:
    """``--out`` of infer/reference/compare: a file name with one of ``suffixes``, in a place that is not a directory."""
    if path.suffix not in suffixes:
        raise InputError(f"--out: {path}: {what}; give a name ending in {suffixes[0]}")
    if path.is_dir():
        raise InputError(f"--out: {path} is a directory")
    if any(parent.exists() and not parent.is_dir() for parent in path.parents):
        raise InputError(f"--out: {path}: a parent is not a directory")


def check_resolution(resolution: Sequence[int]) -> None:
    if any(n < 3 or n > 16385 for n in resolution):
        raise InputError(f"--resolution: each count must be in 3..16385, got {list(resolution)}")
