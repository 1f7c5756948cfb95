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
the scaling model's prediction of every measured step time (benchmarks/scaling.py's ring
Allreduce among the nodes -- MPICH sums within a node first on its own -- with the fabric's
alpha and beta, plus the compute seconds per step measured with the same ranks on one node,
as the emulated nodes share this machine's cores), and what the same model predicts with
scaling.py's shared-memory alpha and beta. Prints one JSON object; ``--plot`` draws a figure.

    python benchmarks/multinode.py [--steps N] [--repeats R] [--fabrics 1g 10g] [--layouts 2x1 ...]
                                   [--cases compute comm] [--plot FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import data_parallel  # benchmarks/, beside this script
from emunet import Fabric, unavailable
from launch import ROOT, mpiexec, thread_env
from scaling import allreduce_worker, fit_allreduce, ring_allreduce

FABRICS = {"1g": ("1gbit", 50.0), "10g": ("10gbit", 20.0)}
LAYOUTS = [(2, 1), (2, 2), (4, 1)]  # (nodes, ranks per node)
SWEEP = [4 * 2**k for k in range(0, 18, 2)] + [2**k for k in range(20, 25)]  # 4 B .. 256 KiB, 1 .. 16 MiB


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


# ----------------------------------------------------------------------------- driver


def _job(fabric: Fabric, nodes: int, ppn: int, args: list[str], timeout: float = 900) -> dict:
    cmd = fabric.mpiexec(ppn, [sys.executable, __file__, *args], nodes=nodes)
    env = fabric.env(thread_env(1, MASTER_PORT=str(random.randint(20000, 60000))))  # DDP's rendezvous on node 0
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        sys.exit(f"multinode.py: {' '.join(args)} on {nodes}x{ppn} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fit_alpha_beta(measured: dict[int, float]) -> dict:
    """alpha (s) and beta (s/byte) of a 2-node Allreduce t = 2 alpha + n beta (Hockney's model, fitted per regime).

    alpha from the smallest message; beta the least-squares slope of the messages of 1 MiB and
    more. One least-squares line through all sizes does not fit a shaped link: the token
    bucket lets a burst (1 ms of bytes) through at the machine's speed, so messages below it
    see no shaping at all.
    """
    import numpy as np

    sizes = sorted(measured)
    large = [n for n in sizes if n >= 2**20]
    beta = float(np.polyfit(np.array(large, float), np.array([measured[n] for n in large]), 1)[0])
    alpha = measured[sizes[0]] / 2
    model = {n: 2 * alpha + n * beta for n in sizes}
    return {"alpha_s": alpha, "beta_s_per_byte": beta, "bandwidth_gb_s": 1e-9 / beta,
            "fit_worst_relative_error_from_1MiB": max(abs(model[n] - measured[n]) / measured[n] for n in large),
            "measured_s": {str(n): round(measured[n], 7) for n in sizes}}


def predicted_step(compute_s: float, nodes: int, nbytes: float, ab: dict) -> dict:
    """The scaling model's step: the compute seconds + the ring Allreduce among the nodes (MPICH sums within a node
    first, so only the nodes are in the ring)."""
    comm = ring_allreduce(nodes, nbytes, ab["alpha_s"], ab["beta_s_per_byte"])
    return {"compute_s": compute_s, "allreduce_s": comm, "step_s": compute_s + comm}


def run_fabric(name: str, steps: int, repeats: int, layouts: list[tuple[int, int]], cases: list[str]) -> dict:
    rate, latency = FABRICS[name]
    with Fabric(max(n for n, _ in layouts), rate, latency) as fabric:
        print(f"[{name}] {rate} links ({'netem' if fabric.latency_emulated else 'no netem: latency not added'}); "
              "Allreduce sweep ...", file=sys.stderr, flush=True)
        sweep = _job(fabric, 2, 1, ["--worker", "sweep", "--reps", "9"])
        out = {"rate": rate, "latency_us_asked": latency, "latency_emulated": fabric.latency_emulated,
               "fit": fit_alpha_beta({int(k): v for k, v in sweep.items()}), "runs": {}}
        for nodes, ppn in layouts:
            for case in cases:
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


def one_node_compute(steps: int, layouts: list[tuple[int, int]], cases: list[str]) -> dict:
    """Compute seconds per step (outside communication) of each case at each rank count, all ranks on this one
    node, flat sum: the model's compute term, since the emulated nodes share this machine's cores."""
    out = {}
    for case in cases:
        for ranks in sorted({n * p for n, p in layouts}):
            print(f"[one node] {case} on {ranks} ranks ...", file=sys.stderr, flush=True)
            cmd = [mpiexec(), "-n", str(ranks), sys.executable, __file__, "--worker", "deepfusion", "--case", case,
                   "--steps", str(steps), "--batch", str(batch(case, ranks)), "--gradsync", "flat"]
            proc = subprocess.run(cmd, env=thread_env(1), capture_output=True, text=True, timeout=900, check=True)
            out[f"{case}_{ranks}"] = json.loads(proc.stdout.strip().splitlines()[-1])["compute_s_per_step"]
    return out


def summarise(results: dict) -> None:
    """Model predictions beside the measured steps, the ratios against DDP, the projection errors."""
    errors: dict[str, list[float]] = {"fabric": [], "all": [], "shared": []}
    for fab in results["fabrics"].values():
        for key, runs in fab["runs"].items():
            case, layout = key.split("_")
            nodes, ppn = map(int, layout.split("x"))
            compute = results["one_node_compute_s"][f"{case}_{nodes * ppn}"]
            for vname, r in runs.items():
                r["step_s"] = batch(case, nodes * ppn) / r["samples_per_s"]
                if vname == "ddp":
                    continue
                nbytes = r["gradient_bytes"] / (2 if vname == "bf16" else 1)
                model = predicted_step(compute, nodes, nbytes, fab["fit"])
                r["model"] = {k: round(v, 4) for k, v in model.items()}
                r["model_relative_error"] = round((model["step_s"] - r["step_s"]) / r["step_s"], 3)
                r["ratio_vs_ddp"] = round(r["samples_per_s"] / runs["ddp"]["samples_per_s"], 3)
                errors["all"].append(abs(r["model_relative_error"]))
                if vname == "flat":  # the model has no overlap: it is the model of the flat sum
                    errors["fabric"].append(abs(r["model_relative_error"]))
                    shared = predicted_step(compute, nodes, nbytes, results["shared_memory_fit"])["step_s"]
                    errors["shared"].append(abs(shared - r["step_s"]) / r["step_s"])
    one_g = results["fabrics"].get("1g", {}).get("runs", {})
    keys = {"ratio_vs_ddp_comm_network": ("comm_2x2", "bucketed"),
            "ratio_vs_ddp_comm_network_hierarchical": ("comm_2x2", "hierarchical"),
            "ratio_vs_ddp_comm_network_bf16": ("comm_2x2", "bf16"),
            "ratio_vs_ddp_comm_network_1ppn": ("comm_2x1", "bucketed"),
            "ratio_vs_ddp_comm_network_1ppn_bf16": ("comm_2x1", "bf16"),
            "ratio_vs_ddp_compute_network": ("compute_2x1", "bucketed"),
            "ratio_vs_ddp_compute_network_2x2": ("compute_2x2", "bucketed")}
    for key, (run, variant) in keys.items():  # those the layouts and cases run give
        if variant in one_g.get(run, {}):
            results[key] = one_g[run][variant]["ratio_vs_ddp"]
    results["projection_error"] = round(max(errors["fabric"]), 3) if errors["fabric"] else None
    results["projection_error_all_variants"] = round(max(errors["all"]), 3) if errors["all"] else None
    results["projection_error_shared_memory_fit"] = round(max(errors["shared"]), 3) if errors["shared"] else None
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
    parser.add_argument("--layouts", nargs="+", default=[f"{n}x{p}" for n, p in LAYOUTS],
                        help="NODESxRANKS_PER_NODE (default 2x1 2x2 4x1)")
    parser.add_argument("--cases", nargs="+", choices=list(data_parallel.CASES), default=list(data_parallel.CASES))
    parser.add_argument("--plot", type=Path, help="also draw the ratios to this PNG")
    parser.add_argument("--worker", choices=["deepfusion", "ddp", "sweep"], help=argparse.SUPPRESS)
    parser.add_argument("--case", choices=list(data_parallel.CASES), help=argparse.SUPPRESS)
    parser.add_argument("--gradsync", default="bucketed", help=argparse.SUPPRESS)
    parser.add_argument("--grad-dtype", default="train", help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=9, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "sweep":  # median seconds of a raw Allreduce per size of SWEEP, as scaling.py measures
        allreduce_worker(SWEEP, args.reps)
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
    layouts = []
    for text in args.layouts:
        parts = text.split("x")
        if len(parts) != 2 or not all(p.isdigit() for p in parts) or not 2 <= int(parts[0]) <= 16 or int(parts[1]) < 1:
            sys.exit(f"multinode.py: --layouts: {text!r} is not NODESxRANKS with 2..16 nodes, e.g. 2x2")
        layouts.append((int(parts[0]), int(parts[1])))
    why = unavailable()
    if why:
        sys.exit(f"multinode.py: no emulated nodes here: {why}")
    results: dict = {"benchmark": "multinode", "cores": os.cpu_count(), "steps": args.steps,
                     "shared_memory_fit": fit_allreduce(reps=9),  # scaling.py's fit: 2 ranks on this node
                     "one_node_compute_s": one_node_compute(args.steps, layouts, args.cases), "fabrics": {}}
    for name in args.fabrics:
        results["fabrics"][name] = run_fabric(name, args.steps, args.repeats, layouts, args.cases)
    summarise(results)
    if args.plot:
        plot(results, args.plot)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
