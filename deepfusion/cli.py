"""``deepfusion`` command line: train, infer, compare, reference and jobs; the only module wiring in diffnet."""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
import tomllib
from pathlib import Path
from typing import Sequence

import numpy as np

from deepfusion.checkpoint import CheckpointError
from deepfusion.config import Config, ConfigError, config_from_dict, load_config, to_toml
from deepfusion.fields import FieldFileError
from deepfusion.runtime import DeviceError
from deepfusion.wiring import (build_model, build_problem, field_attrs, heldout_parameters, level_models,
                               parameter_name, sample_parameters, training_parameters)

__all__ = ["main"]

EXIT_USAGE = 2
EXIT_DIVERGED = 3


class UsageError(Exception):
    """Bad input from the user: reported as one line with exit status 2."""


USER_ERRORS = (UsageError, ConfigError, CheckpointError, FieldFileError, DeviceError)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, status 2, no usage dump
        raise UsageError(f"{self.prog}: {message}")


# --------------------------------------------------------------------------- train


def _load_run_config(args: argparse.Namespace) -> Config:
    overrides = list(args.set or [])
    if args.out is not None:
        overrides.append(f"output.dir={json.dumps(str(args.out))}")
    return load_config(args.config, overrides)


def _saved_config(ckpt, path: Path) -> Config:
    """The resolved config a checkpoint was written with."""
    try:
        return config_from_dict(tomllib.loads(ckpt.config))
    except (tomllib.TOMLDecodeError, ConfigError) as exc:
        raise UsageError(f"{path}: the checkpoint's stored config is unusable ({exc})") from None


def _find_resume_point(run_dir: Path, resume: bool, cfg: Config, warn) -> tuple[Path, object] | None:
    """The newest valid checkpoint of the run in ``run_dir`` to continue from, or None for a fresh run.

    A run directory holding checkpoints is resumed whether or not ``--resume`` is given
    (a requeued job simply runs the same command again); damaged checkpoints are
    skipped with one line each (``warn``); it must have been written with the same
    config, so a run is never mixed with another.
    """
    from deepfusion.checkpoint import checkpoint_files, latest_valid_checkpoint

    directory = run_dir / "checkpoints"
    if not checkpoint_files(directory):
        if resume:
            raise UsageError(f"--resume: no checkpoint in {directory}")
        return None
    found = latest_valid_checkpoint(directory, warn)
    if found is None:
        raise UsageError(f"{directory}: no valid checkpoint left to resume from (all refused above)")
    path, ckpt = found
    if _saved_config(ckpt, path).replace(output=cfg.output) != cfg:  # the run may have been moved
        raise UsageError(
            f"{run_dir}: holds a run with a different config ({path}); give the same config to continue it, "
            "or choose another --out"
        )
    return path, ckpt


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop metrics logged after ``step`` (by a run that went on past its last checkpoint)."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    path.write_text("".join(line + "\n" for line in kept))


def _warn(line: str) -> None:
    """A warning on standard error, one line."""
    print(f"deepfusion: warning: {line}", file=sys.stderr, flush=True)


def _agree(comm, fn):
    """Run ``fn`` on every rank; if it fails with a user error on any rank, fail on all.

    Every rank then raises the same :class:`UsageError` (the lowest failing rank's
    message), so the job ends with status 2 everywhere and no rank is left waiting.
    """
    try:
        result, error = fn(), None
    except USER_ERRORS as exc:
        result, error = None, str(exc)
    errors = [e for e in comm.allgather(error) if e]
    if errors:
        raise UsageError(errors[0])
    return result


def _problem_summary(cfg: Config) -> str:
    p = cfg.problem
    if p.name == "burgers":
        scheme = f" (order {p.scheme_order}, {p.flux} flux)" if p.residual == "conservative" else ""
        return f"nu={p.viscosity} residual={p.residual}{scheme}"
    nu = f"nu={p.viscosity}" if p.diffusivity == "constant" else f"nu=KL(m={p.kl_terms}, eta={p.kl_eta}, a in {list(p.coeff_range)})"
    return nu + (f" kappa={p.kappa} f={p.source}" if p.name == "reaction_diffusion" else "")


