"""``deepfusion jobs``: a batch script for a cluster, rendered from ``jobs/`` with validated values."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from deepfusion.config import load_config
from deepfusion.inputs import InputError

__all__ = ["run"]


def run(args: argparse.Namespace, comm) -> int:
    """Print a job script for a cluster, rendered from jobs/ with validated values."""
    from deepfusion.jobs import JobError, JobRequest, render_job
    from deepfusion.runtime import available_cores, find_mpiexec

    cfg = load_config(args.config)  # a job that would fail on its config fails here instead
    request = JobRequest(
        cluster=args.cluster, config=args.config, run_dir=Path(cfg.output.dir), nodes=args.nodes,
        ranks_per_node=args.ranks_per_node, threads=args.threads, time=args.time, partition=args.partition,
        account=args.account, node_type=args.node_type, cores_per_node=args.cores_per_node,
    )
    try:
        script = render_job(request, local_cores=available_cores(), mpiexec=find_mpiexec())
    except JobError as exc:
        raise InputError(str(exc)) from None
    sys.stdout.write(script)
    return 0
