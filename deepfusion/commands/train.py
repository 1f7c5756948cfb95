"""``deepfusion train``: train (or resume, extend, or start from another run's weights) on every rank."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np

from deepfusion.commands import agree, warn
from deepfusion.configuration.schema import Config
from deepfusion.configuration.config import defaults_notice, load_config, to_toml
from deepfusion.configuration.run import Run
from deepfusion.training.rundir import initial_weights, resume_point, training_time
from deepfusion.configuration.inputs import InputError
from diffnet.backend.clock import CORRECTION_PARTS, PartClock

__all__ = ["command"]

EXIT_DIVERGED = 3
EXIT_OUT_OF_MEMORY = 5


def _load_run_config(args: argparse.Namespace) -> tuple[Config, str]:
    """The config of the command line, and the line naming the family keys it took as defaults ('' if none)."""
    overrides = list(args.set or [])
    if args.out is not None:
        overrides.append(f"output.dir={json.dumps(str(args.out))}")
    cfg = load_config(args.config, overrides)
    return cfg, defaults_notice(args.config, list(args.set or []), cfg)


def _rank_report(comm, threads: int) -> str:
    """One line per rank (host, node-local rank, threads, cores it may use), gathered on all ranks."""
    import socket

    from deepfusion.parallel.runtime import available_cores

    mine = (
        f"  rank {comm.rank}/{comm.size} on {socket.gethostname()} (local {comm.local_rank}/{comm.local_size}): "
        f"{threads} threads, {available_cores()} cores available"
    )
    return "\n".join(comm.allgather(mine))


def _setup_device(cfg: Config, comm) -> str:
    import torch

    from deepfusion.parallel.runtime import configure_cuda, select_device

    device = agree(comm, lambda: select_device(cfg.parallel.device, comm.local_rank, comm.local_size))
    if device != "cpu" and (cfg.parallel.gradsync == "hierarchical" or cfg.parallel.grad_dtype != "train"):
        raise InputError("parallel.gradsync = 'hierarchical' and parallel.grad_dtype = 'bfloat16' are for CPU ranks "
                         "(NCCL is topology-aware on its own); use 'bucketed' and 'train' with device = 'cuda'")
    if device != "cpu":
        torch.cuda.set_device(device)
        configure_cuda(cfg.parallel.tf32)
        if cfg.parallel.gpu_reduce == "mpi" and comm.size > 1:
            from deepfusion.parallel.reducers import cuda_aware_mpi

            if not cuda_aware_mpi():  # the same library, so the same answer, on every rank
                raise InputError("parallel.gpu_reduce = 'mpi' needs a CUDA-aware MPI, and this one says it is not "
                                 "(MPIX_Query_cuda_support); use 'auto', 'nccl' or 'staged'")
    return device


def _batch_warnings(run: Run, visits, groups: int, key: str, unit: str = "rank") -> None:
    from deepfusion.parallel.partition import local_batch_size

    test, training = run.heldout, run.training
    rows_t, rows_p = test.reshape(len(test), -1), training.reshape(len(training), -1)
    overlap = np.isclose(rows_t[:, None], rows_p[None, :], rtol=0, atol=1e-9).all(axis=2).any(axis=1)
    if overlap.any():
        print(f"warning: held-out instances {np.flatnonzero(overlap).tolist()} are also in the training set", file=sys.stderr)
    for b in sorted({s.batch_size for s in visits}):
        if b % groups:
            b_loc = local_batch_size(b, groups)
            print(f"warning: {key} {b} is not divisible by {groups} {unit}s; each step uses "
                  f"{b_loc * groups} samples ({b_loc} per {unit})", file=sys.stderr)


def _memory_line(peaks: list[int], node: int | None, kept: int) -> str:
    """Each rank's peak resident memory (the first eight), the node's physical memory and what a rank could keep of
    its instances' set-up beside it."""
    gib = 2.0**30
    each = ", ".join(f"{p / gib:.2f}" for p in peaks[:8]) + (", ..." if len(peaks) > 8 else "")
    node_text = f" (the node has {node / gib:.1f} GiB)" if node else ""
    return (f"peak memory per rank: {each} GiB{node_text}, at most {max(peaks) / gib:.2f} GiB; kept set-up at most "
            f"{kept / gib:.1f} GiB a rank (parallel.cache_gib)")


