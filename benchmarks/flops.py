"""Achieved FLOP/s of a DiffNet training step against float32 GEMM FLOP/s, at 128^2 and 256^2.

The step's FLOPs are counted from the layer shapes: every convolution costs
2 * C_in * C_out * k^2 per output pixel in the forward pass and twice that in the
backward (the input gradient and the weight gradient; the first layer has no input
gradient). Normalisation, activations, resampling and the loss are not counted, so the
figure is a lower bound on the work done. The step (forward, loss, backward, Adam) is
timed with the input contiguous and channels-last, best of ``--repeats``; the
reference is ``torch.mm`` of two float32 ``--gemm``-square matrices at the same thread
count. Prints one JSON object; ``flops_ratio_256`` is the better layout's
achieved/GEMM ratio at 256^2.

    python benchmarks/flops.py [--config configs/burgers.toml] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def conv_flops(model, x) -> tuple[int, int]:
    """(forward, training step) convolution FLOPs of ``model`` on input ``x``, from the layer shapes."""
    import torch

    convs = []

    def hook(module, inputs, output):
        per_pixel = 2 * module.weight[0].numel() * module.weight.shape[0]  # 2 C_in/groups k^2 C_out
        convs.append(per_pixel * output.shape[0] * output.shape[-2] * output.shape[-1])

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    forward = sum(convs)
    # Backward: weight gradient for every layer, input gradient for all but the first.
    return forward, forward + 2 * forward - convs[0]


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def gemm_flops(n: int, repeats: int, device: str = "cpu") -> float:
    """Best float32 ``torch.mm`` FLOP/s for n x n matrices at the current thread count (or on the GPU)."""
    import torch

    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    c = torch.empty(n, n, device=device)
    torch.mm(a, b, out=c)
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        torch.mm(a, b, out=c)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def step_seconds(cfg, batch: int, channels_last: bool, steps: int, repeats: int, device: str = "cpu") -> tuple[float, int]:
    """Best seconds of one training step, and its counted convolution FLOPs."""
    import torch

    from deepfusion.configuration.run import Run
    from deepfusion.training.stepper import training_step

    run = Run.from_config(cfg)
    problem, model = run.family, run.build_model().to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    params = torch.as_tensor(run.training[:batch], dtype=torch.float32, device=device)
    x = problem.inputs(params)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    _, flops = conv_flops(model, x)
    train_step = training_step(model, problem, optimizer, channels_last=channels_last)

    def step() -> None:
        train_step(params)

    step()  # warm-up: oneDNN (cuDNN) picks and caches its kernels
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        _sync(device)
        best = min(best, (time.perf_counter() - t0) / steps)
    return best, flops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "burgers.toml")
    parser.add_argument("--grids", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2, help="steps per timed repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--gemm", type=int, default=2048, help="side of the GEMM reference matrices")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (float32 without TF32 on both sides)")
    args = parser.parse_args()

    from deepfusion.parallel.runtime import use_huge_pages

    use_huge_pages()  # as `deepfusion train` does, before torch allocates
    import torch

    from deepfusion.configuration.config import load_config

    torch.set_num_threads(args.threads)
    where = f"{args.threads} threads" if args.device == "cpu" else args.device
    gemm = gemm_flops(args.gemm, 2 * args.repeats + 1, args.device)
    print(f"  float32 GEMM {args.gemm}^2 on {where}: {gemm / 1e9:.1f} GFLOP/s", file=sys.stderr, flush=True)
    rows = []
    for grid in args.grids:
        cfg = load_config(args.config, ["multigrid.levels=[]", f"problem.resolution=[{grid},{grid}]"])
        for channels_last in (False, True):
            seconds, flops = step_seconds(cfg, args.batch, channels_last, args.steps, args.repeats, args.device)
            row = {"grid": grid, "batch": args.batch, "layout": "channels_last" if channels_last else "contiguous",
                   "step_s": round(seconds, 4), "samples_per_s": round(args.batch / seconds, 3),
                   "step_gflop": round(flops / 1e9, 2), "achieved_gflops": round(flops / seconds / 1e9, 2),
                   "ratio_vs_gemm": round(flops / seconds / gemm, 3)}
            print(f"  {grid}^2 {row['layout']}: {row['step_s']:.3f} s/step, {row['achieved_gflops']} GFLOP/s "
                  f"({row['ratio_vs_gemm']:.2f} of GEMM)", file=sys.stderr, flush=True)
            rows.append(row)
    top = max(args.grids)
    best = max((r for r in rows if r["grid"] == top), key=lambda r: r["ratio_vs_gemm"])
    cl = {r["grid"]: r["samples_per_s"] for r in rows if r["layout"] == "channels_last"}
    co = {r["grid"]: r["samples_per_s"] for r in rows if r["layout"] == "contiguous"}
    result = {
        "benchmark": "flops",
        "config": str(args.config),
        "threads": args.threads,
        "device": args.device,
        "gemm_gflops": round(gemm / 1e9, 2),
        "rows": rows,
        "channels_last_speedup": {str(g): round(cl[g] / co[g], 3) for g in args.grids},
        f"flops_ratio_{top}": best["ratio_vs_gemm"],
        f"flops_ratio_{top}_layout": best["layout"],
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
