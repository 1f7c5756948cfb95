"""Run configuration: the schema's dataclasses (:mod:`deepfusion.configuration.schema`) loaded from TOML, with --set
overrides and the checks that involve several keys; written back as TOML."""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
import typing
from pathlib import Path

from deepfusion.configuration.registry import DEFAULT_FAMILY
from deepfusion.configuration.schema import RENAMED_KEYS, Config, ConfigError, ProblemConfig, first_order, has_lbfgs
from deepfusion.configuration.split import check_split, split_of

__all__ = [
    "load_config",
    "family_table",
    "config_from_dict",
    "parse_override",
    "to_toml",
    "toml_value",
]

# The engine's own sections; the family's table (named after the family) is added per config.
_SECTIONS: dict[str, type] = {k: v for k, v in typing.get_type_hints(Config).items() if k != "family_keys"}
_COMMON = tuple(f.name for f in dataclasses.fields(ProblemConfig))


def _coerce(key: str, value: object, hint: object) -> object:
    """Check ``value`` against the annotation ``hint``; ints are accepted for floats."""
    origin = typing.get_origin(hint)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {_show(value)}")
        (elem, _) = typing.get_args(hint)
        return tuple(_coerce(key, v, elem) for v in value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {_show(value)}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {_show(value)}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {_show(value)}")
        if not math.isfinite(value):
            raise ConfigError(f"{key}: must be finite, got {value}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {_show(value)}")
        return value
    raise TypeError(f"unsupported config type {hint}")  # a programming error, not user input


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _build_section(section: str, values: dict[str, object], cls: type | None = None) -> object:
    cls = cls or _SECTIONS[section]
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        name = f"{section}.{key}"
        if key not in known:
            raise ConfigError(f"{name}: unknown key (known: {', '.join(sorted(known))})")
        value = _coerce(name, value, hints[key])
        check = known[key].metadata.get("check")
        error = check(value) if check else None
        if error:
            raise ConfigError(f"{name}: {error} (got {_show(value)})")
        kwargs[key] = value
    return cls(**kwargs)


def _cross_checks(cfg: Config, family: type) -> None:
    """Constraints that involve more than one key."""
    if len(cfg.problem.resolution) != family.dims:
        raise ConfigError(f"problem.resolution: the {family.name} family is {family.dims}-D and needs {family.dims} "
                          f"node counts (got {list(cfg.problem.resolution)})")
    if cfg.data.sampling not in family.samplings:
        raise ConfigError(f"data.sampling: the {family.name} family samples its instances by "
                          f"{', '.join(family.samplings)} (got {cfg.data.sampling!r})")
    t = cfg.train
    if t.lbfgs_batch > cfg.data.n_train:
        raise ConfigError(f"train.lbfgs_batch: must be <= data.n_train ({cfg.data.n_train}) (got {t.lbfgs_batch})")
    if has_lbfgs(t.optimizer) and t.lbfgs_mode == "multibatch":
        mb = t.lbfgs_batch or t.batch_size
        if mb <= 2 * t.lbfgs_overlap:
            raise ConfigError(
                f"train.lbfgs_overlap: multi-batch L-BFGS needs a batch ({mb}) larger than twice the overlap "
                f"(got {t.lbfgs_overlap})"
            )
    if cfg.model.sweeps and not cfg.model.coarse_correction:
        raise ConfigError(f"model.sweeps: the sweeps follow the coarse correction (its fine operator); set "
                          f"model.coarse_correction (e.g. 17) or use 0 (got {cfg.model.sweeps})")
    if cfg.model.cycles > 1 and not cfg.model.sweeps:
        raise ConfigError(f"model.cycles: repeating the exact coarse correction without sweeps between changes "
                          f"nothing; set model.sweeps (e.g. 8) or use 1 (got {cfg.model.cycles})")
    if cfg.model.polish and cfg.train.second_stage_epochs:
        raise ConfigError(f"model.polish: a second stage trains through the product, and the polish step has no "
                          f"gradient; use 0 with train.second_stage_epochs (got {cfg.model.polish})")
    if cfg.train.batch_size > cfg.data.n_train:
        raise ConfigError(
            f"train.batch_size: must be <= data.n_train ({cfg.data.n_train}) (got {cfg.train.batch_size})"
        )
    _multigrid_checks(cfg)
    par = cfg.parallel
    if par.device != "cuda":
        for key, value, default in (("gpu_reduce", par.gpu_reduce, "auto"), ("tf32", par.tf32, False),
                                    ("cuda_graphs", par.cuda_graphs, False)):
            if value != default:
                raise ConfigError(f"parallel.{key}: applies to parallel.device = 'cuda' only (got {_show(value)})")
    if split_of(cfg) is not None:
        _domain_checks(cfg, family)
    if par.cuda_graphs and has_lbfgs(cfg.train.optimizer):
        raise ConfigError("parallel.cuda_graphs: the graphed step is a first-order one; use train.optimizer = "
                          "'adam' or 'sgd'")


def _domain_checks(cfg: Config, family: type) -> None:
    """A domain split that can train (:func:`deepfusion.configuration.split.check_split`)."""
    try:
        check_split(cfg, family.dims)
    except ValueError as e:
        raise ConfigError(f"parallel.domain: {e}") from None


def _multigrid_checks(cfg: Config) -> None:
    mg, res = cfg.multigrid, tuple(cfg.problem.resolution)
    n = len(mg.levels)
    if n == 0:  # one level: the per-level lists are unused, so `--set multigrid.levels=[]` alone turns it off
        return
    for key in ("epochs", "lr", "batch_size"):
        given = len(getattr(mg, key))
        if given not in (0, n):
            raise ConfigError(f"multigrid.{key}: give one value per level of multigrid.levels ({n}), or none "
                              f"(got {given})")
    if len(set(res)) != 1 or res[0] != mg.levels[-1]:
        raise ConfigError(f"multigrid.levels: the last level must be the square (cubic) problem.resolution "
                          f"(got levels {list(mg.levels)} for resolution {list(res)})")
    if first_order(cfg.train.optimizer) is None:
        raise ConfigError("train.optimizer: multigrid levels are trained by Adam or SGD; use 'adam', 'sgd', or "
                          "'adam+lbfgs' for L-BFGS on the finest grid after them")
    for b in mg.batch_size:
        if b > cfg.data.n_train:
            raise ConfigError(f"multigrid.batch_size: must be <= data.n_train ({cfg.data.n_train}) (got {b})")


def _family(data: dict[str, object]) -> type:
    from deepfusion.configuration.registry import FamilyError, family_class

    spec = data.get("problem", {}).get("family", DEFAULT_FAMILY)
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"problem.family: expected a family name or 'package.module:Class', got {_show(spec)}")
    try:
        family = family_class(spec)
    except FamilyError as e:
        raise ConfigError(str(e)) from None
    if not (isinstance(family.name, str) and family.name.isidentifier()) or family.name in _SECTIONS:
        raise ConfigError(f"problem.family: {spec!r} is named {family.name!r}, which cannot name its config table "
                          f"(an identifier other than {', '.join(_SECTIONS)})")
    return family