def command(args: argparse.Namespace, comm) -> int:
    """Train the config on every rank of ``comm``; rank 0 writes and prints."""
    cfg, notice = agree(comm, lambda: _load_run_config(args))
    from deepfusion.parallel.runtime import (apply_threads, cache_budget, node_memory_bytes, peak_memory_bytes,
                                             resolve_threads)
    from diffnet.backend.budget import budget_bytes, set_budget_bytes

    # Threads are fixed before torch does any work; what a rank keeps per instance within its share of the node.
    threads = resolve_threads(cfg.parallel.threads_per_rank, comm.local_size)
    apply_threads(threads)
    set_budget_bytes(cache_budget(cfg.parallel.cache_gib, node_memory_bytes(), comm.local_size))

    import torch

    # The family, its instances and levels, built and checked once for the whole command.
    run = agree(comm, lambda: Run.from_config(cfg))
    family = run.family

    from deepfusion.training.rundir import truncate_metrics
    from deepfusion.parallel.gradsync import ParameterDrift
    from deepfusion.configuration.split import split_of
    from deepfusion.parallel.halo import DomainSplit, data_group
    from deepfusion.parallel.partition import local_batch_size
    from deepfusion.configuration.schedule import total_steps
    from deepfusion.training.context import TrainingContext
    from deepfusion.training.recorder import TrainingDiverged
    from deepfusion.training.trainer import train

    visits = run.visits
    try:
        splits = split_of(cfg)
        domain = None if splits is None else DomainSplit(comm, splits)
    except ValueError as e:  # the tiles do not divide the ranks: the same on every rank
        raise InputError(f"parallel.domain: {e}") from None
    groups = data_group(comm, domain)[1]
    key = "multigrid.batch_size" if cfg.multigrid.batch_size else "train.batch_size"
    smallest = min(s.batch_size for s in visits)
    if local_batch_size(smallest, groups) == 0:  # the same on every rank, and checked before anything is written
        what = f"{comm.size} ranks" if domain is None else f"{groups} data-parallel groups"
        raise InputError(f"{key}: {smallest} is smaller than the {what}; each {'rank' if domain is None else 'group'} "
                         f"needs a sample")
    leader = comm.rank == 0
    say = (lambda line: print(line, flush=True)) if leader else (lambda line: None)
    run_dir = Path(cfg.output.dir)
    # Every rank reads the same files and so reaches the same choice; agree() makes a
    # refusal on any rank a refusal on all.
    resume_from, ckpt, extended = agree(comm, lambda: resume_point(run_dir, args.resume, cfg, warn if leader else say))
    torch.manual_seed(cfg.data.seed)
    clock = PartClock()  # seconds in the product's coarse correction (model.coarse_correction), forward and backward
    device = _setup_device(cfg, comm)
    model = run.build_model()
    init_from = None
    if args.init_from is not None and ckpt is None:
        init_from = agree(comm, lambda: initial_weights(Path(args.init_from), model, warn if leader else say))
    model = model.to(device)
    # Rank 0 checks the family against itself (the same answer on every rank), before anything is written.
    checked = agree(comm, lambda: _family_check(run) if leader else None)
    start_step = ckpt.step if ckpt is not None else 0
    total = total_steps(cfg.train, visits)
    if ckpt is not None:
        torch.set_rng_state(torch.from_numpy(ckpt.torch_rng))
    if leader:
        run_dir.mkdir(parents=True, exist_ok=True)
        # A fresh run in a directory whose earlier run died before its first checkpoint
        # starts the metrics over; a resumed one drops lines past its checkpoint.
        truncate_metrics(run_dir / "metrics.jsonl", start_step)
        (run_dir / "config.toml").write_text(to_toml(cfg), encoding="utf-8")
        _batch_warnings(run, visits, groups, key, "rank" if domain is None else "data-parallel group")
    ctx = TrainingContext(comm, cfg.data.seed, threads, cfg.parallel, domain, run_dir=run_dir,
                          config_text=to_toml(cfg), log=say)
    _announce(run, ctx, model, visits, (resume_from, ckpt, extended, init_from, args.init_from, args.resume), notice)
    if checked is not None:
        say(checked.line())
    if start_step >= total:
        say(f"the run is complete: {run_dir} finished its {total} steps ({resume_from}); nothing to train. "
            f"To train longer, give more epochs (--set train.epochs=N, or multigrid.epochs); evaluating it again")
        ckpt.restore(model)
        result = None
    else:
        from deepfusion.training.signals import stop_on_signals
        from diffnet.multigrid.minimiser import CoarseNewtonError

        try:
            with stop_on_signals() as stop:
                result = train(run, model, dataclasses.replace(ctx, stop=stop), resume=ckpt, clock=clock)
        except (TrainingDiverged, ParameterDrift) as exc:
            if leader:
                print(f"deepfusion: error: {exc}", file=sys.stderr)
            return EXIT_DIVERGED
        except CoarseNewtonError as exc:  # on this rank's batch alone: one line, then every rank ends
            print(f"deepfusion: error: {exc}", file=sys.stderr, flush=True)
            if comm.size > 1:
                comm.abort(2)
            return 2
        except (MemoryError, RuntimeError) as exc:
            if not _out_of_memory(exc):
                raise
            # One line, then every rank ends (the others may be waiting in a halo exchange or a sum).
            print(_out_of_memory_line(cfg, comm, domain), file=sys.stderr, flush=True)
            if comm.size > 1:
                comm.abort(EXIT_OUT_OF_MEMORY)
            return EXIT_OUT_OF_MEMORY
        if result.stopped:
            again = ["deepfusion", "train", str(args.config), *(a for s in args.set or [] for a in ("--set", s)),
                     "--out", str(run_dir), "--resume"]
            say(
                f"stopped by {stop.signal or 'a signal to another rank'} at step {start_step + result.steps}; "
                f"checkpoint {result.checkpoint}\nresume with (under the same launcher): {shlex.join(again)}"
            )
            return 0
        say(
            f"trained {result.steps} steps in {result.seconds:.1f} s "
            f"({result.samples_per_s:.1f} samples/s)"
            + (f", the coarse correction {clock.total(CORRECTION_PARTS):.1f} s of it "
               f"({clock.total(CORRECTION_PARTS) / result.seconds:.0%})"
               if cfg.model.coarse_correction and result.seconds > 0 else "")
            + clock.newton_text() + f"; checkpoint {result.checkpoint}"
        )
        say(_memory_line(comm.allgather(peak_memory_bytes()), node_memory_bytes(), budget_bytes()))
    pred = None
    if domain is not None:  # every group predicts the product's held-out fields tile by tile; rank 0 evaluates them
        t0 = time.perf_counter()
        fields = run.product(model).fields(run.heldout, tiling=domain.tiling(family.resolution))
        pred = (fields, time.perf_counter() - t0)
    if leader:
        from deepfusion.analysis.evaluate import evaluate_run

        evaluate_run(run, model, run_dir, result.seconds if result is not None else training_time(run_dir)[0],
                     pred=pred)
    return 0


