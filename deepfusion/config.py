"""Run configuration: frozen dataclasses loaded from TOML, --set overrides, validation."""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
]


class ConfigError(ValueError):
    """A user-supplied configuration value is unknown, mistyped or impossible."""


def _choice(*allowed: str):
    def check(v: str) -> str | None:
        return None if v in allowed else f"must be one of {list(allowed)}"

    return check


def _positive(v: float) -> str | None:
    return None if v > 0 else "must be > 0"


def _nonnegative(v: float) -> str | None:
    return None if v >= 0 else "must be >= 0"


def _resolution(v: tuple[int, ...]) -> str | None:
    if len(v) != 2 or any(n < 3 for n in v):
        return "must be two node counts, each >= 3, e.g. [64, 64]"
    if any(n > 16385 for n in v):
        return "must be at most 16385 nodes per side"
    return None


def _range(v: tuple[float, ...]) -> str | None:
    if len(v) != 2 or not v[0] < v[1]:
        return "must be [low, high] with low < high"
    return None


def _positive_all(v: tuple[float, ...]) -> str | None:
    return None if all(x > 0 for x in v) else "every value must be > 0"


def _channels(v: tuple[int, ...]) -> str | None:
    if not 1 <= len(v) <= 8 or any(c < 1 or c > 4096 for c in v):
        return "must be 1 to 8 widths, each 1..4096"
    return None


def _key(check=None, **kw):
    return field(metadata={"check": check}, **kw)


@dataclass(frozen=True)
class ProblemConfig:
    """``[problem]``: which PDE family, on which grid."""

    name: str = _key(_choice("burgers", "poisson", "reaction_diffusion"), default="burgers")
    resolution: tuple[int, ...] = _key(_resolution, default=(64, 64))
    viscosity: float = _key(_nonnegative, default=0.01)  # Burgers nu; the constant nu of diffusivity = "constant"
    residual: str = _key(_choice("sobel", "scharr", "conservative"), default="sobel")
    scheme_order: int = _key(lambda v: None if v in (1, 2) else "must be 1 or 2", default=2)  # conservative only
    flux: str = _key(_choice("godunov", "engquist_osher"), default="godunov")  # conservative only
    boundary: str = _key(_choice("exact", "penalty"), default="exact")
    penalty: float = _key(_positive, default=1.0)
    t_final: float = _key(_positive, default=1.0 / 3.0)
    c_range: tuple[float, ...] = _key(_range, default=(3.0, 6.0))
    c_values: tuple[float, ...] = _key(_positive_all, default=())
    test_c: tuple[float, ...] = _key(_positive_all, default=(3.3, 4.1, 4.77, 5.5, 5.9))
    # Poisson and reaction-diffusion: the Karhunen-Loeve diffusivity family.
    diffusivity: str = _key(_choice("kl", "constant"), default="kl")
    kl_terms: int = _key(lambda v: None if 1 <= v <= 64 else "must be in 1..64", default=6)
    kl_eta: float = _key(_positive, default=0.5)
    coeff_range: tuple[float, ...] = _key(_range, default=(-3.0, 3.0))
    kappa: float = _key(_nonnegative, default=1.0)
    source: float = _key(lambda v: None if v != 0 else "must be non-zero (f = 0 has the solution u = 0)", default=1.0)
    # Poisson and reaction-diffusion evaluation: the independent reference is the Q1 FEM on
    # a grid with this many times the intervals in each direction (its nodes include ours).
    truth_refine: int = _key(lambda v: None if 2 <= v <= 16 else "must be in 2..16", default=4)


@dataclass(frozen=True)
class DataConfig:
    """``[data]``: the training and held-out instances."""

    n_train: int = _key(_positive, default=64)
    n_test: int = _key(_positive, default=5)
    sampling: str = _key(_choice("uniform", "random", "sobol", "list"), default="uniform")
    seed: int = _key(_nonnegative, default=0)


@dataclass(frozen=True)
class ModelConfig:
    """``[model]``: the generator."""

    name: str = _key(_choice("unet"), default="unet")
    channels: tuple[int, ...] = _key(_channels, default=(16, 32, 64, 128))
    # Recompute each U-Net level in the backward pass instead of storing its activations.
    checkpoint_activations: bool = _key(default=False)


@dataclass(frozen=True)
class TrainConfig:
    """``[train]``: optimiser, schedule and cadence (steps count optimiser steps)."""

    optimizer: str = _key(_choice("adam", "lbfgs", "adam+lbfgs"), default="adam")
    lr: float = _key(_positive, default=2e-3)
    lr_schedule: str = _key(_choice("constant", "cosine", "onecycle"), default="onecycle")
    warmup: float = _key(lambda v: None if 0 <= v < 1 else "must be in [0, 1)", default=0.05)
    batch_size: int = _key(_positive, default=16)
    epochs: int = _key(_positive, default=100)
    checkpoint_every: int = _key(_nonnegative, default=0)
    keep_checkpoints: int = _key(_nonnegative, default=3)  # the newest K checkpoint files stay; 0: all
    log_every: int = _key(_positive, default=10)
    dtype: str = _key(_choice("float32", "float64"), default="float32")
    # L-BFGS (optimizer "lbfgs", or "adam+lbfgs": `epochs` of Adam, then L-BFGS).
    lbfgs_mode: str = _key(_choice("full", "multibatch"), default="full")
    lbfgs_iterations: int = _key(_positive, default=50)
    lbfgs_history: int = _key(lambda v: None if 1 <= v <= 1000 else "must be in 1..1000", default=20)
    lbfgs_lr: float = _key(_positive, default=1.0)
    lbfgs_batch: int = _key(_nonnegative, default=0)  # 0: full = all n_train, multibatch = batch_size
    lbfgs_overlap: int = _key(_positive, default=8)
    lbfgs_max_eval: int = _key(_positive, default=20)
    lbfgs_tolerance_grad: float = _key(_nonnegative, default=1e-9)
    lbfgs_tolerance_change: float = _key(_nonnegative, default=1e-12)
    lbfgs_chunk: int = _key(_nonnegative, default=0)  # samples per forward pass on a rank; 0: batch_size


