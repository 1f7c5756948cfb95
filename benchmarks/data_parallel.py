"""Data-parallel throughput: deepfusion against a bare PyTorch loop and torch DDP (gloo).

For two cases -- compute-heavy (the default U-Net at 128^2) and communication-heavy (a
9.9 M-parameter U-Net at 32^2 with a local batch of 1) -- runs, each as its own process
group with the same model, global batch and loss:

    (a) deepfusion, 1 rank x 1 thread        (b) a bare PyTorch loop, 1 thread
    (c) deepfusion, 2 ranks x 1 thread       (d) torch DistributedDataParallel (gloo), 2 x 1
    (e) deepfusion, 1 rank x 2 threads

and prints one JSON object with samples/s of each and the ratios ``ratio_vs_bare``
(a/b), ``ratio_vs_ddp_compute`` and ``ratio_vs_ddp_comm`` (c/d), plus the bandwidth of
deepfusion's flat gradient Allreduce against one raw mpi4py Allreduce of the same bytes
(``allreduce_ratio``). Separate processes differ by a few per cent from one start to the
next on this machine (0.935 and 1.09 for c/d an hour apart), so every variant runs
``--repeats`` times, interleaved (a b c d e, a b c d e, ...) so that drifting load hits all
alike; each ratio is the median of the per-repeat ratios, with their spread (min, max) under
``spread``. (c) and (d) of the compute case also run in alternating blocks inside the same
two processes (``ratio_vs_ddp_compute_same_process``: the median of the per-block ratios).

    python benchmarks/data_parallel.py [--steps N] [--repeats R]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

from launch import mpiexec, thread_env  # benchmarks/launch.py, beside this script

CASES = {
    "compute": {"resolution": (128, 128), "channels": (16, 32, 64, 128), "batch": 8},
    "comm": {"resolution": (32, 32), "channels": (36, 72, 144, 288, 576), "batch": 2},
}
# Steps before timing starts, and timed steps by default: 12 timed steps after 3 gave deepfusion
# 0.93 of DDP at 128^2 in two runs, 40 after 3 gave 1.00 on the same day (the first steps of a
# process are slower, and for a 3.4 s window a few of them weigh); both figures are steady-state.
WARMUP = 5


# ----------------------------------------------------------------------------- workers


def _setup(case: str, threads: int, batch: int | None = None):
    import torch

    torch.set_num_threads(threads)
    from diffnet.generators.networks import UNet
    from diffnet.families.burgers import BurgersFamily

    spec = CASES[case]
    torch.manual_seed(0)
    problem = BurgersFamily(spec["resolution"], viscosity=0.01)
    model = UNet(problem.in_channels, 1, spec["channels"])
    with torch.no_grad():  # a non-trivial head, so every layer gets gradients
        model.head.weight.normal_(0, 0.01)
    return problem, model, batch or spec["batch"]


def _params(n: int):
    import numpy as np

    return np.linspace(3.0, 6.0, n)


def worker_deepfusion(case: str, threads: int, steps: int, gradsync: str = "bucketed", grad_dtype: str = "train",
                      bandwidth: bool = True, batch: int | None = None) -> dict:
    """deepfusion's trainer on ``case``; samples/s after the warm-up, exposed communication per step
    (the time a step waits for its sums), and with ``bandwidth`` the flat Allreduce against a raw one;
    ``batch`` replaces the case's global batch."""
    from deepfusion.configuration.schema import ParallelConfig, TrainConfig
    from deepfusion.parallel.comm import world
    from deepfusion.training.context import TrainingContext
    from deepfusion.configuration.run import Run
    from deepfusion.training.trainer import train

    comm = world()
    problem, model, b = _setup(case, threads, batch)
    cfg = TrainConfig(lr=1e-4, lr_schedule="constant", batch_size=b, epochs=WARMUP + steps, log_every=1)
    parallel = ParallelConfig(check_every=0, gradsync=gradsync, grad_dtype=grad_dtype)
    result = train(Run.of(problem, _params(b), cfg), model, TrainingContext(comm, 0, threads, parallel, log=lambda s: None))
    h = result.history
    seconds = h[-1]["elapsed_s"] - h[WARMUP - 1]["elapsed_s"]
    out = {"samples_per_s": steps * b / seconds, "ranks": comm.size, "threads": threads,
           "comm_s_per_step": sum(r["comm_s"] for r in h[WARMUP:]) / steps,
           "compute_s_per_step": sum(r["compute_s"] for r in h[WARMUP:]) / steps,
           "gradient_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}
    if comm.size > 1 and bandwidth:
        out.update(_allreduce_bandwidth(model, comm))
    return out if comm.rank == 0 else {}


def _allreduce_bandwidth(model, comm, reps: int = 20) -> dict:
    """Flat gradient Allreduce through GradSync vs a raw mpi4py Allreduce of the same bytes."""
    import numpy as np
    from mpi4py import MPI

    from deepfusion.parallel.gradsync import GradSync

    sync = GradSync(model, comm, "flat")
    raw = np.ones(sync.numel, dtype=np.float32)

    def timed(fn) -> float:
        best = float("inf")
        for _ in range(reps):
            comm.barrier()
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        return best

    t_sync = timed(sync.finish)
    t_raw = timed(lambda: MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, raw, op=MPI.SUM))
    sync.close()
    nbytes = raw.nbytes
    return {"allreduce_bytes": nbytes, "allreduce_gbps": nbytes / t_sync / 1e9,
            "raw_allreduce_gbps": nbytes / t_raw / 1e9}