def _rank_report(comm, threads: int) -> str:
    """One line per rank (host, node-local rank, threads, cores it may use), gathered on all ranks."""
    import socket

    from deepfusion.runtime import available_cores

    mine = (
        f"  rank {comm.rank}/{comm.size} on {socket.gethostname()} (local {comm.local_rank}/{comm.local_size}): "
        f"{threads} threads, {available_cores()} cores available"
    )
    return "\n".join(comm.allgather(mine))


def cmd_train(args: argparse.Namespace, comm) -> int:
    cfg = _agree(comm, lambda: _load_run_config(args))
    from deepfusion.runtime import apply_threads, resolve_threads

    # Threads are fixed before torch does any work.
    threads = resolve_threads(cfg.parallel.threads_per_rank, comm.local_size)
    apply_threads(threads)

    import torch

    from deepfusion.gradsync import ParameterDrift
    from deepfusion.partition import local_batch_size
    from deepfusion.trainer import TrainingDiverged, train
    from diffnet.networks import parameter_count

    from deepfusion.schedule import build_schedule

    stages = build_schedule(cfg)
    batches = sorted({s.batch_size for s in stages})
    key = "multigrid.batch_size" if cfg.multigrid.batch_size else "train.batch_size"
    if local_batch_size(batches[0], comm.size) == 0:  # the same on every rank, and checked before anything is written
        raise UsageError(f"{key}: {batches[0]} is smaller than the {comm.size} ranks; each rank needs a sample")
    leader = comm.rank == 0
    say = (lambda line: print(line, flush=True)) if leader else (lambda line: None)
    warn = _warn if leader else say
    run_dir = Path(cfg.output.dir)
    # Every rank reads the same files and so reaches the same choice; _agree makes a
    # refusal on any rank a refusal on all.
    found = _agree(comm, lambda: _find_resume_point(run_dir, args.resume, cfg, warn))
    resume_from, ckpt = found if found is not None else (None, None)
    torch.manual_seed(cfg.data.seed)
    problem = build_problem(cfg)
    from deepfusion.runtime import configure_cuda, select_device

    device = _agree(comm, lambda: select_device(cfg.parallel.device, comm.local_rank, comm.local_size))
    if device != "cpu":
        torch.cuda.set_device(device)
        configure_cuda(cfg.parallel.tf32)
        if cfg.parallel.gpu_reduce == "mpi" and comm.size > 1:
            from deepfusion.reducers import cuda_aware_mpi

            if not cuda_aware_mpi():  # the same library, so the same answer, on every rank
                raise UsageError("parallel.gpu_reduce = 'mpi' needs a CUDA-aware MPI, and this one says it is not "
                                 "(MPIX_Query_cuda_support); use 'auto', 'nccl' or 'staged'")
    model = build_model(cfg, problem).to(device)
    params = training_parameters(cfg)
    start_step = ckpt.step if ckpt is not None else 0
    if ckpt is not None:
        torch.set_rng_state(torch.from_numpy(ckpt.torch_rng))
    if leader:
        run_dir.mkdir(parents=True, exist_ok=True)
        # A fresh run in a directory whose earlier run died before its first checkpoint
        # starts the metrics over; a resumed one drops lines past its checkpoint.
        _truncate_metrics(run_dir / "metrics.jsonl", start_step)
        (run_dir / "config.toml").write_text(to_toml(cfg), encoding="utf-8")
    test = heldout_parameters(cfg)
    rows_t, rows_p = test.reshape(len(test), -1), params.reshape(len(params), -1)
    overlap = np.isclose(rows_t[:, None], rows_p[None, :], rtol=0, atol=1e-9).all(axis=2).any(axis=1)
    if overlap.any() and leader:
        print(f"warning: held-out instances {np.flatnonzero(overlap).tolist()} are also in the training set", file=sys.stderr)
    for b in batches:
        if b % comm.size and leader:
            b_loc = local_batch_size(b, comm.size)
            print(
                f"warning: {key} {b} is not divisible by {comm.size} ranks; each step uses "
                f"{b_loc * comm.size} samples ({b_loc} per rank)",
                file=sys.stderr,
            )
    report = _rank_report(comm, threads)
    say(
        f"deepfusion: training {cfg.problem.name} {tuple(cfg.problem.resolution)} {_problem_summary(cfg)} "
        f"| {cfg.model.name} {list(cfg.model.channels)} "
        f"({parameter_count(model) / 1e6:.2f} M parameters) | {len(params)} samples, "
        + (f"batch {cfg.train.batch_size}, {cfg.train.epochs} epochs" if len(stages) == 1 else
           f"{len(stages)} stages, {sum(s.epochs for s in stages)} epochs")
        + f" | ranks {comm.size} x {threads} threads"
        + (f" | resuming from {resume_from} (step {start_step})" if resume_from else "")
    )
    if len(stages) > 1:
        mg = cfg.multigrid
        how = f"deepened by {mg.top_channels}-channel levels" if mg.transfer == "deepen" else "the same network carried"
        say(f"multigrid: {mg.cycle} cycle over {len(mg.levels)} levels, {how}; "
            + " -> ".join(f"{s.grid[0]}x{s.grid[1]} ({s.epochs} epochs, lr {s.lr:g}, batch {s.batch_size})"
                          for s in stages))
    if ckpt is not None:
        how = "--resume" if args.resume else "found in the run directory, resuming automatically"
        ranks = "" if ckpt.ranks == comm.size else (
            f"; written by {ckpt.ranks} ranks, continuing on {comm.size} (the global batches do not depend on the ranks)"
        )
        say(f"checkpoint {resume_from} ({how}){ranks}")
    on = "CPU" if device == "cpu" else f"{device} ({torch.cuda.get_device_name(device)})"
    sums = "flat (CUDA graph)" if cfg.parallel.cuda_graphs else cfg.parallel.gradsync
    say(f"MPI: {comm.library}; gradients: {sums}; device: {on}\n{report}")
    from deepfusion.signals import stop_on_signals

    try:
        with stop_on_signals() as stop:
            result = train(
                model, problem, params, cfg.train, seed=cfg.data.seed, comm=comm, parallel=cfg.parallel,
                run_dir=run_dir, config_text=to_toml(cfg), threads=threads, start_step=start_step, resume=ckpt,
                stop=stop, log=say, stages=stages, level=level_models(cfg, model),
            )
    except (TrainingDiverged, ParameterDrift) as exc:
        if leader:
            print(f"deepfusion: error: {exc}", file=sys.stderr)
        return EXIT_DIVERGED
    if result.stopped:
        command = ["deepfusion", "train", str(args.config), *(a for s in args.set or [] for a in ("--set", s)),
                   "--out", str(run_dir), "--resume"]
        say(
            f"stopped by {stop.signal or 'a signal to another rank'} at step {start_step + result.steps}; "
            f"checkpoint {result.checkpoint}\nresume with (under the same launcher): {shlex.join(command)}"
        )
        return 0
    say(
        f"trained {result.steps} steps in {result.seconds:.1f} s "
        f"({result.samples_per_s:.1f} samples/s); checkpoint {result.checkpoint}"
    )
    if leader:
        from deepfusion.evaluate import evaluate_run

        evaluate_run(cfg, problem, model, run_dir, result.seconds)
    return 0