@dataclass(frozen=True)
class MultigridConfig:
    """``[multigrid]``: train on a hierarchy of grids, coarse levels first (MGDiffNet).

    ``levels`` lists the nodes per side of every training grid, coarse to fine, the last
    equal to ``problem.resolution`` (empty: one level, the problem's grid). ``cycle`` orders
    the visits: ``half_v`` coarse to fine once; ``v``, ``w``, ``f`` start and end on the
    finest grid as multigrid's cycles do. ``epochs``, ``lr`` and ``batch_size`` give each
    level's epochs per visit, peak learning rate and global batch (empty: ``train.epochs``,
    ``train.lr``, ``train.batch_size`` at every level; unused when ``levels`` is empty). ``transfer``: ``deepen`` adds one
    refinement level at the top of the generator for each finer grid (``top_channels`` wide)
    and keeps the coarser generator on its own grid; ``carry`` trains the same network on
    every grid.
    """

    levels: tuple[int, ...] = _key(lambda v: None if len(v) <= 8 and all(3 <= n <= 16385 for n in v)
                                   and list(v) == sorted(set(v)) else
                                   "must be at most 8 node counts, increasing, each in 3..16385", default=())
    cycle: str = _key(_choice("half_v", "v", "w", "f"), default="half_v")
    epochs: tuple[int, ...] = _key(lambda v: None if all(e >= 1 for e in v) else "every value must be >= 1",
                                   default=())
    lr: tuple[float, ...] = _key(_positive_all, default=())
    batch_size: tuple[int, ...] = _key(lambda v: None if all(b >= 1 for b in v) else "every value must be >= 1",
                                       default=())
    transfer: str = _key(_choice("deepen", "carry"), default="deepen")
    top_channels: int = _key(lambda v: None if 1 <= v <= 4096 else "must be in 1..4096", default=16)


@dataclass(frozen=True)
class ParallelConfig:
    """``[parallel]``: threads per rank (0 = the node's cores / ranks on it), device, and
    gradient summation (bucketed Iallreduce overlapped with backward, or one flat
    Allreduce), with a cross-rank parameter check every ``check_every`` steps (0: never)."""

    threads_per_rank: int = _key(_nonnegative, default=0)
    device: str = _key(_choice("cpu", "cuda"), default="cpu")
    gradsync: str = _key(_choice("bucketed", "flat"), default="bucketed")
    bucket_mb: float = _key(lambda v: None if 0 < v <= 4096 else "must be in (0, 4096]", default=4.0)
    check_every: int = _key(_nonnegative, default=100)
    # CUDA only: how gradient buckets are summed, TF32 matrix products/convolutions,
    # bf16 autocast of the network, and the training step replayed as a CUDA graph.
    gpu_reduce: str = _key(_choice("auto", "nccl", "mpi", "staged"), default="auto")
    tf32: bool = _key(default=False)
    autocast: str = _key(_choice("none", "bf16"), default="none")
    cuda_graphs: bool = _key(default=False)


@dataclass(frozen=True)
class OutputConfig:
    """``[output]``: where the run directory goes and whether to draw plots."""

    dir: str = _key(lambda v: None if v.strip() else "must not be empty", default="runs/burgers")
    plots: bool = _key(default=True)


@dataclass(frozen=True)
class Config:
    """The whole run configuration; every key has a default."""

    problem: ProblemConfig = field(default_factory=ProblemConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    multigrid: MultigridConfig = field(default_factory=MultigridConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    def replace(self, **sections: Any) -> "Config":
        """A copy with whole sections replaced."""
        return dataclasses.replace(self, **sections)


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
    if par.cuda_graphs and cfg.train.optimizer != "adam":
        raise ConfigError("parallel.cuda_graphs: the graphed step is Adam's; use train.optimizer = 'adam'")


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
        raise ConfigError("train.optimizer: multigrid levels are trained by Adam; use 'adam', or 'adam+lbfgs' "
                          "for L-BFGS on the finest grid after them")
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


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are valid TOML basic strings
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def to_toml(cfg: Config) -> str:
    """The fully resolved config as TOML text that :func:`load_config` reads back unchanged."""
    lines = []
    for section in _SECTIONS:
        lines.append(f"[{section}]")
        obj = getattr(cfg, section)
        for f in dataclasses.fields(obj):
            lines.append(f"{f.name} = {_toml_value(getattr(obj, f.name))}")
        lines.append("")
    return "\n".join(lines)
