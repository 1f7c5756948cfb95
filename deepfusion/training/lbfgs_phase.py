"""The L-BFGS phase of a training run: iterations on the global objective in their own precision,
checkpoints that resume them exactly, and the diagnostics of every iteration."""

from __future__ import annotations

import copy
import dataclasses
import time


import numpy as np
import torch

from deepfusion.configuration.schema import TrainConfig
from deepfusion.files.checkpoint import Checkpoint
from deepfusion.parallel.gradsync import check_parameters
from deepfusion.training.context import TrainingContext
from deepfusion.training.lbfgs import GlobalObjective, MultiBatchLBFGS, multibatch_indices
from deepfusion.configuration.schedule import adam_steps as first_order_steps
from deepfusion.training.stepper import loss_sum

__all__ = ["build_lbfgs", "lbfgs_phase"]


def build_lbfgs(model: torch.nn.Module, cfg: TrainConfig, objective: GlobalObjective):
    """The L-BFGS optimiser of ``train.lbfgs_mode``: torch's (full batch) or :class:`MultiBatchLBFGS`."""
    if cfg.lbfgs_mode == "full":
        return torch.optim.LBFGS(
            list(model.parameters()),
            lr=cfg.lbfgs_lr,
            max_iter=1,  # one iteration per training step; the state carries over
            max_eval=cfg.lbfgs_max_eval,
            tolerance_grad=cfg.lbfgs_tolerance_grad,
            tolerance_change=cfg.lbfgs_tolerance_change,
            history_size=cfg.lbfgs_history,
            line_search_fn="strong_wolfe",
        )
    return MultiBatchLBFGS(objective, history=cfg.lbfgs_history, lr=cfg.lbfgs_lr, overlap=cfg.lbfgs_overlap)


class _PhaseState:
    """What an L-BFGS checkpoint stores besides the optimiser: the phase's own parameters in
    ``train.lbfgs_dtype`` (the checkpoint's model holds them cast to ``train.dtype``, as
    inference expects) and the diagnostic counters, so that a resume is exact."""

    KEYS = ("master", "line_search_failures", "skipped_pairs_seen")

    def __init__(self, opt, objective: GlobalObjective, diagnostics: dict[str, int]):
        self.opt, self.objective, self.diagnostics = opt, objective, diagnostics

    def state_dict(self) -> dict[str, object]:
        sd = self.opt.state_dict()
        entry = {**sd["state"].get(0, {}), "master": self.objective.flat(),
                 "line_search_failures": self.diagnostics["line_search_failures"],
                 "skipped_pairs_seen": self.diagnostics["skipped_pairs"]}
        return {"state": {**sd["state"], 0: entry}, "param_groups": sd["param_groups"]}

    def restore(self, resume: Checkpoint) -> None:
        """Load the optimiser's state, the phase's parameters (when stored) and the counters."""
        entry = resume.optimizer_state.get(0, {})
        own = {k: v for k, v in entry.items() if k not in self.KEYS}
        dataclasses.replace(resume, optimizer_state={**resume.optimizer_state, 0: own}).restore(None, self.opt)
        if "master" in entry:  # absent in checkpoints written before train.lbfgs_dtype
            self.objective.assign(torch.from_numpy(np.array(entry["master"])))
        self.diagnostics["line_search_failures"] = int(entry.get("line_search_failures", 0))
        self.diagnostics["skipped_pairs"] = int(entry.get("skipped_pairs_seen", 0))


class _FullBatchIteration:
    """One iteration of torch's L-BFGS on the fixed objective ``indices``, counting its failures and
    skipped curvature pairs in ``diagnostics``; returns the loss and largest gradient entry at the
    iteration's start and the accepted step length."""

    def __init__(self, opt, objective: GlobalObjective, indices: np.ndarray, dtype: torch.dtype,
                 diagnostics: dict[str, int]):
        self.opt, self.objective, self.indices, self.dtype = opt, objective, indices, dtype
        self.diagnostics = diagnostics
        self.previous: float | None = None  # the loss at the previous iteration's start, if it moved

    def __call__(self) -> tuple[float, float, float]:
        starts: list[torch.Tensor] = []

        def closure() -> torch.Tensor:
            loss, g = self.objective(self.indices)
            if not starts:
                starts.append(g)  # the gradient at the iteration's start point
            return torch.tensor(loss, dtype=self.dtype)

        state = self.opt.state[self.objective.weights[0]]
        newest, iterations = (state.get("old_dirs") or [None])[-1], state.get("n_iter", 0)
        loss = float(self.opt.step(closure))
        state = self.opt.state[self.objective.weights[0]]
        # torch forms the previous iteration's curvature pair at the start of this one and
        # drops it when y's <= 1e-10: then the newest pair is unchanged.
        if state.get("n_iter", 0) > max(1, iterations) and (state.get("old_dirs") or [None])[-1] is newest:
            self.diagnostics["skipped_pairs"] += 1
        # torch returns the loss at the start of the iteration: the previous one failed when
        # it did not lower the objective.
        if self.previous is not None and loss >= self.previous:
            self.diagnostics["line_search_failures"] += 1
        moved = state.get("n_iter", 0) > iterations  # False: converged at the start point
        self.previous = loss if moved else None
        return loss, float(starts[0].abs().max()), float(state.get("t", 0.0)) if moved else 0.0


