"""A run directory (``config.toml``, ``checkpoints/``, ``metrics.jsonl``): its config, the checkpoint to
continue from and what a continued run may change (a longer schedule, an L-BFGS finish), the weights
another run starts from, and the trained generator a command or the API loads from it."""

from __future__ import annotations

import dataclasses

import json
import tomllib
from pathlib import Path
from typing import Callable

from deepfusion.configuration.schema import Config, ConfigError, TrainConfig

from deepfusion.configuration.config import config_from_dict, family_table, load_config
from deepfusion.configuration.schema import has_lbfgs
from deepfusion.configuration.inputs import InputError
from deepfusion.configuration.schedule import adam_steps, build_schedule, visit_at, total_steps

__all__ = ["training_time", "run_config", "saved_config", "config_differences", "find_resume_point", "resume_point",
           "extension", "initial_weights", "truncate_metrics", "trained_model"]


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
        name = family_table(old) if section == "family_keys" else section
        out += [f"{name}.{key}" for key in a.__dataclass_fields__ if getattr(a, key) != getattr(b, key)]
    return out


# How a run is laid out over ranks and threads, not what it computes (beyond rounding, as the
# number of ranks, which is not in the config either): a run may continue with other values.
LAYOUT_KEYS = ("parallel.domain", "parallel.threads_per_rank", "parallel.gradsync", "parallel.bucket_mb",
               "parallel.progress_ms", "parallel.check_every", "parallel.collective_timeout_s")

# The product's last steps (model.sweeps, model.cycles, model.polish): the first stage trains without them, so a run
# without a second stage (which trains through the product) may continue, or be evaluated again, with others.
INFERENCE_KEYS = ("model.sweeps", "model.cycles", "model.polish")


def find_resume_point(run_dir: Path, resume: bool, cfg: Config, warn: Callable[[str], None],
                      may_differ: tuple[str, ...] = ()) -> tuple[Path, object] | None:
    """The newest valid checkpoint of the run in ``run_dir`` to continue from, or None for a fresh run.

    A run directory holding checkpoints is resumed whether or not ``--resume`` is given
    (a requeued job simply runs the same command again); damaged checkpoints are
    skipped with one line each (``warn``); it must have been written with the same
    config except for the keys in ``may_differ`` (a longer schedule), the layout over ranks
    (:data:`LAYOUT_KEYS`) and, without a second stage, :data:`INFERENCE_KEYS`, so a run is never mixed with another;
    the refusal names the keys that differ.
    """
    from deepfusion.files.checkpoint import checkpoint_files, latest_valid_checkpoint

    directory = run_dir / "checkpoints"
    if not checkpoint_files(directory):
        if resume:
            raise InputError(f"--resume: no checkpoint in {directory}")
        return None
    found = latest_valid_checkpoint(directory, warn)
    if found is None:
        raise InputError(f"{directory}: no valid checkpoint left to resume from (all refused above)")
    path, ckpt = found
    saved = saved_config(ckpt, path)
    inference = () if saved.train.second_stage_epochs or cfg.train.second_stage_epochs else INFERENCE_KEYS
    differ = [k for k in config_differences(saved, cfg)
              if k not in (*may_differ, *LAYOUT_KEYS, *inference) and not k.startswith("output.")]  # the run may have been moved
    if differ:
        shown = ", ".join(differ[:6]) + (f" and {len(differ) - 6} more" if len(differ) > 6 else "")
        raise InputError(
            f"{run_dir}: holds a run with a different config ({shown} differ from {path}); give the same config "
            "to continue it, or choose another --out"
        )
    return path, ckpt


# Keys a finished or interrupted run may change when it is continued: a longer schedule, or
# an L-BFGS finish added to an Adam run (its settings free until the phase has begun).
LBFGS_KEYS = tuple(f"train.{key}" for key in TrainConfig.__dataclass_fields__
                    if key.startswith("lbfgs_") and key != "lbfgs_iterations")
EXTENDABLE = ("train.epochs", "multigrid.epochs", "train.optimizer", "train.lbfgs_iterations", *LBFGS_KEYS)


def extension(saved: Config, cfg: Config, step: int) -> str:
    """How ``cfg`` lengthens the schedule of the run ``saved`` checkpointed at ``step`` ("" if it does not).

    Every visit before the checkpoint's must stay as it was, and the checkpoint's own visit
    may only grow, so the steps already taken mean the same under the new schedule. An Adam
    run may gain an L-BFGS finish (``train.optimizer`` "adam" -> "adam+lbfgs", with any
    L-BFGS settings); once the phase has begun only its ``train.lbfgs_iterations`` may change.
    """
    changed = [k for k in config_differences(saved, cfg) if k in EXTENDABLE]
    if not changed:
        return ""
    old, new = build_schedule(saved), build_schedule(cfg)
    if "train.optimizer" in changed and (saved.train.optimizer, cfg.train.optimizer) != ("adam", "adam+lbfgs"):
        raise InputError(f"train.optimizer: a continued run may only add an L-BFGS finish ('adam' -> 'adam+lbfgs'), "
                         f"not {saved.train.optimizer!r} -> {cfg.train.optimizer!r}; choose another --out")
    settings = [k for k in changed if k in LBFGS_KEYS]
    if settings and has_lbfgs(saved.train.optimizer) and step > adam_steps(saved.train, old):
        raise InputError(f"{', '.join(settings)}: the L-BFGS phase of this run began before step {step}; only "
                         f"train.lbfgs_iterations may change now; choose another --out")
    if total_steps(cfg.train, new) < step:
        raise InputError(f"{', '.join(changed)}: a continued run may not end before its checkpoint at step {step}; "
                         f"choose another --out")
    k = min(visit_at(old, step), len(old) - 1)
    same_before = len(new) > k and all(new[i] == old[i] for i in range(k))
    here_ok = same_before and (new[k].kind, new[k].level, new[k].lr, new[k].batch_size) == \
        (old[k].kind, old[k].level, old[k].lr, old[k].batch_size) \
        and new[k].end >= min(step, old[k].end) and new[-1].end >= old[-1].end
    if not here_ok:
        raise InputError(f"{', '.join(changed)}: a continued run may only lengthen its schedule from the checkpoint "
                         f"at step {step} on (the visits before it must stay as they were); choose another --out")
    return "; ".join(f"{k} {_value(saved, k)} -> {_value(cfg, k)}" for k in changed) + \
        f" ({total_steps(saved.train, old)} -> {total_steps(cfg.train, new)} steps)"