def _move_family_keys(data: dict[str, object], family: type, saved: bool) -> None:
    """Keys of the family found in ``[problem]`` move to the family's table when the file is of the
    flat layout before families had tables (``problem.name``); in a file of that layout stored by
    a run (``saved``) the other families' keys, which it listed too, are dropped. Any key left in
    ``[problem]`` that is not a common one is refused by name."""
    section, table = data["problem"], data.setdefault(family.name, {})
    own = {f.name for f in dataclasses.fields(family.Options)}
    legacy = "name" in section
    for key in [k for k in section if k not in _COMMON]:
        if legacy and key in own and key in table and not saved:  # never one of two places in silence
            raise ConfigError(f"problem.{key}: the older layout's place of {family.name}.{key}, which is given "
                              f"too; set only {family.name}.{key}")
        if legacy and key in own:
            table.setdefault(key, section.pop(key))
        elif legacy and (saved or key == "name"):
            section.pop(key)
        elif key in own:
            raise ConfigError(f"problem.{key}: a key of the {family.name} family; set it in its table "
                              f"[{family.name}] ({family.name}.{key})")
        else:
            raise ConfigError(f"problem.{key}: not a key of [problem] ({', '.join(_COMMON)}) nor of the "
                              f"{family.name} family ({', '.join(sorted(own))})")


def _renamed_keys(data: dict[str, dict], saved: bool) -> None:
    """A key under its earlier name (:data:`~deepfusion.configuration.schema.RENAMED_KEYS`): refused in one line naming
    the new one, or, in a run's own stored config (``saved``), read under the new name."""
    for old, new in RENAMED_KEYS.items():
        section, key = old.split(".")
        table = data.get(section, {})
        if key not in table:
            continue
        if not saved:
            raise ConfigError(f"{old}: the earlier name of {new}; set {new} (CHANGELOG.md)")
        new_section, new_key = new.split(".")
        data.setdefault(new_section, {}).setdefault(new_key, table.pop(key))