# --------------------------------------------------------------------------- infer / reference


def _positive_finite(name: str, values: Sequence[float]) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    bad = [v for v in arr if not (math.isfinite(v) and v > 0)]
    if bad:
        raise UsageError(f"{name}: values must be finite and > 0, got {bad[0]}")
    return arr


def _load_array(path: Path, what: str, ndim: tuple[int, ...], max_elements: int = 2**28) -> np.ndarray:
    """A float64 array from a ``.npy`` file (never unpickled), with finite values and an allowed rank."""
    try:
        with open(path, "rb") as fh:
            fmt = np.lib.format
            version = fmt.read_magic(fh)
            read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, _, dtype = read(fh)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read {what} ({exc.strerror})") from None
    except ValueError as exc:
        raise UsageError(f"{path}: not a .npy file ({exc})") from None
    if dtype.hasobject or dtype.kind not in "fiu":
        raise UsageError(f"{path}: {what} must be a numeric array, got dtype {dtype}")
    if len(shape) not in ndim:
        raise UsageError(f"{path}: {what} must have {' or '.join(map(str, ndim))} dimensions, got shape {shape}")
    if int(np.prod(shape)) > max_elements or 0 in shape:
        raise UsageError(f"{path}: {what} has shape {shape}; expected a non-empty array of at most {max_elements} values")
    arr = np.load(path, allow_pickle=False).astype(np.float64)
    if not np.isfinite(arr).all():
        raise UsageError(f"{path}: {what} contains NaN or Inf")
    return arr


