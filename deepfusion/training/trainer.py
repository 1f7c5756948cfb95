"""The training loop: epochs, steps, global-mean loss, logging, checkpoints, NaN guard, graceful stop."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from deepfusion.configuration.schema import TrainConfig
from diffnet.backend.clock import PartClock
from deepfusion.configuration.schema import first_order
from deepfusion.files.checkpoint import Checkpoint
from deepfusion.parallel.gradsync import GradSync, broadcast_parameters, check_parameters
from deepfusion.parallel.partition import local_batch_size, local_indices, steps_per_epoch
from deepfusion.training.context import TrainingContext
from deepfusion.training.lbfgs_phase import lbfgs_phase
from deepfusion.training.recorder import Recorder, format_eta, visits_eta
from deepfusion.configuration.schedule import Visit, adam_steps, visit_at, total_steps
from deepfusion.training.stepper import make_local_step

if TYPE_CHECKING:
    from deepfusion.configuration.run import Run
    from diffnet.protocol.family import Family

__all__ = ["TrainResult", "learning_rate", "train"]


@dataclass
class TrainResult:
    """Summary of a finished run."""

    steps: int
    epochs: int
    seconds: float
    samples_per_s: float
    final_loss: float
    checkpoint: Path | None
    history: list[dict[str, object]] = field(default_factory=list)
    stopped: bool = False  # ended early by a stop request (SIGTERM/SIGINT), with a checkpoint


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


def _first_order(weights, cfg: TrainConfig, lr: float) -> torch.optim.Optimizer:
    """The first-order optimiser of ``train.optimizer``: SGD with heavy-ball ``train.momentum`` for
    "sgd", Adam otherwise (the Adam visits of "adam+lbfgs" included)."""
    if first_order(cfg.optimizer) == "sgd":
        return torch.optim.SGD(weights, lr=lr, momentum=cfg.momentum)
    return torch.optim.Adam(weights, lr=lr)


def train(
    run: Run,
    model: torch.nn.Module,
    ctx: TrainingContext,
    *,
    resume: Checkpoint | None = None,
    clock: PartClock | None = None,
) -> TrainResult:
    """Train ``model`` on the run's training instances (``run.training``, one row per sample), under ``train``.

    Adam or SGD (``train.optimizer`` "adam" or "sgd", and the first ``train.epochs`` of
    "adam+lbfgs"): every step, rank r of P computes its contiguous slice of the global batch; the loss
    is the global mean (the local sum of per-sample losses divided by the effective
    global batch), so summing gradients across ranks gives the gradient of the global
    mean. L-BFGS ("lbfgs", and the rest of "adam+lbfgs"): ``train.lbfgs_iterations``
    iterations on a global objective that every rank evaluates identically (see
    :mod:`deepfusion.training.lbfgs`), the parameters compared across ranks after each one, in
    ``train.lbfgs_dtype`` (checkpoints hold them in ``train.dtype``, plus the phase's own
    copy for an exact resume).
    Rank 0 alone writes ``metrics.jsonl`` and checkpoints (in ``ctx.run_dir``) and prints progress
    (``ctx.log``). Training continues from ``resume``'s step with its optimiser state when given;
    the model must already hold that checkpoint's parameters. When ``ctx.stop`` is requested
    on any rank (a signal), all ranks agree at the next step boundary (the flag rides on
    the loss Allreduce), a checkpoint is written and the result says ``stopped``.

    With ``ctx.parallel.collective_timeout_s`` > 0, a blocking collective that takes longer (a lost
    rank, node or link) ends the job on every rank it can reach with a line naming the step
    (:mod:`deepfusion.parallel.watchdog`); checkpoints already written stay intact.

    The run's :class:`~deepfusion.configuration.run.Schedule` gives the visits (one for a single-level run) and
    what each trains (a generator and a family); each visit has its own optimiser (a level's loss has its own
    scale), learning-rate schedule, batch and sample order, and every checkpoint holds the whole ``model``. L-BFGS
    follows on the last visit's. ``clock`` gathers the seconds of the product's coarse correction.

    With ``ctx.domain`` (:class:`deepfusion.parallel.halo.DomainSplit`), each sample is split over a group of
    ranks that hold one tile each; the batch is split over the groups as it is over ranks
    without one, and the gradient sum over all ranks is the global mean's gradient.

    Parameters
    ----------
    run : Run
        The run: its config (``train``, ``parallel``), training instances and schedule.
    model : torch.nn.Module
        The generator (the whole model; each visit trains its part).
    ctx : TrainingContext
        The communicator, threads, domain split, run directory, log and stop request.
    resume : Checkpoint, optional
        Continue from this checkpoint's step and optimiser state.
    clock : PartClock, optional
        Gathers the seconds of the product's coarse correction.

    Returns
    -------
    TrainResult

    Raises
    ------
    TrainingDiverged
        When the loss is NaN or Inf; the last checkpoint written stays as it was.
    """
    cfg = run.cfg.train
    schedule = run.schedule(model, clock)
    visits = schedule.visits
    adam = adam_steps(cfg, list(visits))
    total = total_steps(cfg, list(visits))
    dtype = getattr(torch, cfg.dtype)
    device = next(model.parameters()).device
    all_instances = torch.as_tensor(run.training, dtype=dtype, device=device)
    resume_lbfgs = resume is not None and resume.attrs.get("optimizer", "adam") == "lbfgs"
    start_step = 0 if resume is None else resume.step
    if resume is not None:
        resume.restore(model)  # the optimiser's state goes into its phase's optimiser
    # Every rank starts from rank 0's parameters (a checkpoint is read on every rank,
    # but fresh initialisations could differ with the RNG state).
    broadcast_parameters(model, ctx.comm)
    rec = Recorder(ctx.run_dir, ctx.comm.rank == 0, ctx.log, total, cfg.keep_checkpoints, model, visits)
    ctx = dataclasses.replace(ctx, recorder=rec)
    step = start_step
    loss_value = float("nan")
    stopped = False
    samples = 0
    model.train()
    start = time.perf_counter()
    # A lost rank, node or link ends the job instead of hanging it (parallel.collective_timeout_s).
    with ctx.comm.watched(ctx.parallel.collective_timeout_s):
        try:
            for visit in visits[visit_at(list(visits), step) if step < adam else len(visits):]:
                target = schedule.target(visit)
                generator, family = target.generator, target.family
                generator.train()
                opt = _first_order(generator.parameters(), cfg, visit.lr)
                if resume is not None and not resume_lbfgs and visit.first_step < resume.step < visit.end:
                    resume.restore(None, opt)  # mid-visit: that visit's Adam moments (or SGD momentum)
                done = step
                step, loss_value, stopped = _first_order_phase(generator, family, all_instances, cfg, opt, visit,
                                                               step, ctx)
                groups = ctx.data_group[1]
                samples += (step - done) * local_batch_size(visit.batch_size, groups) * groups
                if stopped:
                    break
            if step < total and not stopped:
                target = schedule.target(visits[-1])
                generator, family = target.generator, target.family
                step, loss_value, stopped = lbfgs_phase(generator, family, all_instances, cfg, ctx, step=step,
                                                        resume=resume if resume_lbfgs else None)
        finally:
            rec.close()
    seconds = time.perf_counter() - start
    return TrainResult(
        steps=step - start_step,
        epochs=sum(s.epochs for s in visits),
        seconds=seconds,
        samples_per_s=samples / seconds if seconds > 0 else float("nan"),
        final_loss=loss_value,
        checkpoint=rec.checkpoint,
        history=rec.history,
        stopped=stopped,
    )


def _visit_seed(seed: int, visit: Visit) -> int:
    """The sample-order seed of a visit: the run's own for the first, a distinct one for each later visit."""
    return seed if visit.index == 0 else seed + 1_000_003 * visit.index