def config_from_dict(data: dict[str, object], *, saved: bool = False) -> Config:
    """Validate a nested ``{section: {key: value}}`` mapping and build a :class:`Config`.

    ``[problem]`` names the family; its keys are in the table of the family's name. A file
    of the older flat layout (``problem.name``, the family's keys in ``[problem]``) is read
    too; ``saved`` marks one written by a run, whose ``[problem]`` listed every family's keys.
    """
    from deepfusion.configuration.registry import known_families

    for section, values in data.items():
        if not isinstance(values, dict):
            raise ConfigError(f"{section}: must be a table of keys, got {_show(values)}")
    data = {section: dict(values) for section, values in data.items()}
    problem = data.setdefault("problem", {})
    if "name" in problem and "family" in problem and not saved:
        raise ConfigError(f"problem.name: the older layout's name of problem.family, given beside it "
                          f"(problem.name = {_show(problem['name'])}, problem.family = {_show(problem['family'])}); "
                          "set only problem.family")
    if "name" in problem and "family" not in problem:
        problem["family"] = problem["name"]
    _renamed_keys(data, saved)
    family = _family(data)
    _move_family_keys(data, family, saved)
    sections = {}
    for section, values in data.items():
        if section == family.name:
            continue
        if section not in _SECTIONS:
            if section in known_families():
                raise ConfigError(f"{section}: the table of another family (problem.family is "
                                  f"{problem.get('family', DEFAULT_FAMILY)!r}, whose keys go in [{family.name}])")
            raise ConfigError(f"{section}: unknown section (known: {', '.join(_SECTIONS)}, {family.name})")
        sections[section] = _build_section(section, values)
    cfg = Config(**sections, family_keys=_build_section(family.name, data[family.name], family.Options))
    _cross_checks(cfg, family)
    return cfg


def parse_override(text: str) -> tuple[str, str, object]:
    """Parse ``section.key=value``; the value is a TOML literal, or else a bare string."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected section.key=value")
    lhs, rhs = text.split("=", 1)
    parts = lhs.strip().split(".")
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"--set {text!r}: expected section.key=value")
    try:
        value = tomllib.loads(f"v = {rhs.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = rhs.strip()
    return parts[0], parts[1], value


def load_config(path: str | Path | None, overrides: list[str] = (), *, saved: bool = False) -> Config:
    """Read a TOML config (or start from defaults when ``path`` is None) and apply overrides.

    The keys are checked here (each key's own check and the checks among keys); the family's own checks, which
    run its code, run when the :class:`~deepfusion.configuration.run.Run` is built.

    Parameters
    ----------
    path : str, Path or None
        The TOML file.
    overrides : list of str
        ``section.key=value`` each, the value a TOML literal (``--set``).
    saved : bool
        A run's own resolved config (see :func:`config_from_dict`).

    Returns
    -------
    Config

    Raises
    ------
    ConfigError
        One line naming the key and what is wrong.
    """
    data: dict[str, object] = {}
    if path is not None:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read config ({exc.strerror})") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{path}: not a UTF-8 text file") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML ({exc})") from None
    for text in overrides:
        section, key, value = parse_override(text)
        table = data.setdefault(section, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{section}: must be a table of keys")
        table[key] = value
    return config_from_dict(data, saved=saved)


def defaults_notice(path: str | Path | None, overrides: list[str], cfg: Config) -> str:
    """The lines a config's reader is told: that it is of the older flat layout, read as the current one, and the
    family keys it took as defaults because it gave none of them (no table of the family, no flat-layout keys, no
    ``--set``); '' when neither."""
    data = tomllib.loads(Path(path).read_text(encoding="utf-8")) if path is not None else {}
    table = family_table(cfg)
    flat = {k for k in data.get("problem", {}) if k not in _COMMON}
    lines = [f"{path}: the older flat layout ({', '.join(f'problem.{k}' for k in sorted(flat))}), read as "
             f"problem.family and the table [{table}]; write it so (CHANGELOG.md)"] if flat else []
    given = set(data.get(table, {})) | (flat - {"name"})
    given |= {key for section, key, _ in map(parse_override, overrides) if section == table}
    if not given and cfg.family_keys is not None:
        values = ", ".join(f"{f.name} = {toml_value(getattr(cfg.family_keys, f.name))}"
                           for f in dataclasses.fields(cfg.family_keys))
        lines.append(f"{table}: the config has no [{table}] table; the family's defaults: {values}")
    return "\n".join(lines)


def family_table(cfg: Config) -> str:
    """The name of the config's family table (the family's ``name``)."""
    from deepfusion.configuration.registry import family_class

    return family_class(cfg.problem.family).name


def toml_value(value: object) -> str:
    """One value in TOML syntax."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are valid TOML basic strings
    if isinstance(value, tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def to_toml(cfg: Config) -> str:
    """The fully resolved config as TOML text that :func:`load_config` reads back unchanged."""
    lines = []
    for section in ("problem", family_table(cfg), *list(_SECTIONS)[1:]):
        lines.append(f"[{section}]")
        obj = cfg.family_keys if section == family_table(cfg) else getattr(cfg, section)
        for f in dataclasses.fields(obj):
            lines.append(f"{f.name} = {toml_value(getattr(obj, f.name))}")
        lines.append("")
    return "\n".join(lines)