def instance_parameters(cfg: Config, args: argparse.Namespace) -> np.ndarray:
    """The instances to solve, from ``--c`` (Burgers) or ``--coeffs`` / ``--nu`` (Poisson, reaction-diffusion)."""
    p = cfg.problem
    if p.name == "burgers":
        if args.coeffs or args.nu:
            raise UsageError("--coeffs/--nu: this run is Burgers; give --c")
        if not args.c:
            raise UsageError("give at least one --c")
        return _positive_finite("--c", args.c)
    if args.c:
        raise UsageError(f"--c: this run is {p.name}; give --coeffs A.npy or --nu NU.npy")
    if bool(args.coeffs) == bool(args.nu):
        raise UsageError("give exactly one of --coeffs A.npy (rows of KL coefficients) or --nu NU.npy (fields)")
    if args.coeffs:
        a = _load_array(args.coeffs, "coefficients", (1, 2))
        a = a.reshape(-1, a.shape[-1]) if a.ndim == 2 else a[None]
        if a.shape[1] != p.kl_terms:
            raise UsageError(f"{args.coeffs}: coefficient rows must have {p.kl_terms} entries (problem.kl_terms), got {a.shape[1]}")
        lo, hi = p.coeff_range
        if ((a < lo) | (a > hi)).any():
            print(f"warning: {args.coeffs}: coefficients outside the training range [{lo}, {hi}]", file=sys.stderr)
        return a
    nu = _load_array(args.nu, "diffusivity", (2, 3))
    nu = nu if nu.ndim == 3 else nu[None]
    if nu.shape[1:] != tuple(p.resolution):
        raise UsageError(f"{args.nu}: fields must be {tuple(p.resolution)} (the run's resolution), got {nu.shape[1:]}")
    if not (nu > 0).all():
        raise UsageError(f"{args.nu}: diffusivity must be > 0 everywhere (min {nu.min():g})")
    return nu


def _run_config(run_dir: Path) -> Config:
    if not (run_dir / "config.toml").is_file():
        raise UsageError(f"{run_dir}: not a run directory (no config.toml)")
    return load_config(run_dir / "config.toml")