def _bare_or_ddp_loop(case: str, threads: int, steps: int, ddp: bool, batch: int | None = None,
                      init: bool = True) -> dict:
    import torch

    problem, model, b = _setup(case, threads, batch)
    rank, size = 0, 1
    if ddp:
        import torch.distributed as dist

        rank, size = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
        if init:
            dist.init_process_group("gloo", rank=rank, world_size=size)
        model = torch.nn.parallel.DistributedDataParallel(model)
    b_loc = b // size
    c = torch.as_tensor(_params(b)[rank * b_loc : (rank + 1) * b_loc], dtype=torch.float32)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    for i in range(WARMUP + steps):
        if i == WARMUP:
            t0 = time.perf_counter()
        u = problem.field(model(problem.inputs(c)), c)
        # DDP averages gradients over ranks, so the local mean gives the global mean.
        loss = sum(t.sum() for t in problem.loss_terms(u, c).values()) / b_loc
        opt.zero_grad()
        loss.backward()
        opt.step()
    seconds = time.perf_counter() - t0
    if ddp and init:
        torch.distributed.destroy_process_group()
    return {"samples_per_s": steps * b / seconds, "ranks": size, "threads": threads} if rank == 0 else {}


def worker_same_process(case: str, steps: int, blocks: int) -> dict:
    """DDP (gloo) and deepfusion in alternating blocks inside one 2-rank job: both arms run in the same
    processes, so what differs from process to process (placement, allocator, start-up) drops out."""
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=int(os.environ["PMI_RANK"]), world_size=int(os.environ["PMI_SIZE"]))
    ddp, ours = [], []
    for _ in range(blocks):
        ddp.append(_bare_or_ddp_loop(case, 1, steps, ddp=True, init=False).get("samples_per_s"))
        ours.append(worker_deepfusion(case, 1, steps, bandwidth=False).get("samples_per_s"))
    dist.destroy_process_group()
    return {"ddp_samples_per_s": ddp, "deepfusion_samples_per_s": ours} if ours[0] is not None else {}


