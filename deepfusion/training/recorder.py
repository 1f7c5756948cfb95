"""Rank 0's record of a run: metrics lines, progress lines with an ETA, and checkpoints (every rank
checks the parameters are finite before one is written)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from deepfusion.files.checkpoint import prune_checkpoints, save_checkpoint
from deepfusion.parallel.partition import local_batch_size
from deepfusion.configuration.schedule import Visit

__all__ = ["Recorder", "TrainingDiverged", "format_eta", "visits_eta"]


class TrainingDiverged(RuntimeError):
    """The loss became NaN or Inf."""


def format_eta(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s"


class Recorder:
    """Rank 0's side effects: metrics lines, progress output and checkpoints."""

    def __init__(self, run_dir: Path | None, leader: bool, log: Callable[[str], None], total: int, keep: int,
                 model: torch.nn.Module, visits: Sequence[Visit]):
        self.model = model  # every checkpoint holds the whole generator, whichever level trains
        self.visits = list(visits)
        self.run_dir = run_dir
        self.keep = keep
        self.leader = leader
        self.log = log
        self.total = total
        self.history: list[dict[str, object]] = []
        self.checkpoint: Path | None = None
        self.saved_step: int | None = None
        self.metrics = open(run_dir / "metrics.jsonl", "a", encoding="utf-8") if leader and run_dir else None
        self.start = time.perf_counter()

    def record(self, record: dict[str, object], line: str) -> None:
        record["elapsed_s"] = time.perf_counter() - self.start
        self.history.append(record)
        if self.metrics is not None:
            self.metrics.write(json.dumps(record) + "\n")
            self.metrics.flush()
        if self.leader:
            self.log(line)

    def check_finite(self, loss_value: float, epoch: int, step: int) -> None:
        """Raise :class:`TrainingDiverged` when the loss is NaN or Inf, naming the last checkpoint."""
        if not math.isfinite(loss_value):
            raise TrainingDiverged(
                f"loss is {loss_value} at epoch {epoch} step {step}; stopping "
                f"(last checkpoint: {self.checkpoint or 'none'})"
            )

    def save(self, optimizer, *, epoch: int, step: int, config: str, ranks: int, kind: str, visit: int) -> None:
        """Write the step's checkpoint (rank 0), unless it is already written; keep the last ``keep``."""
        model = self.model
        # Parameters are identical on all ranks, so every rank takes the same decision here.
        if not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
            raise TrainingDiverged(
                f"parameters became NaN or Inf by step {step}; not checkpointing them "
                f"(last good checkpoint: {self.checkpoint or 'none'})"
            )
        if self.leader and self.run_dir is not None and self.saved_step != step:
            self.saved_step = step
            self.checkpoint = save_checkpoint(
                self.run_dir / "checkpoints" / f"step-{step:08d}.h5",
                model,
                optimizer,
                epoch=epoch,
                step=step,
                config=config,
                ranks=ranks,
                attrs={"optimizer": kind, "visit": visit},
            )
            if self.keep:
                prune_checkpoints(self.checkpoint.parent, self.keep)

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()


def visits_eta(visits: Sequence[Visit], visit: Visit, step: int, rate: float, n_ranks: int) -> float:
    """Seconds left in the Adam phase: this visit at the measured rate, later ones scaled by
    their batch and grid nodes (a step's cost is about linear in both)."""
    nodes = math.prod(visit.grid) if visit.grid else 1
    left = 0.0
    for s in visits[visit.index:]:
        steps = s.end - max(step, s.first_step)
        scale = math.prod(s.grid) / nodes if s.grid else 1.0
        left += steps * local_batch_size(s.batch_size, n_ranks) * n_ranks * scale
    return left / rate