def lbfgs_phase(model, family, all_instances, cfg: TrainConfig, ctx: TrainingContext, *, step: int,
                resume: Checkpoint | None) -> tuple[int, float, bool]:
    """L-BFGS iterations ``step`` .. the run's last on the global objective, in ``train.lbfgs_dtype``
    (the run's recorder, ``ctx.recorder``, knows the schedule: Adam's steps come first)."""
    comm, rec, stop = ctx.comm, ctx.recorder, ctx.stop
    total, adam_steps = rec.total, first_order_steps(cfg, rec.visits)
    n = all_instances.shape[0]
    precision = cfg.dtype if cfg.lbfgs_dtype == "train" else cfg.lbfgs_dtype
    dtype = getattr(torch, precision)
    # The phase works on its own copy when its precision differs from the run's (float64
    # for a float32 run: Xu et al. 2025 report float32 line searches stopping early);
    # `model` gets the values cast back before every checkpoint and at the end.
    work = model if next(model.parameters()).dtype == dtype else copy.deepcopy(model).to(dtype)
    all_instances = all_instances.to(dtype)

    def local_sum(idx: np.ndarray) -> torch.Tensor:
        return loss_sum(work, family, all_instances[idx])[0]

    chunk = cfg.lbfgs_chunk or cfg.batch_size
    objective = GlobalObjective(list(work.parameters()), local_sum, comm, chunk)
    opt = build_lbfgs(work, cfg, objective)
    diagnostics = {"line_search_failures": 0, "skipped_pairs": 0}
    state = _PhaseState(opt, objective, diagnostics)
    if resume is not None:
        state.restore(resume)

    def save(epoch: int) -> None:
        if work is not model:
            model.load_state_dict(work.state_dict())  # cast to train.dtype
        rec.save(state, epoch=epoch, step=step, config=ctx.config_text, ranks=comm.size, kind="lbfgs",
                 visit=len(rec.visits) - 1)

    # One fixed order for the whole phase (seeded apart from Adam's epochs): the full
    # batch is its first lbfgs_batch samples, multi-batch sweeps it with overlaps.
    order = np.random.default_rng([ctx.seed, 104729]).permutation(n)
    full = cfg.lbfgs_mode == "full"
    batch_size = cfg.lbfgs_batch or (n if full else cfg.batch_size)
    fixed = np.sort(order[:batch_size])
    epoch_of = rec.visits[-1].epochs if adam_steps else 0
    loss_value = float("nan")
    last_loss = None
    window = {"iterations": 0, "evaluations": objective.evaluations}
    iterate = _FullBatchIteration(opt, objective, fixed, dtype, diagnostics) if full else None
    try:
        while step < total:
            comm.mark(f"step {step + 1} (L-BFGS)")
            t0 = time.perf_counter()
            samples0 = objective.samples
            k = step - adam_steps
            if full:
                loss_value, grad_norm, length = iterate()
            else:
                stats = opt.step(multibatch_indices(order, k, batch_size, cfg.lbfgs_overlap))
                loss_value, grad_norm, length = stats["loss"], stats["grad_norm"], stats["step_length"]
                diagnostics["line_search_failures"] += int(length == 0.0)
                diagnostics["skipped_pairs"] = opt.skipped_pairs  # its own count, kept in its state
            rec.check_finite(loss_value, epoch_of, step)
            step += 1
            window["iterations"] += 1
            if comm.size > 1:
                check_parameters(work, comm, step)
            seconds = time.perf_counter() - t0
            # Converged when the gradient or the loss no longer moves (full batch only: a
            # multi-batch loss changes with the batch).
            reason = None
            if full and grad_norm <= cfg.lbfgs_tolerance_grad:
                reason = "gradient below train.lbfgs_tolerance_grad"
            elif full and last_loss is not None and abs(loss_value - last_loss) < cfg.lbfgs_tolerance_change:
                reason = "loss change below train.lbfgs_tolerance_change"
            last_loss = loss_value
            stopping = stop.agreed(comm)
            if reason is None and step == total:
                reason = "train.lbfgs_iterations done"
            elif reason is None and stopping:
                reason = "stop requested"
            if (step - adam_steps) % cfg.log_every == 0 or reason or k == 0:
                rate = (objective.samples - samples0) / seconds
                per_iteration = (objective.evaluations - window["evaluations"]) / window["iterations"]
                window = {"iterations": 0, "evaluations": objective.evaluations}
                record = {
                    "epoch": epoch_of,
                    "step": step,
                    "optimizer": "lbfgs",
                    "dtype": precision,
                    "loss": loss_value,
                    "lr": length,
                    "grad_norm": grad_norm,
                    "evaluations": objective.evaluations,
                    "evaluations_per_iteration": per_iteration,
                    **diagnostics,
                    "samples_evaluated": objective.samples,
                    "samples_per_s": rate,
                    "compute_s": seconds,
                    "comm_s": 0.0,
                    "ranks": comm.size,
                    "threads": ctx.threads,
                }
                if reason:
                    record["stop_reason"] = reason
                rec.record(
                    record,
                    f"L-BFGS ({cfg.lbfgs_mode}, {precision}) iteration {step - adam_steps}/{total - adam_steps} "
                    f"step {step}/{total} loss {loss_value:.4e} |g| {grad_norm:.2e} step length {length:.2e} "
                    f"{per_iteration:.1f} evaluations/iteration, {diagnostics['line_search_failures']} line-search "
                    f"failures, {diagnostics['skipped_pairs']} skipped pairs"
                    + (f"; stopped: {reason}" if reason else ""),
                )
            if reason or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0):
                save(epoch_of)
            if reason:
                return step, loss_value, reason == "stop requested" and step < total
    finally:
        if work is not model:
            model.load_state_dict(work.state_dict())
    return step, loss_value, False
