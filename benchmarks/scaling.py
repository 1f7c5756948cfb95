"""Strong and weak scaling of `deepfusion train`, per-epoch wall-clock, and a projection to 1-128 nodes.

Measured here (Burgers, default U-Net, 1 thread per rank, P = 1, 2 and 4 ranks; this
machine has 2 cores, so P = 4 is oversubscribed and marked so), at 64^2, 128^2 and 256^2:

* strong scaling: a fixed global batch (``--batch``, 8) and epoch (``--samples``, 32);
* weak scaling: a fixed local batch (4) per rank, 16 samples per rank per epoch.

The per-epoch time is the mean of epochs 2.. (the first warms up), from the run's own
metrics. Then a MODEL, labelled as such in the output: an Allreduce latency-bandwidth
fit t(n) = alpha + beta n measured here with mpi4py on 2 ranks, the ring Allreduce cost
2 (P-1) alpha + 2 (P-1)/P n beta, and the measured compute seconds per sample at 1
thread, projected to 1-128 nodes of ``--ranks-per-node`` single-thread ranks. Give
``--alpha``/``--bandwidth`` of a real fabric to project with those instead. Prints JSON.

    python benchmarks/scaling.py [--resolutions 64 128 256] [--epochs 3]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launch import mpiexec, thread_env, train_run  # noqa: E402  (benchmarks/launch.py, beside this script)

RANKS = (1, 2, 4)
LOCAL_BATCH = 4


def epoch_time(resolution: int, ranks: int, batch: int, samples: int, epochs: int, workdir: Path,
               device: str = "cpu") -> dict:
    """Train ``epochs`` epochs on ``ranks`` ranks; mean seconds per epoch after the first, and its split."""
    run_dir = workdir / f"r{resolution}_p{ranks}_b{batch}_s{samples}"
    steps = samples // batch
    sets = {
        # One level: the shipped config's multigrid schedule would time other grids' epochs too.
        "problem.resolution": f"[{resolution},{resolution}]", "multigrid.levels": "[]", "burgers.test_c": "[4.0]", "data.n_train": samples,
        "data.sampling": "random", "train.batch_size": batch, "train.epochs": epochs, "train.log_every": steps,
        "train.checkpoint_every": 100000, "parallel.threads_per_rank": 1, "output.plots": "false",
        "parallel.device": device,
    }
    print(f"  {resolution}^2, P = {ranks}, global batch {batch}, {samples} samples/epoch ...", file=sys.stderr, flush=True)
    train_run(ROOT / "configs" / "burgers.toml", run_dir, ranks, [f"{k}={v}" for k, v in sets.items()], threads=1,
              quiet=True, timeout=3600)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    ends = [r["elapsed_s"] for r in records]
    per_epoch = [b - a for a, b in zip(ends, ends[1:])]
    later = records[1:]
    return {
        "epoch_s": round(sum(per_epoch) / len(per_epoch), 3),
        "compute_s_per_step": round(sum(r["compute_s"] for r in later) / len(later), 4),
        "comm_s_per_step": round(sum(r["comm_s"] for r in later) / len(later), 5),
    }


def allreduce_worker(sizes: list[int], reps: int) -> None:
    """Median seconds of an in-place float32 Allreduce per message size (run under mpiexec)."""
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    out = {}
    for n in sizes:
        buf = np.ones(n // 4, dtype=np.float32)
        times = []
        for _ in range(reps):
            comm.Barrier()
            t0 = time.perf_counter()
            comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            times.append(time.perf_counter() - t0)
        out[n] = sorted(times)[len(times) // 2]
    if comm.rank == 0:
        print(json.dumps(out))


def fit_allreduce(reps: int = 30) -> dict:
    """alpha (s) and beta (s/byte) of t = alpha + beta n, fitted on 2 ranks, relative residuals weighted."""
    import numpy as np

    cmd = [mpiexec(), "-n", "2", sys.executable, __file__, "--allreduce-worker", "--reps", str(reps)]  # 16 B .. 64 MiB
    proc = subprocess.run(cmd, check=True, env=thread_env(1), capture_output=True, text=True, timeout=600)
    measured = {int(k): v for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}
    n = np.array(sorted(measured), dtype=np.float64)
    t = np.array([measured[int(k)] for k in n])
    # Least squares on t/t_i = 1 so the small messages (latency) count as much as the large.
    design = np.stack([np.ones_like(n), n], axis=1) / t[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(n), rcond=None)
    alpha, beta = max(alpha, 0.0), max(beta, 1e-15)
    # On 2 ranks the ring moves 2 (P-1)/P n = n bytes per rank with 2 (P-1) = 2 latencies.
    return {"alpha_s": alpha / 2, "beta_s_per_byte": beta, "bandwidth_gb_s": 1e-9 / beta,
            "measured": {str(int(k)): measured[int(k)] for k in n}}


def ring_allreduce(p: int, nbytes: float, alpha: float, beta: float) -> float:
    """Ring Allreduce model: 2 (P-1) messages of latency alpha, 2 (P-1)/P of the bytes through each rank."""
    return 0.0 if p == 1 else 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta


def project(t_sample: float, nbytes: float, alpha: float, beta: float, ranks_per_node: int,
            nodes: list[int], strong_batch: int) -> list[dict]:
    """Per-epoch seconds of the model for strong (fixed global batch, one epoch = 2 batches) and weak scaling."""
    rows = []
    for n in nodes:
        p = n * ranks_per_node
        comm = ring_allreduce(p, nbytes, alpha, beta)
        strong_step = math.ceil(strong_batch / p) * t_sample + comm
        weak_step = LOCAL_BATCH * t_sample + comm
        rows.append({"nodes": n, "ranks": p, "strong_epoch_s": round(2 * strong_step, 4),
                     "strong_speedup": None, "weak_epoch_s": round(4 * weak_step, 4),
                     "allreduce_s": round(comm, 6)})
    for r in rows:
        r["strong_speedup"] = round(rows[0]["strong_epoch_s"] / r["strong_epoch_s"], 1)
        r["weak_efficiency"] = round(rows[0]["weak_epoch_s"] / r["weak_epoch_s"], 3)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolutions", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8, help="global batch of the strong-scaling runs")
    parser.add_argument("--samples", type=int, default=32, help="samples per epoch of the strong-scaling runs")
    parser.add_argument("--ranks-per-node", type=int, default=48, help="projection: single-thread ranks per node")
    parser.add_argument("--alpha", type=float, help="projection: Allreduce latency (s) instead of the fit")
    parser.add_argument("--bandwidth", type=float, help="projection: Allreduce bandwidth (GB/s) instead of the fit")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="parallel.device of the training runs (cuda: one GPU per rank)")
    parser.add_argument("--allreduce-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=30, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.allreduce_worker:
        allreduce_worker([4**k for k in range(2, 14)], args.reps)
        return
    from diffnet.generators.networks import build_network, parameter_count

    nbytes = 4 * parameter_count(build_network("unet", 3, (16, 32, 64, 128)))  # the default Burgers U-Net
    measured = []
    with tempfile.TemporaryDirectory() as tmp:
        for res in args.resolutions:
            for p in RANKS:
                strong = epoch_time(res, p, args.batch, args.samples, args.epochs, Path(tmp), args.device)
                weak = epoch_time(res, p, LOCAL_BATCH * p, 4 * LOCAL_BATCH * p, args.epochs, Path(tmp), args.device)
                measured.append({"resolution": res, "ranks": p, "oversubscribed": p > (os.cpu_count() or 1),
                                 "strong": strong, "weak": weak})
    for res in args.resolutions:
        rows = [m for m in measured if m["resolution"] == res]
        for m in rows:
            m["strong_speedup"] = round(rows[0]["strong"]["epoch_s"] / m["strong"]["epoch_s"], 2)
            m["strong_efficiency"] = round(m["strong_speedup"] / m["ranks"], 3)
            m["weak_efficiency"] = round(rows[0]["weak"]["epoch_s"] / m["weak"]["epoch_s"], 3)
    fit = fit_allreduce(args.reps)
    alpha = args.alpha if args.alpha is not None else fit["alpha_s"]
    beta = 1e-9 / args.bandwidth if args.bandwidth else fit["beta_s_per_byte"]
    projection = {}
    for res in args.resolutions:
        one = next(m for m in measured if m["resolution"] == res and m["ranks"] == 1)
        t_sample = one["strong"]["compute_s_per_step"] / args.batch
        projection[str(res)] = {
            "compute_s_per_sample": round(t_sample, 5),
            "rows": project(t_sample, nbytes, alpha, beta, args.ranks_per_node, [2**k for k in range(8)],
                            strong_batch=128 * args.ranks_per_node),
        }
    print(json.dumps({
        "benchmark": "scaling",
        "cores": os.cpu_count(),
        "threads_per_rank": 1,
        "measured": measured,
        "allreduce_fit": {k: v for k, v in fit.items()},
        "projection": {
            "label": "MODEL, not a measurement: per-rank compute measured here at 1 thread, ring Allreduce with "
                     + ("the given alpha/bandwidth" if args.alpha is not None or args.bandwidth else
                        "alpha/beta fitted here on 2 ranks of one node (shared memory; a network fabric is slower)"),
            "ranks_per_node": args.ranks_per_node,
            "gradient_bytes": nbytes,
            "alpha_s": alpha,
            "bandwidth_gb_s": 1e-9 / beta,
            "strong_global_batch": 128 * args.ranks_per_node,
            "weak_local_batch": LOCAL_BATCH,
            "by_resolution": projection,
        },
    }, indent=2))


if __name__ == "__main__":
    main()
