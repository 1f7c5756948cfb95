"""Run configuration: the schema's dataclasses (:mod:`deepfusion.schema`) loaded from TOML, with --set
overrides and the checks that involve several keys; written back as TOML."""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
import typing
from pathlib import Path
from typing import Any

from deepfusion.schema import (Config, ConfigError, DataConfig, ModelConfig, MultigridConfig, OutputConfig,
                               ParallelConfig, ProblemConfig, TrainConfig)

__all__ = [
    "ConfigError",
    "Config",
    "ProblemConfig",
    "DataConfig",
    "ModelConfig",
    "TrainConfig",
    "ParallelConfig",
    "OutputConfig",
    "MultigridConfig",
    "load_config",
    "config_from_dict",
    "parse_override",
    "to_toml",
    "toml_value",
]

_SECTIONS: dict[str, type] = typing.get_type_hints(Config)


def _coerce(key: str, value: Any, hint: Any) -> Any:
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


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _build_section(section: str, values: dict[str, Any]) -> Any:
    cls = _SECTIONS[section]
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        name = f"{section}.{key}"
        if key not in known:
            raise ConfigError(f"{name}: unknown key (known: {', '.join(sorted(known))})")
        value = _coerce(name, value, hints[key])
        check = known[key].metadata.get("check")
        problem = check(value) if check else None
        if problem:
            raise ConfigError(f"{name}: {problem} (got {_show(value)})")
        kwargs[key] = value
    return cls(**kwargs)


def _cross_checks(cfg: Config) -> None:
    """Constraints that involve more than one key."""
    if cfg.problem.name != "burgers":
        if cfg.data.sampling == "list":
            raise ConfigError("data.sampling: 'list' is for Burgers (problem.c_values); use uniform, random or sobol")
        m, n = cfg.problem.kl_terms, cfg.data.n_train
        if cfg.data.sampling == "uniform" and round(n ** (1.0 / m)) ** m != n:
            raise ConfigError(
                f"data.n_train: uniform sampling of {m} coefficients is a tensor grid and needs "
                f"n_train = k^{m} (got {n}); use sampling = 'sobol' or 'random'"
            )
        if cfg.problem.name == "poisson" and cfg.problem.diffusivity == "constant":
            raise ConfigError("problem.diffusivity: 'constant' leaves Poisson with a single solution u = 1 - x; use 'kl'")
        if cfg.problem.diffusivity == "constant" and cfg.problem.viscosity <= 0:
            raise ConfigError("problem.viscosity: the constant diffusivity must be > 0 (got 0)")
    if cfg.data.sampling == "list":
        if not cfg.problem.c_values:
            raise ConfigError("problem.c_values: must list the training c when data.sampling = 'list'")
        if len(cfg.problem.c_values) != cfg.data.n_train:
            raise ConfigError(
                f"data.n_train: must equal the length of problem.c_values "
                f"({len(cfg.problem.c_values)}) when data.sampling = 'list' (got {cfg.data.n_train})"
            )
    if cfg.problem.preconditioner != "none" and cfg.problem.residual != "conservative":
        raise ConfigError(f"problem.preconditioner: applies to the conservative Burgers residual "
                          f"(problem.residual = 'conservative'; got {cfg.problem.residual!r})")
    t = cfg.train
    if t.lbfgs_batch > cfg.data.n_train:
        raise ConfigError(f"train.lbfgs_batch: must be <= data.n_train ({cfg.data.n_train}) (got {t.lbfgs_batch})")
    if "lbfgs" in t.optimizer and t.lbfgs_mode == "multibatch":
        mb = t.lbfgs_batch or t.batch_size
        if mb <= 2 * t.lbfgs_overlap:
            raise ConfigError(
                f"train.lbfgs_overlap: multi-batch L-BFGS needs a batch ({mb}) larger than twice the overlap "
                f"(got {t.lbfgs_overlap})"
            )
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
    if par.cuda_graphs and cfg.train.optimizer not in ("adam", "sgd"):
        raise ConfigError("parallel.cuda_graphs: the graphed step is a first-order one; use train.optimizer = "
                          "'adam' or 'sgd'")


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
    if res[0] != res[1] or res[0] != mg.levels[-1]:
        raise ConfigError(f"multigrid.levels: the last level must be the square problem.resolution "
                          f"(got levels {list(mg.levels)} for resolution {list(res)})")
    if cfg.train.optimizer == "lbfgs":
        raise ConfigError("train.optimizer: multigrid levels are trained by Adam or SGD; use 'adam', 'sgd', or "
                          "'adam+lbfgs' for L-BFGS on the finest grid after them")
    for b in mg.batch_size:
        if b > cfg.data.n_train:
            raise ConfigError(f"multigrid.batch_size: must be <= data.n_train ({cfg.data.n_train}) (got {b})")


def config_from_dict(data: dict[str, Any]) -> Config:
    """Validate a nested ``{section: {key: value}}`` mapping and build a :class:`Config`."""
    sections = {}
    for section, values in data.items():
        if section not in _SECTIONS:
            raise ConfigError(f"{section}: unknown section (known: {', '.join(_SECTIONS)})")
        if not isinstance(values, dict):
            raise ConfigError(f"{section}: must be a table of keys, got {_show(values)}")
        sections[section] = _build_section(section, values)
    cfg = Config(**sections)
    _cross_checks(cfg)
    return cfg


def parse_override(text: str) -> tuple[str, str, Any]:
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


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """Read a TOML config (or start from defaults when ``path`` is None) and apply overrides."""
    data: dict[str, Any] = {}
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
    return config_from_dict(data)


def toml_value(value: Any) -> str:
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
    for section in _SECTIONS:
        lines.append(f"[{section}]")
        obj = getattr(cfg, section)
        for f in dataclasses.fields(obj):
            lines.append(f"{f.name} = {toml_value(getattr(obj, f.name))}")
        lines.append("")
    return "\n".join(lines)
