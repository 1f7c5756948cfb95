"""Checks on what a user gives us (instance parameters, arrays, output paths, grids), shared by the
commands and the Python API; every failure is an :class:`InputError` with a one-line message."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path
from typing import Sequence

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
    if getattr(values, "requires_grad", False):  # a torch tensor in an autograd graph: numpy() would raise inside torch
        raise InputError(f"{name}: a tensor that requires grad; for fields differentiable in the instances call "
                         "Surrogate.evaluate(tensor) (or pass tensor.detach() for values only)")
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


def _takes(spec) -> str:
    """How a family takes its instances, for messages: ``a (rows), nu (fields)`` or by entry."""
    ways = [spec.name if spec.shape == () else f"{spec.name} (rows of {', '.join(map(str, spec.shape))})"]
    ways += [f"its entries by name ({', '.join(spec.names)})"] if spec.names else []
    ways += [f"{spec.field} (nodal fields)"] if spec.field else []
    return " or ".join(ways)


# The generic keywords of earlier versions, refused with the family's own names (CHANGELOG.md).
_RETIRED = ("coeffs",)


def by_name(family, given: dict[str, object]) -> tuple[dict[str, object], dict[str, str]]:
    """Instances given under the family's own names as the ``scalars``/``rows``/``fields`` keywords of
    :func:`instance_parameters`, and the names the messages should use for them.

    The names (:class:`~diffnet.protocol.family.ParameterSpec`): the parameter's (``c=[3.5, 4.0]`` for a scalar one,
    ``a=rows`` for a vector one), its entries' (``hole_x=[...], hole_y=[...], hole_r=[...], nu=[...]``: every entry,
    each a number or one per instance, a number standing for every instance) and the field input's (``nu=fields``).

    Parameters
    ----------
    family : Family
        The run's family (its :class:`~diffnet.protocol.family.ParameterSpec`).
    given : dict
        Name -> values, as the user gave them.

    Returns
    -------
    keywords : dict
        ``scalars``, ``rows`` or ``fields`` -> the values, for :func:`instance_parameters`.
    names : dict
        The same keys -> what the messages call them.

    Raises
    ------
    InputError
        A name the family does not have, an entry missing, entries of different lengths, a value twice.
    """
    spec = family.parameters
    if not given:
        raise InputError(f"this run's family ({family.name}) takes its instances as {_takes(spec)}")
    keywords, names, entries = {}, {}, {}
    for name, value in given.items():
        if name in spec.names and name != spec.field:
            entries[name] = value
            continue
        if name == spec.name:
            key = "scalars" if spec.shape == () else "rows"
        elif spec.field and name == spec.field:
            key = "fields"
        else:
            retired = f" (the generic {name!r} of earlier versions is retired)" if name in _RETIRED else ""
            raise InputError(f"{name}: this run's family ({family.name}) takes its instances as {_takes(spec)}{retired}")
        keywords[key], names[key] = value, name
    if entries:
        if "rows" in keywords:
            raise InputError(f"{next(iter(entries))}: the instances are given twice (also as {names['rows']})")
        keywords["rows"], names["rows"] = _rows(spec, entries), ", ".join(entries)
    return keywords, names


def _rows(spec, entries: dict[str, object]) -> np.ndarray:
    """Instance rows of a vector parameter from its entries by name: each a number or one number per instance."""
    missing = [name for name in spec.names if name not in entries]
    if missing:
        raise InputError(f"{', '.join(missing)}: give every entry of {spec.name} by name ({', '.join(spec.names)}); "
                         f"missing {', '.join(missing)}")
    columns = {name: np.atleast_1d(_numeric(name, entries[name], (0, 1))) for name in spec.names}
    counts = {len(v) for v in columns.values()} - {1}
    if len(counts) > 1:
        listed = ", ".join(f"{name} {len(v)}" for name, v in columns.items())
        raise InputError(f"{spec.name}: its entries give different numbers of instances ({listed}); give each one "
                         "number per instance, or one for all")
    count = counts.pop() if counts else 1
    return np.stack([np.broadcast_to(columns[name], (count,)) for name in spec.names], axis=1).reshape(count, *spec.shape)


def command_line_instances(family, args: argparse.Namespace, nu_ndim: tuple[int, ...]) -> np.ndarray:
    """The checked instances of a command line (``infer``, ``reference``, whose parsers :mod:`deepfusion.cli` gives
    the flags): ``--param NAME=VALUE`` under the family's own names (a number for a scalar parameter or an entry,
    repeatable, one instance each; a .npy path for a vector parameter's rows or a field input), and the shorthand
    flags ``--c`` and ``--nu``, each the family's own name or refused. A file names its own errors."""
    flags = {name: getattr(args, name) for name in ("c", "nu", *_RETIRED) if getattr(args, name, None) is not None}
    param = list(args.param or [])
    spec = family.parameters
    numbers = ({spec.name} if spec.shape == () else set()) | {n for n in spec.names if n != spec.field}
    scalars: dict[str, list[float]] = {}
    files: dict[str, Path] = {}
    labels: dict[str, str] = {}
    for flag, value in flags.items():
        if flag in _RETIRED:
            raise InputError(f"--{flag}: retired; give the instances under the {family.name} family's own names, "
                             f"--param NAME=VALUE: {_takes(spec)}")
        if flag not in numbers | {spec.name, spec.field}:
            raise InputError(f"--{flag}: not a name of this run's family ({family.name}), which takes its instances "
                             f"as {_takes(spec)} (--param NAME=VALUE)")
        if (flag in numbers) != (flag == "c"):  # --c gives numbers, --nu a file of nodal fields
            raise InputError(f"--{flag}: this run's family's {flag} is {'a number' if flag in numbers else 'a file'}; "
                             f"give it as --param {flag}={'VALUE' if flag in numbers else 'FILE.npy'}")
        if flag in numbers:
            scalars[flag], labels[flag] = list(value), f"--{flag}"
        else:
            files[flag], labels[flag] = Path(value), str(value)
    for item in param:
        name, sep, value = item.partition("=")
        if not (sep and name and value):
            raise InputError(f"--param {item!r}: expected NAME=VALUE")
        if name in flags:
            raise InputError(f"--param {name}: the instances are given twice (also as --{name})")
        if name in numbers:
            try:
                scalars.setdefault(name, []).append(float(value))
            except ValueError:
                raise InputError(f"--param {name}: expected a number, got {value!r}") from None
            labels[name] = f"--param {name}"
        elif name in files:
            raise InputError(f"--param {name}: given twice")
        else:
            files[name], labels[name] = Path(value), str(value)
    for name, path in files.items():
        if name in (spec.name, spec.field):
            files[name] = load_array(path, "fields" if name == spec.field else "instance rows",
                                     nu_ndim if name == spec.field else (1, 2, 3, 4))
    keywords, named = by_name(family, {**scalars, **files})
    names = {key: labels.get(named[key], named[key]) for key in keywords}
    if len(keywords) > 1 or not keywords:
        raise InputError(f"this run's family ({family.name}) takes its instances as {_takes(spec)}, one way at a "
                         f"time (--param NAME=VALUE)")
    return instance_parameters(family, **keywords, names=names)


