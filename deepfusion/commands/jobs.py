"""``deepfusion jobs``: a batch script for a cluster, rendered from ``jobs/`` with validated values."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from deepfusion.configuration.config import load_config
from deepfusion.configuration.run import Run
from deepfusion.configuration.inputs import InputError
from deepfusion.configuration.split import unet_alignment

__all__ = ["command"]


def command(args: argparse.Namespace, comm) -> int:
    """Print a job script for a cluster, rendered from jobs/ with validated values."""
    from deepfusion.jobs import JobError, JobRequest, render_job
    from deepfusion.parallel.runtime import available_cores, find_mpiexec, mpiexec_mismatch

    cfg = Run.from_config(load_config(args.config)).cfg  # a job that would fail on its config fails here instead
    if args.cluster == "local" and (why := mpiexec_mismatch()):  # a launcher of another MPI starts singletons
        raise InputError(why)
    try:
        domain = _domain(args, cfg)
        request = JobRequest(
            cluster=args.cluster, config=args.config, run_dir=Path(cfg.output.dir), nodes=args.nodes,
            ranks_per_node=args.ranks_per_node, threads=args.threads, time=args.time, partition=args.partition,
            account=args.account, node_type=args.node_type, cores_per_node=args.cores_per_node, domain=domain,
        )
        script = render_job(request, local_cores=available_cores(), mpiexec=find_mpiexec())
    except JobError as exc:
        raise InputError(str(exc)) from None
    sys.stdout.write(script)
    return 0


def _domain(args: argparse.Namespace, cfg) -> tuple[int, ...] | None:
    """The domain split ``--memory-per-node`` asks for (None: the config's own, or none needed)."""
    from deepfusion.configuration.memory import training_bytes_per_sample
    from deepfusion.jobs import JobError, size_domain
    from deepfusion.configuration.schedule import build_schedule

    if args.memory_per_node is None:
        return None
    if not 0 < args.memory_per_node <= 1e6:
        raise JobError(f"--memory-per-node: must be a positive number of GiB, got {args.memory_per_node}")
    if not isinstance(args.ranks_per_node, int) or args.ranks_per_node < 1 or args.nodes < 1:
        return None  # render_job names the bad count
    ranks = args.nodes * args.ranks_per_node
    # A fifth of the node for the interpreter, libraries, MPI buffers and the allocator's slack.
    per_rank = 0.8 * args.memory_per_node * 2**30 / args.ranks_per_node
    batch = max(s.batch_size for s in build_schedule(cfg))
    grid = tuple(cfg.problem.resolution)
    sample = training_bytes_per_sample(cfg)
    splits = size_domain(grid, sample, batch, ranks, per_rank, unet_alignment(cfg))
    shown = "none needed" if splits is None else f"parallel.domain = {list(splits)}"
    print(f"deepfusion jobs: a training sample of the {'x'.join(map(str, grid))} grid takes about "
          f"{sample / 2**30:.2f} GiB (estimate), a rank's share of a node {per_rank / 2**30:.1f} GiB: {shown}",
          file=sys.stderr)
    return splits