def _announce(run: Run, ctx, model, visits, start: tuple, notice: str) -> None:
    """Rank 0's opening lines: the run, its schedule, defaults taken (``notice``), where it starts from, the ranks.
    ``start`` is (checkpoint path, checkpoint, a longer schedule's line, the weights' source, and what the command
    line asked: --init-from's path, --resume)."""
    import torch

    resume_from, ckpt, extended, init_from, asked_init_from, asked_resume = start
    cfg, family, samples = run.cfg, run.family, len(run.training)
    say = ctx.log
    say(
        f"deepfusion: training {family.name} {tuple(cfg.problem.resolution)} {family.describe()} "
        f"| {cfg.model.name} {list(cfg.model.channels)} "
        f"({sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters) | {samples} samples, "
        + (f"batch {cfg.train.batch_size}, {cfg.train.epochs} epochs" if len(visits) == 1 else
           f"{len(visits)} visits, {sum(s.epochs for s in visits)} epochs")
        + f" | ranks {ctx.comm.size} x {ctx.threads} threads"
        + ("" if ctx.domain is None else f" | each sample split {'x'.join(map(str, ctx.domain.splits))} "
           f"over {ctx.domain.tiles} ranks, {ctx.domain.data_size} data-parallel group{'s' if ctx.domain.data_size > 1 else ''}")
        + (f" | resuming from {resume_from} (step {ckpt.step})" if resume_from else "")
    )
    visits = [s for s in visits if s.kind == "level"]
    if len(visits) > 1:
        mg = cfg.multigrid
        how = f"deepened by {mg.top_channels}-channel levels" if mg.transfer == "deepen" else "the same network carried"
        say(f"multigrid: {mg.schedule} schedule over {len(mg.levels)} levels, {how}; "
            + " -> ".join(f"{'x'.join(map(str, s.grid))} ({s.epochs} epochs, lr {s.lr:g}, batch {s.batch_size})"
                          for s in visits))
    if notice:
        say(notice)
    product = run.product(model)
    say(f"loss: {family.loss().describe()}; product: {product.chain()}"
        + ("" if not (cfg.model.sweeps or cfg.model.polish) else
           " (the first stage trains on the network's field" + (" with its coarse correction" if cfg.model.coarse_correction
                                                               else "") + "; the rest is inference only)"))
    if len(visits) < len(visits):
        s = visits[-1]
        say(f"second stage: u = u1 + eps v on {'x'.join(map(str, s.grid))}, v a second {cfg.model.name} fed the first "
            f"stage's correction B g1 / eps, the first frozen ({s.epochs} epochs, lr {s.lr:g}, batch {s.batch_size})")
    if init_from is not None:
        say(f"initial weights from {init_from} (--init-from)")
    elif asked_init_from is not None:
        say(f"--init-from {asked_init_from} not used: the run directory already holds this run's checkpoints")
    if ckpt is not None:
        how = "--resume" if asked_resume else "found in the run directory, resuming automatically"
        ranks = "" if ckpt.ranks == ctx.comm.size else (
            f"; written by {ckpt.ranks} ranks, continuing on {ctx.comm.size} (the global batches do not depend on the ranks)"
        )
        say(f"checkpoint {resume_from} ({how}){ranks}")
        if extended:
            say(f"continuing with a longer schedule: {extended}")
    device = next(model.parameters()).device
    on = "CPU" if device.type == "cpu" else f"{device} ({torch.cuda.get_device_name(device)})"
    sums = "flat (CUDA graph)" if cfg.parallel.cuda_graphs else cfg.parallel.gradsync
    sums += ", bfloat16 between nodes" if cfg.parallel.grad_dtype == "bfloat16" else ""
    say(f"MPI: {ctx.comm.library}; gradients: {sums}; device: {on}\n{_rank_report(ctx.comm, ctx.threads)}")


