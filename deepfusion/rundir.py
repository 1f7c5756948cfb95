"""A run directory (``config.toml``, ``checkpoints/``, ``metrics.jsonl``): its config, the checkpoint to
continue from, and the trained generator a command or the API loads from it."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Callable

from deepfusion.config import Config, ConfigError, config_from_dict, family_table, load_config
from deepfusion.inputs import InputError

__all__ = ["training_time", "run_config", "saved_config", "config_differences", "find_resume_point", "truncate_metrics",
           "trained_model"]


def run_config(run_dir: Path) -> Config:
    """The resolved config a run directory was trained with."""
    if not (run_dir / "config.toml").is_file():
        raise InputError(f"{run_dir}: not a run directory (no config.toml)")
    return load_config(run_dir / "config.toml", saved=True)


def saved_config(ckpt, path: Path) -> Config:
    """The resolved config a checkpoint was written with."""
    try:
        return config_from_dict(tomllib.loads(ckpt.config), saved=True)
    except (tomllib.TOMLDecodeError, ConfigError) as exc:
        raise InputError(f"{path}: the checkpoint's stored config is unusable ({exc})") from None


def config_differences(old: Config, new: Config) -> list[str]:
    """``section.key`` of every key whose value differs between two configs, in config order."""
    if old.problem.family != new.problem.family:
        return ["problem.family"]
    out = []
    for section in old.__dataclass_fields__:
        a, b = getattr(old, section), getattr(new, section)
        name = family_table(old) if section == "family" else section
        out += [f"{name}.{key}" for key in a.__dataclass_fields__ if getattr(a, key) != getattr(b, key)]
    return out


# How a run is laid out over ranks and threads, not what it computes (beyond rounding, as the
# number of ranks, which is not in the config either): a run may continue with other values.
LAYOUT_KEYS = ("parallel.domain", "parallel.threads_per_rank", "parallel.gradsync", "parallel.bucket_mb",
               "parallel.progress_ms", "parallel.check_every", "parallel.collective_timeout_s")


def find_resume_point(run_dir: Path, resume: bool, cfg: Config, warn: Callable[[str], None],
                      may_differ: tuple[str, ...] = ()) -> tuple[Path, object] | None:
    """The newest valid checkpoint of the run in ``run_dir`` to continue from, or None for a fresh run.

    A run directory holding checkpoints is resumed whether or not ``--resume`` is given
    (a requeued job simply runs the same command again); damaged checkpoints are
    skipped with one line each (``warn``); it must have been written with the same
    config except for the keys in ``may_differ`` (a longer schedule) and the layout over ranks
    (:data:`LAYOUT_KEYS`), so a run is never mixed with another; the refusal names the keys that differ.
    """
    from deepfusion.checkpoint import checkpoint_files, latest_valid_checkpoint

    directory = run_dir / "checkpoints"
    if not checkpoint_files(directory):
        if resume:
            raise InputError(f"--resume: no checkpoint in {directory}")
        return None
    found = latest_valid_checkpoint(directory, warn)
    if found is None:
        raise InputError(f"{directory}: no valid checkpoint left to resume from (all refused above)")
    path, ckpt = found
    differ = [k for k in config_differences(saved_config(ckpt, path), cfg)
              if k not in may_differ and k not in LAYOUT_KEYS and not k.startswith("output.")]  # the run may have been moved
    if differ:
        shown = ", ".join(differ[:6]) + (f" and {len(differ) - 6} more" if len(differ) > 6 else "")
        raise InputError(
            f"{run_dir}: holds a run with a different config ({shown} differ from {path}); give the same config "
            "to continue it, or choose another --out"
        )
    return path, ckpt


def truncate_metrics(path: Path, step: int) -> None:
    """Drop metrics logged after ``step`` (by a run that went on past its last checkpoint)."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    path.write_text("".join(line + "\n" for line in kept))


def _architecture(cfg: Config) -> tuple:
    """What a checkpoint's weights depend on: the problem, the model, the multigrid levels it deepened
    and whether it has a second stage."""
    mg = cfg.multigrid
    return (cfg.problem, cfg.family, cfg.model, (mg.levels, mg.top_channels) if mg.transfer == "deepen" else (),
            cfg.train.second_stage_epochs > 0)


def trained_model(source: Path, checkpoint: str | Path | None = None, warn: Callable[[str], None] = lambda s: None):
    """``(config, generator, checkpoint path)`` of a run directory or a checkpoint file.

    A run directory gives its ``config.toml`` and, unless ``checkpoint`` names one, its newest
    valid checkpoint (damaged ones are skipped with a line to ``warn``); a checkpoint file
    alone gives the config stored in it. The checkpoint must belong to the config's problem
    and model.
    """
    from deepfusion.checkpoint import latest_valid_checkpoint, load_checkpoint
    from deepfusion.wiring import build_model, build_problem

    source = Path(source)
    if source.is_file() and checkpoint is None:
        path, ckpt = source, load_checkpoint(source)
        cfg = saved_config(ckpt, path)
    else:
        cfg = run_config(source)
        if checkpoint is not None:
            path = Path(checkpoint)
            ckpt = load_checkpoint(path)
        else:
            found = latest_valid_checkpoint(source / "checkpoints", warn)
            if found is None:
                raise InputError(f"{source}: no valid checkpoint in {source / 'checkpoints'}")
            path, ckpt = found
    saved = saved_config(ckpt, path)
    if _architecture(saved) != _architecture(cfg):
        raise InputError(
            f"{path}: checkpoint of {saved.problem.family} {list(saved.problem.resolution)} {saved.model.name} "
            f"{list(saved.model.channels)} does not belong to this run ({cfg.problem.family} "
            f"{list(cfg.problem.resolution)} {cfg.model.name} {list(cfg.model.channels)}, or other problem settings)"
        )
    model = build_model(cfg, build_problem(cfg))
    ckpt.restore(model)
    return cfg, model, path


def training_time(run_dir: Path) -> tuple[float | None, int | None]:
    """The run's training wall-clock seconds (eval.json) and its ranks (metrics.jsonl), where recorded."""
    seconds = ranks = None
    if (run_dir / "eval.json").is_file():
        seconds = json.loads((run_dir / "eval.json").read_text()).get("train_seconds")
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        lines = [line for line in metrics.read_text().splitlines() if line.strip()]
        ranks = json.loads(lines[-1]).get("ranks") if lines else None
    return seconds, ranks
