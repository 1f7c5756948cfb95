"""Error curves of a finished run: every checkpoint's error on given instances against its training
time, reading such curves at an error or at a time, and saving their figures (for the benchmark scripts)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np


def checkpoint_curve(run: Path, sets: dict[str, tuple[np.ndarray, np.ndarray]], quiet: bool = False) -> list[dict]:
    """Every checkpoint of ``run``, oldest first: its step, training seconds and, for each
    ``name: (parameters, reference fields)`` of ``sets``, the mean relative L2 error ``name``.

    The seconds are the run's own clock (``metrics.jsonl``'s ``elapsed_s``, interpolated
    between logged steps), so evaluating the checkpoints afterwards costs the run nothing.
    """
    from deepfusion.analysis.inference import relative_l2
    from deepfusion.configuration.config import load_config
    from deepfusion.configuration.run import Run
    from deepfusion.files.checkpoint import checkpoint_files, load_checkpoint

    cfg = load_config(run / "config.toml")
    made = Run.from_config(cfg)
    problem, model = made.family, made.build_model()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    logged = np.array([[0.0, 0.0]] + [[r["step"], r["elapsed_s"]] for r in records])
    points = []
    for path in reversed(checkpoint_files(run / "checkpoints")):
        ckpt = load_checkpoint(path)
        ckpt.restore(model)
        point = {"step": ckpt.step, "seconds": float(np.interp(ckpt.step, logged[:, 0], logged[:, 1]))}
        for name, (params, truth) in sets.items():
            point[name] = float(relative_l2(made.product(model).fields(params), truth).mean())
        points.append(point)
        if not quiet:
            print(f"  {run.name} step {ckpt.step}: {point['seconds']:.0f} s, "
                  + ", ".join(f"{name} {point[name]:.5f}" for name in sets), file=sys.stderr, flush=True)
    return points


def time_to(points: list[dict], target: float, key: str = "error", axis: str = "seconds") -> float | None:
    """Where (``axis``) a curve first reaches ``target`` in ``key``, interpolated in log error between
    points; None when it never does."""
    previous = {axis: 0.0, key: math.inf}
    for p in points:
        if p[key] <= target:
            if not math.isfinite(previous[key]):
                return p[axis]
            a, b = math.log(previous[key]), math.log(p[key])
            return previous[axis] + (p[axis] - previous[axis]) * (a - math.log(target)) / (a - b)
        previous = p
    return None


def value_at(points: list[dict], when: float, key: str = "error", axis: str = "seconds") -> float:
    """A curve's ``key`` at ``when`` (log-interpolated between points; its last value beyond its end,
    its first before its start)."""
    xs = [p[axis] for p in points]
    logs = [math.log(p[key]) for p in points]
    return math.exp(float(np.interp(when, xs, logs)))


def save_figure(fig, out: Path) -> None:
    """Lay out, write (creating the folder) and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