def _first_order_phase(model, family: Family, all_instances, cfg: TrainConfig, opt, visit: Visit, step: int,
                       ctx: TrainingContext) -> tuple[int, float, bool]:
    """Adam or SGD steps ``step`` .. ``visit.end`` - 1 of one visit, with data-parallel gradient sums."""
    comm, parallel, domain, rec = ctx.comm, ctx.parallel, ctx.domain, ctx.recorder
    name = first_order(cfg.optimizer) or "adam"
    n, b = all_instances.shape[0], visit.batch_size
    # The data-parallel groups: every rank, or one per sample's tiles under a domain split.
    data_rank, groups = ctx.data_group
    tiling = None if domain is None else domain.tiling(family.resolution)
    b_eff = local_batch_size(b, groups) * groups
    per_epoch = steps_per_epoch(n, b)
    schedule = dataclasses.replace(cfg, lr=visit.lr)
    seed = _visit_seed(ctx.seed, visit)
    # Hooks cannot run inside a captured CUDA graph: a graphed step sums gradients flat.
    sync = GradSync(model, comm, "flat" if parallel.cuda_graphs else parallel.gradsync, parallel.bucket_mb,
                    parallel.gpu_reduce, parallel.grad_dtype, parallel.progress_ms)
    b_loc = local_batch_size(b, groups)
    local_step = make_local_step(model, family, sync, b_eff, autocast=parallel.autocast,
                                 cuda_graph=parallel.cuda_graphs, example=all_instances[:b_loc], tiling=tiling)
    window = {"compute": 0.0, "comm": 0.0, "steps": 0, "start": time.perf_counter()}
    loss_value = float("nan")
    stopping = False
    label = visit.label()
    try:
        while step < visit.end and not stopping:
            epoch, k = divmod(step - visit.first_step, per_epoch)
            comm.mark(f"step {step + 1}")
            t0 = time.perf_counter()
            for group in opt.param_groups:
                group["lr"] = learning_rate(step - visit.first_step, visit.steps, schedule)
            idx = local_indices(seed, epoch, k, data_rank, groups, n, b)
            terms = local_step(all_instances[idx])
            t1 = time.perf_counter()
            # The loss terms' sums and this rank's stop flag, summed beside the gradients: one
            # synchronisation per step, as DDP has (a blocking Allreduce of its own was a second).
            sums = np.array([t.item() for t in terms.values()] + [float(ctx.stop.requested)])
            request = comm.iallreduce_(sums)
            sync.finish()
            comm.waitall([request])
            t2 = time.perf_counter()
            stopping = bool(sums[-1] > 0)
            sums = sums[:-1]
            loss_value = float(sums.sum()) / b_eff
            rec.check_finite(loss_value, epoch + 1, step)
            opt.step()
            step += 1
            if parallel.check_every and comm.size > 1 and step % parallel.check_every == 0:
                check_parameters(model, comm, step)
            window["compute"] += (t1 - t0) + (time.perf_counter() - t2)
            window["comm"] += t2 - t1
            window["steps"] += 1
            last = step == visit.end
            if step % cfg.log_every == 0 or last:
                now = time.perf_counter()
                rate = window["steps"] * b_eff / (now - window["start"])
                record = {
                    "epoch": epoch + 1,  # 1-based, as the progress lines count
                    "step": step,
                    "optimizer": name,
                    "visit": visit.index,
                    "level": visit.level,
                    "kind": visit.kind,
                    "loss": loss_value,
                    **{name: float(s) / b_eff for name, s in zip(terms, sums)},
                    "lr": opt.param_groups[0]["lr"],
                    "samples_per_s": rate,
                    "compute_s": window["compute"] / window["steps"],
                    "comm_s": window["comm"] / window["steps"],
                    "ranks": comm.size,
                    "threads": ctx.threads,
                }
                if domain is not None:
                    record["tiles"] = domain.tiles
                if visit.grid:
                    record["grid"] = list(visit.grid)
                eta = visits_eta(rec.visits, visit, step, rate, groups)
                extra = " ".join(f"{name} {record[name]:.3e}" for name in terms) if len(terms) > 1 else ""
                rec.record(
                    record,
                    f"{label + ' ' if label else ''}epoch {epoch + 1}/{visit.epochs} step {step}/{rec.total} "
                    f"loss {loss_value:.4e} {extra}{' ' if extra else ''}lr {record['lr']:.2e} "
                    f"{rate:.1f} samples/s ETA {format_eta(eta)}"
                    + (" (Adam phase)" if rec.total > rec.visits[-1].end else ""),
                )
                window = {"compute": 0.0, "comm": 0.0, "steps": 0, "start": now}
            if last or stopping or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0):
                rec.save(opt, epoch=(step - visit.first_step) // per_epoch, step=step, config=ctx.config_text,
                         ranks=comm.size, kind=name, visit=visit.index)
    finally:
        sync.close()
    return step, loss_value, stopping and step < rec.total
