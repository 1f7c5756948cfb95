"""The training loop: epochs, steps, global-mean loss, logging, checkpoints, NaN guard."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np
import torch

from deepfusion.checkpoint import Checkpoint, save_checkpoint
from deepfusion.config import ParallelConfig, TrainConfig
from deepfusion.gradsync import GradSync, broadcast_parameters, check_parameters
from deepfusion.partition import local_batch_size, local_indices, steps_per_epoch

__all__ = ["Problem", "TrainingDiverged", "TrainResult", "learning_rate", "train"]


class Problem(Protocol):
    """What the engine needs from a PDE family (diffnet's problems satisfy it)."""

    name: str
    in_channels: int

    def inputs(self, params: torch.Tensor) -> torch.Tensor: ...

    def field(self, raw: torch.Tensor, params: torch.Tensor) -> torch.Tensor: ...

    def loss_terms(self, u: torch.Tensor, params: torch.Tensor) -> dict[str, torch.Tensor]: ...


class TrainingDiverged(RuntimeError):
    """The loss became NaN or Inf."""


@dataclass
class TrainResult:
    """Summary of a finished run."""

    steps: int
    epochs: int
    seconds: float
    samples_per_s: float
    final_loss: float
    checkpoint: Path | None
    history: list[dict[str, Any]] = field(default_factory=list)


def learning_rate(step: int, total: int, cfg: TrainConfig) -> float:
    """Learning rate at optimiser step ``step`` of ``total``, a pure function of the step.

    ``onecycle``: linear warm-up from lr/25 over ``warmup * total`` steps, then cosine
    decay to lr/1e4; ``cosine``: cosine decay from lr to lr/1e3; ``constant``: lr.
    Being a function of the step alone, it resumes exactly from a checkpoint.
    """
    if cfg.lr_schedule == "constant":
        return cfg.lr
    if cfg.lr_schedule == "cosine":
        frac = step / max(1, total - 1)
        return cfg.lr * (1e-3 + (1 - 1e-3) * 0.5 * (1 + math.cos(math.pi * frac)))
    warm = max(1, int(cfg.warmup * total))
    if step < warm:
        return cfg.lr * (1 / 25 + (1 - 1 / 25) * step / warm)
    frac = (step - warm) / max(1, total - warm - 1)
    return cfg.lr * (1e-4 + (1 - 1e-4) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def _format_eta(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s"


def train(
    model: torch.nn.Module,
    problem: Problem,
    params: np.ndarray,
    cfg: TrainConfig,
    *,
    seed: int,
    comm,
    parallel: ParallelConfig = ParallelConfig(),
    run_dir: Path | None,
    config_text: str,
    threads: int,
    start_step: int = 0,
    resume: Checkpoint | None = None,
    log: Callable[[str], None] = print,
) -> TrainResult:
    """Train ``model`` on the instances ``params`` (one row per training sample).

    Every step, rank r of P computes its contiguous slice of the global batch; the loss
    is the global mean (the local sum of per-sample losses divided by the effective
    global batch), so summing gradients across ranks gives the gradient of the global
    mean. Rank 0 alone writes ``metrics.jsonl`` and checkpoints and prints progress.
    Training continues from optimiser step ``start_step`` with the optimiser state of
    ``resume`` when given; the model must already hold that checkpoint's parameters.

    Raises
    ------
    TrainingDiverged
        When the loss is NaN or Inf; the last checkpoint written stays as it was.
    """
    n = params.shape[0]
    b = cfg.batch_size
    b_loc = local_batch_size(b, comm.size)
    b_eff = b_loc * comm.size
    per_epoch = steps_per_epoch(n, b)
    total = per_epoch * cfg.epochs
    dtype = getattr(torch, cfg.dtype)
    all_params = torch.as_tensor(params, dtype=dtype)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    if resume is not None:
        resume.restore(model, opt)
    # Every rank starts from rank 0's parameters (a checkpoint is read on every rank,
    # but fresh initialisations could differ with the RNG state).
    broadcast_parameters(model, comm)
    sync = GradSync(model, comm, parallel.gradsync, parallel.bucket_mb)
    leader = comm.rank == 0
    metrics = None
    if leader and run_dir is not None:
        metrics = open(run_dir / "metrics.jsonl", "a", encoding="utf-8")
    history: list[dict[str, Any]] = []
    checkpoint: Path | None = None
    window = {"compute": 0.0, "comm": 0.0, "steps": 0, "start": time.perf_counter()}
    start = time.perf_counter()
    step = start_step
    loss_value = float("nan")
    model.train()
    try:
        while step < total:
            epoch, k = divmod(step, per_epoch)
            t0 = time.perf_counter()
            for group in opt.param_groups:
                group["lr"] = learning_rate(step, total, cfg)
            idx = local_indices(seed, epoch, k, comm.rank, comm.size, n, b)
            p = all_params[idx]
            u = problem.field(model(problem.inputs(p)), p)
            terms = problem.loss_terms(u, p)
            loss = sum(t.sum() for t in terms.values()) / b_eff
            sync.zero_grad()
            loss.backward()
            t1 = time.perf_counter()
            sums = np.array([t.detach().sum().item() for t in terms.values()])
            comm.allreduce_(sums)
            sync.finish()
            t2 = time.perf_counter()
            loss_value = float(sums.sum()) / b_eff
            if not math.isfinite(loss_value):
                raise TrainingDiverged(
                    f"loss is {loss_value} at epoch {epoch} step {step}; stopping "
                    f"(last checkpoint: {checkpoint or 'none'})"
                )
            opt.step()
            step += 1
            if parallel.check_every and comm.size > 1 and step % parallel.check_every == 0:
                check_parameters(model, comm, step)
            window["compute"] += (t1 - t0) + (time.perf_counter() - t2)
            window["comm"] += t2 - t1
            window["steps"] += 1
            last = step == total
            if step % cfg.log_every == 0 or last:
                now = time.perf_counter()
                rate = window["steps"] * b_eff / (now - window["start"])
                record = {
                    "epoch": epoch,
                    "step": step,
                    "loss": loss_value,
                    **{name: float(s) / b_eff for name, s in zip(terms, sums)},
                    "lr": opt.param_groups[0]["lr"],
                    "samples_per_s": rate,
                    "compute_s": window["compute"] / window["steps"],
                    "comm_s": window["comm"] / window["steps"],
                    "ranks": comm.size,
                    "threads": threads,
                    "elapsed_s": now - start,
                }
                history.append(record)
                if metrics is not None:
                    metrics.write(json.dumps(record) + "\n")
                    metrics.flush()
                if leader:
                    eta = (total - step) * b_eff / rate
                    extra = " ".join(f"{name} {record[name]:.3e}" for name in terms) if len(terms) > 1 else ""
                    log(
                        f"epoch {epoch + 1}/{cfg.epochs} step {step}/{total} loss {loss_value:.4e} "
                        f"{extra}{' ' if extra else ''}lr {record['lr']:.2e} "
                        f"{rate:.1f} samples/s ETA {_format_eta(eta)}"
                    )
                window = {"compute": 0.0, "comm": 0.0, "steps": 0, "start": now}
            if leader and run_dir is not None and (
                last or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0)
            ):
                checkpoint = save_checkpoint(
                    run_dir / "checkpoints" / f"step-{step:08d}.h5",
                    model,
                    opt,
                    epoch=step // per_epoch,
                    step=step,
                    config=config_text,
                    ranks=comm.size,
                )
    finally:
        sync.close()
        if metrics is not None:
            metrics.close()
    seconds = time.perf_counter() - start
    return TrainResult(
        steps=step - start_step,
        epochs=cfg.epochs,
        seconds=seconds,
        samples_per_s=(step - start_step) * b_eff / seconds if seconds > 0 else float("nan"),
        final_loss=loss_value,
        checkpoint=checkpoint,
        history=history,
    )