def _value(cfg: Config, key: str) -> str:
    """The value of ``section.key`` in ``cfg``, as the log shows it (lists as lists)."""
    section, name = key.split(".")
    value = getattr(getattr(cfg, section), name)
    return str(list(value)) if isinstance(value, tuple) else str(value)


def resume_point(run_dir: Path, resume: bool, cfg: Config, warn: Callable[[str], None]):
    """(path, checkpoint, a line on a lengthened schedule) of the checkpoint a ``deepfusion train`` continues
    from, or (None, None, "") for a fresh run: :func:`find_resume_point` with a longer schedule allowed
    (:func:`extension`)."""
    found = find_resume_point(run_dir, resume, cfg, warn, may_differ=EXTENDABLE)
    if found is None:
        return None, None, ""
    path, ckpt = found
    return path, ckpt, extension(saved_config(ckpt, path), cfg, ckpt.step)


def initial_weights(source: Path, model, warn: Callable[[str], None]) -> Path:
    """``--init-from``: load the weights of another run (its newest valid checkpoint) or of one
    checkpoint file into ``model``; the checkpoint's path."""
    from deepfusion.files.checkpoint import CheckpointError, latest_valid_checkpoint, load_checkpoint

    if source.is_dir():
        found = latest_valid_checkpoint(source / "checkpoints", warn)
        if found is None:
            raise InputError(f"--init-from: {source}: no valid checkpoint in {source / 'checkpoints'}")
        path, ckpt = found
    elif source.is_file():
        path, ckpt = source, load_checkpoint(source)
    else:
        raise InputError(f"--init-from: {source}: no such run directory or checkpoint")
    try:
        ckpt.restore(model)
    except CheckpointError as exc:
        raise InputError(f"--init-from: {path}: not a model of this config's shape ({exc})") from None
    return path


def _trained_seconds(run_dir: Path) -> float | None:
    """The training time an earlier evaluation of a complete run recorded (kept when it is evaluated again)."""
    try:
        return float(json.loads((run_dir / "eval.json").read_text())["train_seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def truncate_metrics(path: Path, step: int) -> None:
    """Drop metrics logged after ``step`` (by a run that went on past its last checkpoint)."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    path.write_text("".join(line + "\n" for line in kept))


def _architecture(cfg: Config) -> tuple:
    """What a checkpoint's weights depend on: the family on its grid, the model (not the steps that end its product at
    inference, :data:`INFERENCE_KEYS`, taken at their defaults: a trained run gains them by its config alone), the
    multigrid levels it deepened and whether it has a second stage."""
    mg = cfg.multigrid
    defaults = {f.name: f.default for f in dataclasses.fields(cfg.model)}
    model = dataclasses.replace(cfg.model, **{key: defaults[key] for key in (k.split(".", 1)[1] for k in INFERENCE_KEYS)})
    return (cfg.problem, cfg.family_keys, model, (mg.levels, mg.top_channels) if mg.transfer == "deepen" else (),
            cfg.train.second_stage_epochs > 0)


def trained_model(source: Path, checkpoint: str | Path | None = None, warn: Callable[[str], None] = lambda s: None):
    """``(run, generator, checkpoint path)`` of a run directory or a checkpoint file (``run``: the
    :class:`~deepfusion.configuration.run.Run` of its config, whose family built the generator).

    A run directory gives its ``config.toml`` and, unless ``checkpoint`` names one, its newest
    valid checkpoint (damaged ones are skipped with a line to ``warn``); a checkpoint file
    alone gives the config stored in it. The checkpoint must belong to the config's family
    and model.
    """
    from deepfusion.configuration.run import Run
    from deepfusion.files.checkpoint import latest_valid_checkpoint, load_checkpoint

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
    run = Run.from_config(cfg)
    model = run.build_model()
    ckpt.restore(model)
    return run, model, path


def training_time(run_dir: Path) -> tuple[float | None, int | None]:
    """The run's training wall-clock seconds and its ranks, where recorded: the seconds an evaluation wrote to
    eval.json, else those metrics.jsonl logged (the last ``elapsed_s`` of each session, summed over the sessions
    of a resumed run: each starts its clock again); the ranks from metrics.jsonl."""
    seconds, ranks = _trained_seconds(run_dir), None
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        try:
            records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        except ValueError:
            records = []
        ranks = records[-1].get("ranks") if records else None
        if seconds is None:
            elapsed = [float(r["elapsed_s"]) for r in records if isinstance(r.get("elapsed_s"), (int, float))]
            ends = [a for a, b in zip(elapsed, elapsed[1:]) if b < a] + elapsed[-1:]  # a session's last value
            seconds = sum(ends) if ends else None
    return seconds, ranks
