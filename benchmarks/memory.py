"""Peak resident memory per sample and samples/s of a training step at 256^2, 512^2 and 1024^2 (3-D configs:
grid^3), plain and checkpointed.

Each case runs in a fresh process: the config's problem and model are built at the
grid, the resident set is read (``baseline``), the kernel's high-water mark is reset
(``/proc/self/clear_refs``), then ``--steps`` full training steps run (forward, loss,
backward, Adam) and the high-water mark is read again (``peak``). Every grid runs at
local batch 1 and 2: the memory per sample is the difference of the two peaks (what
one more sample costs; the fixed part -- weights, gradients, Adam state, library
buffers -- cancels), and samples/s is the batch-2 run's timed step (the first step is
not timed). ``memory_ratio_1024`` is plain/checkpointed memory per sample at 1024^2.

The largest local batch at 1024^2 within ``--budget-gib`` (20) is the linear model
peak(B) = peak(1) + (B - 1) * per-sample of the checkpointed runs, labelled as a model
and checked against a measured batch-4 peak (``fit_check``). Memory is the process's
resident set as the allocator leaves it, with transparent huge pages for large tensors
as ``deepfusion train`` sets them; one more 1024^2 run without them gives
``huge_pages_speedup_1024``. Linux only. Prints one JSON object.

    python benchmarks/memory.py [--config configs/poisson_1024.toml] [--threads 2]
    python benchmarks/memory.py --config configs/poisson3d.toml --grids 65 129 --budget-gib 20
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GiB = 2**30


def _status_bytes(field: str) -> int:
    """A memory figure of this process from /proc/self/status (``VmRSS``, ``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def worker(config: Path, grid: int, batch: int, checkpointed: bool, steps: int, threads: int, device: str) -> dict:
    """One case, in this process: memory and speed of ``steps`` training steps."""
    from deepfusion.parallel.runtime import use_huge_pages

    use_huge_pages()  # as `deepfusion train` does, before torch allocates
    import torch

    from deepfusion.configuration.config import load_config
    from deepfusion.configuration.run import Run
    from deepfusion.training.stepper import training_step

    torch.set_num_threads(threads)
    dims = len(load_config(config).problem.resolution)  # a 3-D family's grid is grid^3
    cfg = load_config(config, ["multigrid.levels=[]", f"problem.resolution={[grid] * dims}",
                               f"model.checkpoint_activations={str(checkpointed).lower()}"])
    run = Run.from_config(cfg)
    problem, model = run.family, run.build_model().to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    params = torch.as_tensor(run.training[:batch], dtype=torch.float32, device=device)
    gpu = device.startswith("cuda")
    step = training_step(model, problem, optimizer)  # the input contiguous, as `deepfusion train` feeds it
    if gpu:  # device memory as torch's allocator counts it
        torch.cuda.synchronize(device)
        baseline = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    else:
        baseline = _status_bytes("VmRSS")
        # Reset the high-water mark to the current RSS, so the peak is this step's.
        Path("/proc/self/clear_refs").write_text("5")
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step(params)
        if gpu:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated(device) if gpu else _status_bytes("VmHWM")
    timed = times[1:] or times
    return {"grid": grid, "batch": batch, "checkpointed": checkpointed, "threads": threads,
            "baseline_mib": round(baseline / 2**20, 1), "peak_mib": round(peak / 2**20, 1),
            "samples_per_s": round(batch / min(timed), 4), "step_s": round(min(timed), 3)}


def run_case(args: argparse.Namespace, grid: int, batch: int, checkpointed: bool, huge_pages: bool = True) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--config", str(args.config), "--grid", str(grid),
           "--batch", str(batch), "--steps", str(args.steps), "--threads", str(args.threads), "--device", args.device]
    if checkpointed:
        cmd.append("--checkpointed")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONPATH=str(ROOT),
               THP_MEM_ALLOC_ENABLE="1" if huge_pages else "0")
    print(f"  grid {grid}, batch {batch}, {'checkpointed' if checkpointed else 'plain'}"
          f"{'' if huge_pages else ', 4 KiB pages'} ...", file=sys.stderr, flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    row = json.loads(out.stdout)
    print(f"    peak {row['peak_mib']:.0f} MiB (baseline {row['baseline_mib']:.0f}), "
          f"{row['samples_per_s']:.3g} samples/s", file=sys.stderr, flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "poisson_1024.toml")
    parser.add_argument("--grids", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--steps", type=int, default=3, help="training steps per case (the first is not timed)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--budget-gib", type=float, default=20.0)
    parser.add_argument("--device", default="cpu", help="cpu (resident memory), or cuda (torch's peak device memory)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--grid", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--checkpointed", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.config, args.grid, args.batch, args.checkpointed, args.steps, args.threads,
                                args.device)))
        return
    if args.device == "cpu" and not Path("/proc/self/clear_refs").exists():
        sys.exit("memory.py: needs Linux's /proc/self/clear_refs to reset the high-water mark")

    rows = []
    for grid in args.grids:
        for checkpointed in (False, True):
            one, two = run_case(args, grid, 1, checkpointed), run_case(args, grid, 2, checkpointed)
            rows.append({"grid": grid, "checkpointed": checkpointed, "threads": args.threads,
                         "per_sample_mib": round(two["peak_mib"] - one["peak_mib"], 1),
                         "peak_mib_batch1": one["peak_mib"], "peak_mib_batch2": two["peak_mib"],
                         "baseline_mib": two["baseline_mib"], "samples_per_s": two["samples_per_s"],
                         "step_s_batch2": two["step_s"]})
    top = max(args.grids)
    plain, ckpt = (next(r for r in rows if r["grid"] == top and r["checkpointed"] == c) for c in (False, True))
    per_sample = ckpt["per_sample_mib"]
    largest = 1 + int((args.budget_gib * 1024 - ckpt["peak_mib_batch1"]) // per_sample)
    four = run_case(args, top, 4, True)
    small_pages = run_case(args, top, 2, False, huge_pages=False)
    result = {
        "benchmark": "memory",
        "config": str(args.config),
        "threads": args.threads,
        "device": args.device,
        "rows": rows,
        f"memory_ratio_{top}": round(plain["per_sample_mib"] / per_sample, 2),
        f"peak_ratio_{top}_batch2": round((plain["peak_mib_batch2"] - plain["baseline_mib"])
                                          / (ckpt["peak_mib_batch2"] - ckpt["baseline_mib"]), 2),
        f"samples_per_s_ratio_{top}": round(ckpt["samples_per_s"] / plain["samples_per_s"], 3),
        # The allocator default (deepfusion.parallel.runtime.use_huge_pages) against torch's own, plain, batch 2.
        f"huge_pages_speedup_{top}": round(plain["samples_per_s"] / small_pages["samples_per_s"], 3),
        f"largest_batch_{top}": {
            "budget_gib": args.budget_gib, "batch": largest, "checkpointed": True,
            "model": "MODEL: peak(B) = peak(1) + (B - 1) * per_sample, from the checkpointed runs",
            "plain_batch": 1 + int((args.budget_gib * 1024 - plain["peak_mib_batch1"]) // plain["per_sample_mib"]),
            "fit_check": {"batch": 4, "measured_peak_mib": four["peak_mib"],
                          "model_peak_mib": round(ckpt["peak_mib_batch1"] + 3 * per_sample, 1)},
        },
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