def _out_of_memory_line(cfg: Config, comm, domain) -> str:
    """The one line an allocation failure in a training step ends the job with."""
    split = f"each sample split {'x'.join(map(str, domain.splits))}" if domain is not None else "samples whole"
    return (f"deepfusion: error: out of memory on rank {comm.rank} in a training step of the "
            f"{'x'.join(map(str, cfg.problem.resolution))} grid ({split}): split each sample over more ranks "
            f"(parallel.domain), give fewer samples per rank (train.batch_size, more ranks) or recompute "
            f"activations (model.checkpoint_activations = true)")


def _family_check(run: Run):
    """The family checked against itself on one training instance (:mod:`deepfusion.analysis.selfcheck`): on the
    check's small grid, or on the run's own where the family refuses that one; a disagreement is one line."""
    from deepfusion.analysis.selfcheck import FamilyMismatch, check_family, check_grid

    cfg = run.cfg
    grid = check_grid(tuple(cfg.problem.resolution), tuple(cfg.multigrid.levels))
    try:
        return check_family(run.on_grid(grid), run.training[:1])
    except (FamilyMismatch, ValueError) as small_grid:
        if grid == tuple(cfg.problem.resolution) or cfg.multigrid.levels:  # the grid training itself visits
            raise InputError(str(small_grid)) from None
    try:  # a family that refuses the small grid without levels: on the run's own
        return check_family(run.family, run.training[:1])
    except (FamilyMismatch, ValueError) as e:
        raise InputError(str(e)) from None


def _out_of_memory(exc: BaseException) -> bool:
    """Whether an allocation failed: Python's MemoryError, or torch's allocators (CPU: a RuntimeError
    "can't allocate memory"; CUDA: torch.OutOfMemoryError)."""
    text = str(exc)
    return isinstance(exc, MemoryError) or "can't allocate memory" in text or "out of memory" in text.lower()