# ----------------------------------------------------------------------------- driver


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(kind: str, case: str, ranks: int, threads: int, steps: int, repeats: int = 1) -> dict:
    env = thread_env(threads, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    cmd = [sys.executable, __file__, "--worker", kind, "--case", case, "--threads", str(threads),
           "--steps", str(steps), "--repeats", str(repeats)]
    if kind in ("deepfusion", "ddp", "same-process"):
        cmd = [mpiexec(), "-n", str(ranks), *cmd]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        sys.exit(f"data_parallel.py: {kind} {case} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per run (after warm-up)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each variant, interleaved; medians reported")
    parser.add_argument("--worker", choices=["deepfusion", "bare", "ddp", "same-process"], help=argparse.SUPPRESS)
    parser.add_argument("--case", choices=list(CASES), help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        if args.worker == "deepfusion":
            out = worker_deepfusion(args.case, args.threads, args.steps)
        elif args.worker == "same-process":
            out = worker_same_process(args.case, args.steps, blocks=2 * args.repeats)
        else:
            out = _bare_or_ddp_loop(args.case, args.threads, args.steps, ddp=args.worker == "ddp")
        if out:
            print(json.dumps(out))
        return
    variants = {"a_deepfusion_1x1": ("deepfusion", 1, 1), "b_bare_1x1": ("bare", 1, 1),
                "c_deepfusion_2x1": ("deepfusion", 2, 1), "d_ddp_gloo_2x1": ("ddp", 2, 1),
                "e_deepfusion_1x2": ("deepfusion", 1, 2)}
    results: dict = {"benchmark": "data_parallel", "cores": os.cpu_count(), "repeats": args.repeats, "cases": {},
                     "spread": {}}
    runs: dict = {}
    for case, spec in CASES.items():
        runs[case] = {name: [] for name in variants}
        # Interleave the variants over the repeats so drifting machine load hits all alike.
        for _ in range(args.repeats):
            for name, (kind, ranks, threads) in variants.items():
                print(f"[{case}] {name} ...", file=sys.stderr, flush=True)
                runs[case][name].append(_launch(kind, case, ranks, threads, args.steps))
        figures = {"resolution": list(spec["resolution"]), "global_batch": spec["batch"],
                   "channels": list(spec["channels"])}
        for name, rs in runs[case].items():
            rates = [r["samples_per_s"] for r in rs]
            median = sorted(rs, key=lambda r: r["samples_per_s"])[len(rs) // 2]
            figures[name] = {**median, "samples_per_s": statistics.median(rates),
                             "samples_per_s_all": [round(v, 3) for v in rates]}
        results["cases"][case] = figures

    def ratio(key: str, case: str, top: str, bottom: str) -> None:
        # One ratio per repeat (the two arms ran next to each other), then their median and spread.
        per = [t["samples_per_s"] / b["samples_per_s"] for t, b in zip(runs[case][top], runs[case][bottom])]
        results[key] = round(statistics.median(per), 3)
        results["spread"][key] = {"min": round(min(per), 3), "max": round(max(per), 3),
                                  "all": [round(v, 3) for v in per]}

    ratio("ratio_vs_bare", "compute", "a_deepfusion_1x1", "b_bare_1x1")
    ratio("ratio_vs_bare_comm_case", "comm", "a_deepfusion_1x1", "b_bare_1x1")
    ratio("ratio_vs_ddp_compute", "compute", "c_deepfusion_2x1", "d_ddp_gloo_2x1")
    ratio("ratio_vs_ddp_comm", "comm", "c_deepfusion_2x1", "d_ddp_gloo_2x1")
    ratio("ratio_2x1_vs_1x2_compute", "compute", "c_deepfusion_2x1", "e_deepfusion_1x2")
    cc = results["cases"]["compute"]
    results["strong_scaling_efficiency_1to2_compute"] = round(
        cc["c_deepfusion_2x1"]["samples_per_s"] / (2 * cc["a_deepfusion_1x1"]["samples_per_s"]), 3)
    bandwidth = [r["allreduce_gbps"] / r["raw_allreduce_gbps"] for r in runs["comm"]["c_deepfusion_2x1"]]
    results["allreduce_ratio"] = round(statistics.median(bandwidth), 3)
    print("[compute] DDP and deepfusion alternating in the same 2 processes ...", file=sys.stderr, flush=True)
    same = _launch("same-process", "compute", 2, 1, args.steps, args.repeats)
    results["same_process_compute"] = same
    per_block = [o / d for o, d in zip(same["deepfusion_samples_per_s"], same["ddp_samples_per_s"])]
    results["ratio_vs_ddp_compute_same_process"] = round(statistics.median(per_block), 3)
    results["spread"]["ratio_vs_ddp_compute_same_process"] = {
        "min": round(min(per_block), 3), "max": round(max(per_block), 3), "all": [round(v, 3) for v in per_block]}
    results["goals"] = {"ratio_vs_bare": 0.97, "ratio_vs_ddp_compute": 1.0, "ratio_vs_ddp_comm": 1.5,
                        "allreduce_ratio": 0.9}
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