def instance_parameters(family, scalars=None, rows=None, fields=None, names: dict[str, str] | None = None) -> np.ndarray:
    """The instances to solve as one array, checked against the family's :class:`~diffnet.protocol.family.ParameterSpec`.

    A family with a scalar parameter takes ``scalars`` (S,); one with a vector parameter takes
    ``rows`` (S, *shape); one that declares a field input (``spec.field``, e.g.
    the diffusivity) also takes ``fields`` (S, *resolution) positive nodal fields instead. One
    row or one field may drop the leading axis. An instance the family finds invalid
    (:meth:`~diffnet.protocol.family.Family.check_instances`) raises :class:`InputError` naming its index;
    values outside the training range raise a :class:`ParameterRangeWarning`. ``names`` maps ``scalars``/``rows``/``fields`` to what
    the caller calls them in messages (the family's own names, the CLI's ``--param c``, a file; :func:`by_name`).
    """
    names = {"scalars": "scalars", "rows": "rows", "fields": "fields"} | (names or {})
    spec = family.parameters
    given = [k for k, v in (("scalars", scalars), ("rows", rows), ("fields", fields)) if v is not None]
    takes = ["scalars"] if spec.shape == () else ["rows"]
    takes += ["fields"] if spec.field else []
    what = {"scalars": f"{names['scalars']} ({spec.description or spec.name})",
            "rows": f"{names['rows']} (rows of {spec.description or spec.name})",
            "fields": f"{names['fields']} (nodal {spec.field} fields)"}
    wrong = [k for k in given if k not in takes]
    if wrong or len(given) != 1:
        head = f"{names[wrong[0]]}: " if wrong else ""
        raise InputError(f"{head}this run's family ({family.name}) takes exactly one of " +
                         " or ".join(what[k] for k in takes))
    if fields is not None:
        field = _numeric(names["fields"], fields, (len(family.resolution), len(family.resolution) + 1))
        field = field if field.ndim == len(family.resolution) + 1 else field[None]
        if field.shape[1:] != tuple(family.resolution):
            raise InputError(f"{names['fields']}: fields must be {tuple(family.resolution)} (the run's resolution), "
                             f"got {field.shape[1:]}")
        if not (field > 0).all():
            raise InputError(f"{names['fields']}: {spec.field} must be > 0 everywhere (min {field.min():g})")
        return field
    key = given[0]
    rank = len(spec.shape)
    arr = _numeric(names[key], scalars if key == "scalars" else rows, (rank, rank + 1))
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