def _trained_model(run_dir: Path, cfg: Config, checkpoint: str | None):
    """The run's generator with the weights of ``checkpoint`` (default: the newest valid one), and that path."""
    from deepfusion.checkpoint import latest_valid_checkpoint, load_checkpoint

    if checkpoint:
        path = Path(checkpoint)
        ckpt = load_checkpoint(path)
    else:
        found = latest_valid_checkpoint(run_dir / "checkpoints", _warn)
        if found is None:
            raise UsageError(f"{run_dir}: no valid checkpoint in {run_dir / 'checkpoints'}")
        path, ckpt = found
    saved = _saved_config(ckpt, path)
    if (saved.problem, saved.model) != (cfg.problem, cfg.model):
        raise UsageError(
            f"{path}: checkpoint of {saved.problem.name} {list(saved.problem.resolution)} {saved.model.name} "
            f"{list(saved.model.channels)} does not belong to this run ({cfg.problem.name} "
            f"{list(cfg.problem.resolution)} {cfg.model.name} {list(cfg.model.channels)}, or other problem settings)"
        )
    model = build_model(cfg, build_problem(cfg))
    ckpt.restore(model)
    return model, path


def cmd_infer(args: argparse.Namespace, comm) -> int:
    run_dir = Path(args.run_dir)
    cfg = _run_config(run_dir)
    _check_output_file(args.out)
    params = instance_parameters(cfg, args)
    model, path = _trained_model(run_dir, cfg, args.checkpoint)
    from deepfusion.evaluate import predict
    from deepfusion.fields import write_fields

    problem = build_problem(cfg)
    t0 = time.perf_counter()
    u = predict(model, problem, params)
    seconds = time.perf_counter() - t0
    attrs = field_attrs(cfg, "diffnet") | {"checkpoint": str(path)}
    name = "nu" if params.ndim == 3 else parameter_name(cfg)
    out = write_fields(args.out, u, problem.coordinates(), {name: params}, attrs)
    print(f"wrote {out} and {out.with_suffix('.xdmf')}: {len(params)} fields {u.shape[1:]} in {seconds:.3f} s")
    return 0


def _check_output_file(path: Path, suffixes: tuple[str, ...] = (".h5", ".hdf5"), what: str = "field files are HDF5") -> None:
    """``--out`` of infer/reference/compare: a file name with one of ``suffixes``, in a place that is not a directory."""
    if path.suffix not in suffixes:
        raise UsageError(f"--out: {path}: {what}; give a name ending in {suffixes[0]}")
    if path.is_dir():
        raise UsageError(f"--out: {path} is a directory")
    if any(parent.exists() and not parent.is_dir() for parent in path.parents):
        raise UsageError(f"--out: {path}: a parent is not a directory")


def _check_resolution(resolution: Sequence[int]) -> None:
    if any(n < 3 or n > 16385 for n in resolution):
        raise UsageError(f"--resolution: each count must be in 3..16385, got {list(resolution)}")


def cmd_reference(args: argparse.Namespace, comm) -> int:
    from deepfusion.fields import write_fields
    from diffnet.problems.burgers import BurgersProblem

    _check_output_file(args.out)
    if not args.c:
        raise UsageError("reference burgers: give at least one --c")
    c = _positive_finite("--c", args.c)
    _check_resolution(args.resolution)
    if not (math.isfinite(args.viscosity) and args.viscosity >= 0):
        raise UsageError(f"--viscosity: must be finite and >= 0, got {args.viscosity}")
    if not (math.isfinite(args.t_final) and args.t_final > 0):
        raise UsageError(f"--t-final: must be finite and > 0, got {args.t_final}")
    problem = BurgersProblem(tuple(args.resolution), viscosity=args.viscosity, t_final=args.t_final)
    t0 = time.perf_counter()
    u = problem.reference(c, progress=lambda k, n: print(f"  solved {k}/{n}", flush=True))
    seconds = time.perf_counter() - t0
    attrs = {"problem": "burgers", "source": "godunov", "viscosity": args.viscosity, "t_final": args.t_final}
    out = write_fields(args.out, u, problem.coordinates(), {"c": c}, attrs)
    print(f"wrote {out} and {out.with_suffix('.xdmf')}: {len(c)} Godunov solutions in {seconds:.2f} s")
    return 0


