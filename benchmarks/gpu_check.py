"""The CUDA path end to end on one GPU, in one command of at most about 8 minutes: the CUDA tests, the
training step's throughput eager, graph-captured and compiled, and one short accuracy run; one JSON summary.

For a person with a GPU (a normal CUDA venv with the project installed, or an image with torch where
the project is on PYTHONPATH and its other packages come from wheels, no network):

    python benchmarks/gpu_check.py [--skip-tests] [--skip-accuracy] [--steps 20] > gpu.json

Sections (each one's failure is recorded in the summary, and the others still run):

* ``environment``: torch, CUDA, the GPU's name, the TF32 settings torch obeys (``fp32_precision`` from
  torch 2.9 on), the MPI mpi4py is built on and the launcher :func:`~deepfusion.parallel.runtime.find_mpiexec`
  picks for it.
* ``tests``: ``pytest -k "cuda or gpu"`` over the CUDA-facing test files (tests/engine/test_cuda.py, test_precision.py,
  test_preconditioned.py, test_coarse.py): passed, failed, skipped, and the failures' names.
* ``throughput``: samples/s of one rank's training step (forward, loss, backward, Adam) at the shipped
  configs' batch, for Poisson 128² (batch 32, single level) and 3-D Poisson 64³ (batch 8): the first stage
  on the energy and on the preconditioned loss (with the coarse correction where the config has it), and the
  second stage, each
  ``eager``, ``graph`` (the step's forward and backward captured once in a CUDA graph and replayed, as
  ``parallel.cuda_graphs``) and ``compiled`` (``torch.compile`` of the network); what cannot run is
  recorded with its one-line reason.
* ``accuracy``: ``benchmarks/accuracy.py --device cuda`` on configs/poisson.toml with a short schedule:
  error, floor, ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TEST_FILES = ["tests/engine/test_cuda.py", "tests/science/test_precision.py", "tests/methods/test_preconditioned.py", "tests/methods/test_coarse.py"]
# (name, config, batch, overrides): the step as the shipped configs train it, on one level.
CASES = [
    ("poisson128", "configs/poisson_128.toml", 32, ["multigrid.levels=[]"]),
    ("poisson3d64", "configs/poisson3d_64.toml", 8, ["multigrid.levels=[]"]),
]
# (label, overrides, stage): the first stage with either loss, and the second stage (its network, fed the
# first's V-cycle correction, on the preconditioned loss).
LOSSES = [("energy", ["train.loss=family", "model.coarse_correction=0", "model.sweeps=0", "train.second_stage_epochs=0"], 0),
          ("preconditioned", ["train.loss=preconditioned", "train.second_stage_epochs=0"], 0),
          ("second_stage", ["train.loss=preconditioned", "train.second_stage_epochs=1"], 1)]


def _why(exc: BaseException) -> str:
    """One line: the exception and where in this project it was raised."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if str(ROOT) in f.filename]
    where = f" ({Path(frames[-1].filename).relative_to(ROOT)}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}{where}"


def environment() -> dict:
    import torch

    from deepfusion.parallel.runtime import find_mpiexec, mpi4py_vendor, mpiexec_mismatch
    from diffnet.backend.precision import tf32_state

    out = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
           "tf32_default": [str(s) for s in tf32_state()], "mpi4py": mpi4py_vendor(), "mpiexec": find_mpiexec(),
           "mpiexec_mismatch": mpiexec_mismatch()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        out.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1))
    return out


def tests(timeout: int) -> dict:
    """The CUDA-facing tests under pytest, in a child process (its own CUDA context)."""
    t0 = time.perf_counter()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", "-k", "cuda or gpu",
                           *TEST_FILES], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    text = proc.stdout + proc.stderr
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", text.splitlines()[-1] if text else "")}
    return {"returncode": proc.returncode, **counts, "seconds": round(time.perf_counter() - t0, 1),
            "failures": re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.M),
            "errors": re.findall(r"^E  +(.{0,300})", text, re.M)[:60]}


