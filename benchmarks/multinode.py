"""Data-parallel training across emulated nodes: deepfusion against DDP (gloo) on the same network.

For each fabric (``1g``: 1 Gb/s links, 50 us asked; ``10g``: 10 Gb/s, 20 us asked -- see
benchmarks/emunet.py for what this kernel can shape) and each layout (2 nodes x 1 rank,
2 nodes x 2 ranks, 4 nodes x 1 rank), runs the compute-heavy and communication-heavy cases of
benchmarks/data_parallel.py as real MPI jobs across the nodes:

* deepfusion with the bucketed (overlapped) and the flat gradient sum, the node-by-node sum
  where a node has two ranks, and bfloat16 between nodes (communication case);
* torch DistributedDataParallel (gloo over TCP on the same links).

It reports samples/s, the exposed communication per step (the time a step waits for its
sums), the fabric's alpha and beta fitted from a raw Allreduce sweep between two nodes, and
the scaling model's prediction of every measured step time (benchmarks/scaling.py's model:
compute per sample measured on one rank, times the ranks sharing this machine's cores, plus
a ring Allreduce among the nodes -- MPICH sums within a node first on its own). Prints one
JSON object; ``--plot`` draws docs/multinode.png.

    python benchmarks/multinode.py [--steps N] [--repeats R] [--fabrics 1g 10g] [--plot FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import data_parallel  # benchmarks/, beside this script
from emunet import Fabric, unavailable
from launch import ROOT, thread_env
from scaling import ring_allreduce

FABRICS = {"1g": ("1gbit", 50.0), "10g": ("10gbit", 20.0)}
LAYOUTS = [(2, 1), (2, 2), (4, 1)]  # (nodes, ranks per node)
SWEEP = [4 * 2**k for k in range(0, 23, 2)]  # 4 B .. 16 MiB


def variants(case: str, ppn: int) -> dict[str, tuple[str, str, str]]:
    """name -> (kind, gradsync, grad_dtype) of the runs of ``case`` at ``ppn`` ranks per node."""
    out = {"ddp": ("ddp", "", ""), "bucketed": ("deepfusion", "bucketed", "train"),
           "flat": ("deepfusion", "flat", "train")}
    if ppn > 1:
        out["hierarchical"] = ("deepfusion", "hierarchical", "train")
    if case == "comm":
        out["bf16"] = ("deepfusion", "hierarchical" if ppn > 1 else "bucketed", "bfloat16")
    return out


def batch(case: str, ranks: int) -> int:
    """The global batch: the compute case's own (8); the communication case keeps one sample per rank."""
    return ranks if case == "comm" else data_parallel.CASES[case]["batch"]


# ----------------------------------------------------------------------------- workers (under mpiexec)