def cmd_reference_elliptic(args: argparse.Namespace, comm) -> int:
    """``reference poisson`` / ``reference reaction_diffusion``: Q1 FEM solves of given instances."""
    from deepfusion.fields import write_fields

    _check_output_file(args.out)
    resolution = args.resolution * 2 if len(args.resolution) == 1 else args.resolution
    if len(resolution) != 2:
        raise UsageError(f"--resolution: give N or NY NX, got {args.resolution}")
    _check_resolution(resolution)
    sets = [f"problem.name={args.problem}", f"problem.resolution={list(resolution)}",
            f"problem.kl_terms={args.kl_terms}", f"problem.kl_eta={args.kl_eta}"]
    if args.problem == "reaction_diffusion":
        sets += [f"problem.kappa={args.kappa}", f"problem.source={args.source}"]
    cfg = load_config(None, sets + ["data.sampling=random", "data.n_train=1", "train.batch_size=1"])
    params = instance_parameters(cfg, argparse.Namespace(c=None, coeffs=args.coeffs, nu=args.nu))
    problem = build_problem(cfg)
    t0 = time.perf_counter()
    u = problem.reference(params, progress=lambda k, n: print(f"  solved {k}/{n}", flush=True), method=args.method)
    seconds = time.perf_counter() - t0
    name = "nu" if params.ndim == 3 else "a"
    attrs = field_attrs(cfg, "fem") | {"solver": args.method}
    out = write_fields(args.out, u, problem.coordinates(), {name: params}, attrs)
    print(f"wrote {out} and {out.with_suffix('.xdmf')}: {len(params)} Q1 FEM solutions ({args.method}) in {seconds:.2f} s")
    return 0


# --------------------------------------------------------------------------- compare


def _compare_instances(cfg: Config, samples: int) -> np.ndarray:
    """The first ``samples`` held-out instances of the run (never training ones)."""
    if cfg.problem.name == "burgers" and cfg.problem.test_c:
        if samples > len(cfg.problem.test_c):
            n = len(cfg.problem.test_c)
            raise UsageError(f"--samples: this run holds out {n} value{'s' if n != 1 else ''} of c (problem.test_c); "
                             f"got {samples}")
        return np.asarray(cfg.problem.test_c[:samples], dtype=np.float64)
    return sample_parameters(cfg, samples, "random", cfg.data.seed + 7919)  # the held-out stream, see heldout_parameters