def _setup(config: str, overrides: list[str], batch: int, visit: int):
    """The generator and problem the trainer runs at ``stage`` (0: the first network; 1: the second stage),
    and a batch of training instances, on the GPU."""
    import torch

    from deepfusion.configuration.config import load_config
    from deepfusion.configuration.run import Run

    cfg = load_config(ROOT / config, overrides=[*overrides, "parallel.device=cuda"])
    run = Run.from_config(cfg)
    target = run.schedule(run.build_model().to("cuda")).target(run.visits[visit])
    model, problem = target.generator, target.family
    params = torch.as_tensor(run.training[:batch], dtype=torch.float32, device="cuda")
    return cfg, problem, model.train(), params


def step_rate(config: str, overrides: list[str], batch: int, visit: int, mode: str, steps: int) -> dict:
    """Samples/s of one rank's training step in ``mode`` (eager, graph, compiled), after its warm-up."""
    import torch

    from deepfusion.parallel.comm import SerialCommunicator
    from deepfusion.parallel.gradsync import GradSync
    from deepfusion.training.stepper import make_local_step

    cfg, problem, model, params = _setup(config, overrides, batch, visit)
    t0 = time.perf_counter()
    if mode == "compiled":
        model = torch.compile(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, capturable=mode == "graph")
    sync = GradSync(model, SerialCommunicator(), "flat")
    local = make_local_step(model, problem, sync, batch, cuda_graph=mode == "graph", example=params)

    def step() -> None:
        local(params)
        optimizer.step()

    for _ in range(3):  # warm-up: cuDNN's plans, the compiler, the constants
        step()
    torch.cuda.synchronize()
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - t0) / steps
    return {"samples_per_s": round(batch / seconds, 1), "ms_per_step": round(1e3 * seconds, 2),
            "warmup_s": round(warm, 1), "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}


def throughput(steps: int, modes: list[str], deadline: float) -> list[dict]:
    import torch

    rows = []
    for mode in modes:
        for name, config, batch, base in CASES:
            for loss, extra, visit in LOSSES:
                row = {"case": name, "batch": batch, "loss": loss, "mode": mode}
                if time.perf_counter() > deadline:
                    rows.append({**row, "error": "not run: past --budget-s"})
                    continue
                try:
                    row.update(step_rate(config, [*base, *extra], batch, visit, mode, steps))
                except Exception as exc:  # recorded, and the table goes on
                    row["error"] = _why(exc)
                    traceback.print_exc()
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                print(json.dumps(row), file=sys.stderr, flush=True)
                rows.append(row)
    return rows


def accuracy(timeout: int) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "accuracy.py"), "--device", "cuda",
                           "--set", "multigrid.epochs=[4,2]", "--set", "train.second_stage_epochs=2",
                           "--set", "data.n_train=512", str(ROOT / "configs" / "poisson.toml")],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    out = {"returncode": proc.returncode, "seconds": round(time.perf_counter() - t0, 1)}
    try:
        run = json.loads(proc.stdout)["runs"][0]
        out.update({k: run[k] for k in ("mean_rel_l2", "mean_floor", "ratio_to_floor", "train_seconds", "samples_per_s")
                    if k in run})
    except (ValueError, KeyError, IndexError):
        out["tail"] = proc.stderr[-1500:]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per throughput row (default 20)")
    parser.add_argument("--modes", default="eager,graph,compiled", help="comma-separated: eager, graph, compiled")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--skip-accuracy", action="store_true")
    parser.add_argument("--budget-s", type=float, default=420,
                        help="throughput rows not started after this many seconds are recorded as not run (default 420)")
    parser.add_argument("--out", type=Path, default=None, help="also write the summary here, after each section")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device: this check needs one GPU"}))
        raise SystemExit(2)
    t0 = time.perf_counter()
    summary: dict = {"benchmark": "gpu_check", "date": time.strftime("%Y-%m-%d"), "environment": environment()}

    def section(name: str, run) -> None:
        try:
            summary[name] = run()
        except Exception as exc:
            summary[name] = {"error": _why(exc)}
        summary["seconds"] = round(time.perf_counter() - t0, 1)
        if args.out is not None:
            args.out.write_text(json.dumps(summary, indent=1))

    if not args.skip_tests:
        section("tests", lambda: tests(timeout=240))
    section("throughput", lambda: throughput(args.steps, args.modes.split(","), t0 + args.budget_s))
    if not args.skip_accuracy:
        section("accuracy", lambda: accuracy(timeout=150))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