def sweep_worker(reps: int) -> None:
    """Median seconds of a raw in-place float32 Allreduce for each size of SWEEP."""
    import time

    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    out = {}
    for n in SWEEP:
        buf = np.ones(max(1, n // 4), dtype=np.float32)
        times = []
        for _ in range(reps):
            comm.Barrier()
            t0 = time.perf_counter()
            comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            times.append(time.perf_counter() - t0)
        out[n] = sorted(times)[len(times) // 2]
    if comm.rank == 0:
        print(json.dumps(out))


# ----------------------------------------------------------------------------- driver


def _job(fabric: Fabric, nodes: int, ppn: int, args: list[str], timeout: float = 900) -> dict:
    cmd = fabric.mpiexec(ppn, [sys.executable, __file__, *args], nodes=nodes)
    env = fabric.env(thread_env(1, MASTER_PORT=str(random.randint(20000, 60000))))  # DDP's rendezvous on node 0
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        sys.exit(f"multinode.py: {' '.join(args)} on {nodes}x{ppn} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fit_alpha_beta(measured: dict[int, float]) -> dict:
    """alpha (s) and beta (s/byte) of the 2-node ring t = 2 alpha + n beta, relative residuals weighted."""
    import numpy as np

    n = np.array(sorted(measured), dtype=np.float64)
    t = np.array([measured[int(k)] for k in n])
    design = np.stack([np.ones_like(n), n], axis=1) / t[:, None]
    (a2, beta), *_ = np.linalg.lstsq(design, np.ones_like(n), rcond=None)
    fit = a2 + n * beta
    return {"alpha_s": max(a2, 0.0) / 2, "beta_s_per_byte": max(beta, 1e-15), "bandwidth_gb_s": 1e-9 / max(beta, 1e-15),
            "fit_worst_relative_error": float(np.abs(fit - t).max() / t.max()),
            "measured_s": {str(int(k)): round(float(v), 7) for k, v in zip(n, t)}}


def predicted_step(t_sample: float, b_loc: int, ranks: int, nodes: int, nbytes: float, ab: dict) -> dict:
    """The scaling model's step: compute (b_loc samples, slowed by ranks sharing the cores) + the ring among nodes."""
    share = max(1.0, ranks / (os.cpu_count() or 1))
    compute = b_loc * t_sample * share
    comm = ring_allreduce(nodes, nbytes, ab["alpha_s"], ab["beta_s_per_byte"])
    return {"compute_s": compute, "allreduce_s": comm, "step_s": compute + comm}


def run_fabric(name: str, steps: int, repeats: int) -> dict:
    rate, latency = FABRICS[name]
    with Fabric(max(n for n, _ in LAYOUTS), rate, latency) as fabric:
        print(f"[{name}] {rate} links ({'netem' if fabric.latency_emulated else 'no netem: latency not added'}); "
              "Allreduce sweep ...", file=sys.stderr, flush=True)
        sweep = _job(fabric, 2, 1, ["--worker", "sweep", "--reps", "9"])
        out = {"rate": rate, "latency_us_asked": latency, "latency_emulated": fabric.latency_emulated,
               "fit": fit_alpha_beta({int(k): v for k, v in sweep.items()}), "runs": {}}
        for nodes, ppn in LAYOUTS:
            for case in data_parallel.CASES:
                key = f"{case}_{nodes}x{ppn}"
                runs: dict = {}
                for _ in range(repeats):  # interleaved, the best kept
                    for vname, (kind, gradsync, grad_dtype) in variants(case, ppn).items():
                        print(f"[{name}] {key} {vname} ...", file=sys.stderr, flush=True)
                        before = fabric.tx_bytes()
                        r = _job(fabric, nodes, ppn, ["--worker", kind, "--case", case, "--steps", str(steps),
                                                      "--batch", str(batch(case, nodes * ppn)),
                                                      "--gradsync", gradsync or "bucketed",
                                                      "--grad-dtype", grad_dtype or "train"])
                        r["link_bytes_per_step"] = round(sum(a - b for a, b in zip(fabric.tx_bytes(), before))
                                                         / nodes / (steps + data_parallel.WARMUP))
                        if vname not in runs or r["samples_per_s"] > runs[vname]["samples_per_s"]:
                            runs[vname] = r
                out["runs"][key] = runs
    return out


def one_rank_compute(steps: int) -> dict:
    """Seconds per sample of each case on one rank, one thread (no communication): the model's compute."""
    out = {}
    for case in data_parallel.CASES:
        proc = subprocess.run([sys.executable, __file__, "--worker", "deepfusion", "--case", case, "--steps",
                               str(steps)], env=thread_env(1), capture_output=True, text=True, timeout=900, check=True)
        out[case] = 1.0 / json.loads(proc.stdout.strip().splitlines()[-1])["samples_per_s"]
    return out


def summarise(results: dict) -> None:
    """Model predictions beside the measured steps, the ratios against DDP, the projection error."""
    errors, errors_all = [], []
    for fab in results["fabrics"].values():
        for key, runs in fab["runs"].items():
            case, layout = key.split("_")
            nodes, ppn = map(int, layout.split("x"))
            ranks = nodes * ppn
            b = batch(case, ranks)
            for vname, r in runs.items():
                r["step_s"] = b / r["samples_per_s"]
                if vname == "ddp":
                    continue
                nbytes = r["gradient_bytes"] / (2 if vname == "bf16" else 1)
                model = predicted_step(results["t_sample_s"][case], b // ranks, ranks, nodes, nbytes, fab["fit"])
                r["model"] = {k: round(v, 4) for k, v in model.items()}
                r["model_relative_error"] = round((model["step_s"] - r["step_s"]) / r["step_s"], 3)
                r["ratio_vs_ddp"] = round(r["samples_per_s"] / runs["ddp"]["samples_per_s"], 3)
                errors_all.append(abs(r["model_relative_error"]))
                if vname == "flat":  # the model has no overlap: it is the model of the flat sum
                    errors.append(abs(r["model_relative_error"]))
    one_g = results["fabrics"].get("1g", {}).get("runs", {})
    if one_g:
        r22, r21 = one_g["comm_2x2"], one_g["comm_2x1"]
        results["ratio_vs_ddp_comm_network"] = r22["bucketed"]["ratio_vs_ddp"]
        results["ratio_vs_ddp_comm_network_hierarchical"] = r22["hierarchical"]["ratio_vs_ddp"]
        results["ratio_vs_ddp_comm_network_bf16"] = r22["bf16"]["ratio_vs_ddp"]
        results["ratio_vs_ddp_comm_network_1ppn"] = r21["bucketed"]["ratio_vs_ddp"]
        results["ratio_vs_ddp_comm_network_1ppn_bf16"] = r21["bf16"]["ratio_vs_ddp"]
        results["ratio_vs_ddp_compute_network"] = one_g["compute_2x1"]["bucketed"]["ratio_vs_ddp"]
        results["ratio_vs_ddp_compute_network_2x2"] = one_g["compute_2x2"]["bucketed"]["ratio_vs_ddp"]
    results["projection_error"] = round(max(errors), 3) if errors else None
    results["projection_error_all_variants"] = round(max(errors_all), 3) if errors_all else None
    results["goals"] = {"ratio_vs_ddp_comm_network": 1.5, "ratio_vs_ddp_comm_network_1ppn": 1.0,
                        "ratio_vs_ddp_compute_network": 1.0, "projection_error": 0.2}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from curves import save_figure

    fabs = list(results["fabrics"])
    fig, axes = plt.subplots(1, len(fabs), figsize=(6.5 * len(fabs), 4.2), squeeze=False)
    for ax, name in zip(axes[0], fabs):
        runs = results["fabrics"][name]["runs"]
        keys = list(runs)
        names = ["ddp", "bucketed", "flat", "hierarchical", "bf16"]
        width = 0.8 / len(names)
        for j, v in enumerate(names):
            xs = [i + (j - 2) * width for i, k in enumerate(keys) if v in runs[k]]
            ys = [runs[k][v]["samples_per_s"] / runs[k]["ddp"]["samples_per_s"] for k in keys if v in runs[k]]
            ax.bar(xs, ys, width, label=v)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(range(len(keys)), [k.replace("_", "\n") for k in keys])
        ax.set_ylabel("samples/s relative to DDP (gloo)")
        ax.set_title(f"{results['fabrics'][name]['rate']} links, emulated nodes x ranks")
        ax.legend(fontsize=8)
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=15, help="timed steps per run (after warm-up)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each variant; the best is kept")
    parser.add_argument("--fabrics", nargs="+", choices=list(FABRICS), default=list(FABRICS))
    parser.add_argument("--plot", type=Path, help="also draw the ratios to this PNG")
    parser.add_argument("--worker", choices=["deepfusion", "ddp", "sweep"], help=argparse.SUPPRESS)
    parser.add_argument("--case", choices=list(data_parallel.CASES), help=argparse.SUPPRESS)
    parser.add_argument("--gradsync", default="bucketed", help=argparse.SUPPRESS)
    parser.add_argument("--grad-dtype", default="train", help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=9, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "sweep":
        sweep_worker(args.reps)
        return
    if args.worker:
        if args.worker == "deepfusion":
            out = data_parallel.worker_deepfusion(args.case, 1, args.steps, args.gradsync, args.grad_dtype,
                                                  bandwidth=False, batch=args.batch)
        else:
            out = data_parallel._bare_or_ddp_loop(args.case, 1, args.steps, ddp=True, batch=args.batch)
        if out:
            print(json.dumps(out))
        return
    if args.steps < 1 or args.repeats < 1:
        sys.exit("multinode.py: --steps and --repeats must be >= 1")
    why = unavailable()
    if why:
        sys.exit(f"multinode.py: no emulated nodes here: {why}")
    results: dict = {"benchmark": "multinode", "cores": os.cpu_count(), "steps": args.steps,
                     "t_sample_s": one_rank_compute(args.steps), "fabrics": {}}
    for name in args.fabrics:
        results["fabrics"][name] = run_fabric(name, args.steps, args.repeats)
    summarise(results)
    if args.plot:
        plot(results, args.plot)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