def cmd_compare(args: argparse.Namespace, comm) -> int:
    """Classical solve (Q1 FEM + AMG, or Godunov) against DiffNet inference, per resolution."""
    import dataclasses

    run_dir = Path(args.run_dir)
    cfg = _run_config(run_dir)
    _check_output_file(args.out, (".json",), "the report is JSON")
    if not 1 <= args.samples <= 1000:
        raise UsageError(f"--samples: must be in 1..1000, got {args.samples}")
    if not 1 <= args.threads <= 4096:
        raise UsageError(f"--threads: must be in 1..4096, got {args.threads}")
    if not 1 <= args.batch <= 1024:
        raise UsageError(f"--batch: must be in 1..1024, got {args.batch}")
    if not (math.isfinite(args.tol) and 0 < args.tol <= 1e-2):
        raise UsageError(f"--tol: must be in (0, 1e-2], got {args.tol}")
    trained = tuple(cfg.problem.resolution)
    grids = [(n, n) for n in args.resolution] if args.resolution else [trained]
    for grid in grids:
        _check_resolution(grid)
    params = _compare_instances(cfg, args.samples)
    from deepfusion.runtime import apply_threads

    apply_threads(args.threads)  # before torch starts its thread pool
    from deepfusion.compare import compare_row, markdown_table, time_inference, time_reference
    from deepfusion.evaluate import against_floor, predict

    t0 = time.perf_counter()
    model, path = _trained_model(run_dir, cfg, args.checkpoint)
    load_s = time.perf_counter() - t0
    print(f"deepfusion compare: {run_dir} ({cfg.problem.name}, trained at {list(trained)}), checkpoint {path} "
          f"loaded in {load_s:.3f} s; {len(params)} held-out instances; "
          f"{args.threads} thread{'s' if args.threads > 1 else ''} for both solvers",
          flush=True)
    rows = []
    for grid in grids:
        problem = build_problem(cfg.replace(problem=dataclasses.replace(cfg.problem, resolution=grid)))
        print(f"  {grid[0]}x{grid[1]}:", flush=True)
        ref, reference = time_reference(problem, params, args.tol, direct=not args.no_direct)
        pred, inference = time_inference(lambda p, b: predict(model, problem, p, b), params, args.batch)
        # The error needs a model trained at this grid; elsewhere only the timings mean something.
        acc = against_floor(problem, params, pred, ref if cfg.problem.name == "burgers" else None) \
            if grid == trained else None
        rows.append(compare_row(grid, args.threads, reference, inference, acc))
        row = rows[-1]
        print(f"    speed-up {row['speedup_single']:.1f}x (one instance), {row['speedup_batched']:.1f}x (batched)"
              + (f"; rel. L2 vs {acc.truth_name} mean {row['rel_l2']:.4f}, max {row['rel_l2_max']:.4f}, floor "
                 f"{row['floor']:.4f}, ratio {row['ratio_to_floor']:.2f}" if acc is not None
                 else "; no model trained at this grid, error not measured"), flush=True)
    report = {
        "run_dir": str(run_dir),
        "checkpoint": str(path),
        "problem": cfg.problem.name,
        "trained_resolution": list(trained),
        "model": {"name": cfg.model.name, "channels": list(cfg.model.channels), "dtype": cfg.train.dtype},
        "samples": len(params),
        "instances": params.tolist(),
        "threads": args.threads,
        "amg_tol": args.tol,
        "model_load_s": load_s,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    table = args.out.with_suffix(".md")
    table.write_text(markdown_table(rows))
    from deepfusion.plots import plot_compare

    figure = plot_compare(rows, args.out.with_suffix(".png"))
    print(f"\n{markdown_table(rows)}\nwrote {args.out}, {table}, {figure}")
    return 0


# --------------------------------------------------------------------------- jobs


def cmd_jobs(args: argparse.Namespace, comm) -> int:
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
        raise UsageError(str(exc)) from None
    sys.stdout.write(script)
    return 0


# --------------------------------------------------------------------------- parser


def make_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="deepfusion", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("train", help="train a DiffNet generator from a TOML config")
    p.add_argument("config", type=Path, help="TOML config (see configs/)")
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a config key")
    p.add_argument("--out", type=Path, help="run directory (overrides output.dir)")
    p.add_argument("--resume", action="store_true", help="continue from the run directory's latest checkpoint")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("infer", help="solve new instances with a trained run")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--out", type=Path, required=True, help="HDF5 field file to write")
    p.add_argument("--c", type=float, action="append", help="Burgers IC parameter (repeatable)")
    p.add_argument("--coeffs", type=Path, help="Poisson/reaction-diffusion: .npy of KL coefficient rows (S, m)")
    p.add_argument("--nu", type=Path, help="Poisson/reaction-diffusion: .npy of diffusivity fields (S, N_y, N_x)")
    p.add_argument("--checkpoint", help="a specific checkpoint file (default: the latest)")
    p.set_defaults(func=cmd_infer)

    p = sub.add_parser("compare", help="time a classical solve (FEM + AMG, or Godunov) against DiffNet inference")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--out", type=Path, required=True, help="JSON report (a .md table and .png plot are written beside it)")
    p.add_argument("--resolution", type=int, nargs="+", metavar="N", help="N x N grids (default: the run's)")
    p.add_argument("--samples", type=int, default=4, help="held-out instances per grid (default 4)")
    p.add_argument("--threads", type=int, default=1, help="threads for both solvers (default 1)")
    p.add_argument("--batch", type=int, default=8, help="instances per forward pass in the batched timing")
    p.add_argument("--tol", type=float, default=1e-8, help="relative residual of the AMG-CG solve (default 1e-8)")
    p.add_argument("--no-direct", action="store_true", help="skip the sparse direct (LU) solve")
    p.add_argument("--checkpoint", help="a specific checkpoint file (default: the latest)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("jobs", help="print a job script for a cluster (stampede, azure, aws, local)")
    p.add_argument("cluster", choices=["stampede", "azure", "aws", "local"])
    p.add_argument("config", type=Path, help="TOML config the job trains (its output.dir is the run directory)")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--ranks-per-node", type=int, required=True)
    p.add_argument("--threads", type=int, required=True, help="threads per rank")
    p.add_argument("--time", default="02:00:00", help="wall-clock limit HH:MM:SS")
    p.add_argument("--partition", help="queue (default: the cluster's first node type)")
    p.add_argument("--account", help="allocation to charge")
    p.add_argument("--node-type", help="node type of --partition when the site names its queues itself")
    p.add_argument("--cores-per-node", type=int, help="cores of one node, when not in the shipped table")
    p.set_defaults(func=cmd_jobs)

    p = sub.add_parser("reference", help="classical reference solutions")
    rsub = p.add_subparsers(dest="problem", required=True, parser_class=_Parser)
    r = rsub.add_parser("burgers", help="converged Godunov finite-volume solutions on the nodal grid")
    r.add_argument("--c", type=float, action="append", help="IC parameter (repeatable)")
    r.add_argument("--resolution", type=int, nargs=2, default=[64, 64], metavar=("NT", "NX"))
    r.add_argument("--viscosity", type=float, default=0.01)
    r.add_argument("--t-final", type=float, default=1.0 / 3.0)
    r.add_argument("--out", type=Path, required=True)
    r.set_defaults(func=cmd_reference)
    for name, title in (("poisson", "-div(nu grad u) = 0"), ("reaction_diffusion", "-div(nu grad u) + kappa^2 u = f")):
        r = rsub.add_parser(name, help=f"Q1 finite-element solutions of {title} on the nodal grid")
        r.add_argument("--coeffs", type=Path, help=".npy of KL coefficient rows (S, m)")
        r.add_argument("--nu", type=Path, help=".npy of nodal diffusivity fields (S, N_y, N_x)")
        r.add_argument("--resolution", type=int, nargs="+", default=[64], metavar="N", help="N, or N_Y N_X")
        r.add_argument("--kl-terms", type=int, default=6)
        r.add_argument("--kl-eta", type=float, default=0.5)
        if name == "reaction_diffusion":
            r.add_argument("--kappa", type=float, default=1.0)
            r.add_argument("--source", type=float, default=1.0)
        r.add_argument("--method", choices=["amg", "direct"], default="amg", help="AMG-preconditioned CG or sparse LU")
        r.add_argument("--out", type=Path, required=True)
        r.set_defaults(func=cmd_reference_elliptic)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status.

    Under mpiexec/srun every rank runs this. ``train`` works on all ranks; the other
    commands run on rank 0 alone. User errors are agreed on collectively and reported
    once (status 2); any other exception on one rank aborts the whole job.
    """
    from deepfusion.comm import abort_on_error, world
    from deepfusion.runtime import use_huge_pages

    use_huge_pages()
    comm = world()
    with abort_on_error(comm):
        try:
            args = make_parser().parse_args(argv)
            if args.command != "train" and comm.rank != 0:
                return 0
            return args.func(args, comm)
        except USER_ERRORS as exc:
            if comm.rank == 0:
                print(f"deepfusion: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
