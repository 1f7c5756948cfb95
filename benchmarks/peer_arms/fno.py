"""A Fourier neural operator (``neuraloperator``'s FNO) trained on the classical solver's fields, to a wall-clock
budget that counts the solves.

As the package's Darcy-flow example trains it: the instance's input fields (the family's own network inputs: log
coefficient, and for elasticity the Poisson ratio, with the coordinates) normalised per channel, ``FNO(n_modes=(16,
16), hidden_channels=32, projection_channel_ratio=2)``, AdamW (weight decay 1e-4) on a cosine schedule, the H1 loss
(``neuralop.losses.H1Loss``) on mini-batches of 32. The Dirichlet values are imposed exactly, as DiffNet's own field
is (the family's :meth:`~diffnet.protocol.family.Family.field` of the operator's output). The training pairs are the
family's training instances solved on its grid by the strongest classical solver the project has there (the sparse
Cholesky, CHOLMOD, where the family offers it; else the family's reference solve), one at a time, their seconds
counted in the budget.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass

import numpy as np

from peer_arms.watch import Watch

__all__ = ["FnoSetup", "train_fno", "solve_pairs"]


@dataclass(frozen=True)
class FnoSetup:
    """The operator's knobs (the package's Darcy example's, the learning rate measured here; docs/results.md)."""

    modes: int = 16
    width: int = 32
    lr: float = 5e-3
    weight_decay: float = 1e-4
    batch: int = 32
    pairs: int | None = None  # training pairs solved: the first of the family's training set (None: all of it)
    seed: int = 0


def solve_pairs(family, instances: np.ndarray, budget: float, watch: Watch) -> tuple[np.ndarray, np.ndarray, str]:
    """The classical fields of ``instances`` on the family's grid, solved one by one on ``watch``'s clock; stops at
    half the budget (the operator needs the rest). Returns the instances solved, their fields, the solver's name."""
    methods = getattr(family, "classical_methods", {}) or {}
    if "cholesky" in methods:
        solve, name = family.classical_solver("cholesky", max(family.resolution)), "sparse Cholesky (CHOLMOD)"
    else:
        solve, name = (lambda p: family.reference(p[None])[0]), family.reference_name()
    fields = []
    for k, p in enumerate(instances):
        fields.append(np.asarray(solve(p), dtype=np.float64))
        if watch.seconds() > budget / 2:
            print(f"  fno: {k + 1} of {len(instances)} pairs solved in half the budget; training on those",
                  file=sys.stderr, flush=True)
            break
    return instances[: len(fields)], np.stack(fields), name


def train_fno(family, training: np.ndarray, test: np.ndarray, score, budget: float,
              setup: FnoSetup = FnoSetup(), label: str = "fno") -> dict:
    """Solve training pairs and train the FNO on them for ``budget`` seconds in all (solves included). Returns the
    arm's record: the held-out fields of ``test``, the error curve, training (and solving) and inference seconds, and
    the operator as a generator (``module``)."""
    import torch
    from neuralop.losses import H1Loss
    from neuralop.models import FNO

    torch.manual_seed(setup.seed)
    watch = Watch(budget, score, label=label)
    chosen = np.asarray(training[: setup.pairs], dtype=np.float64)
    solved, targets, solver = solve_pairs(family, chosen, budget, watch)
    solve_seconds = watch.seconds()
    print(f"  {label}: {len(solved)} pairs by {solver} in {solve_seconds:.1f} s", file=sys.stderr, flush=True)

    inputs = family.inputs(torch.as_tensor(solved, dtype=torch.float32))
    mean = inputs.mean(dim=(0, 2, 3), keepdim=True)
    std = inputs.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    channels = targets.shape[1] if targets.ndim == 4 else 1
    target = torch.as_tensor(targets, dtype=torch.float32).reshape(len(solved), channels, *targets.shape[-2:])
    params = torch.as_tensor(solved, dtype=torch.float32)
    test_params = torch.as_tensor(np.asarray(test, dtype=np.float64), dtype=torch.float32)
    test_inputs = family.inputs(test_params)
    model = FNO(n_modes=(setup.modes, setup.modes), hidden_channels=setup.width, in_channels=inputs.shape[1],
                out_channels=channels, projection_channel_ratio=2)
    optimiser = torch.optim.AdamW(model.parameters(), lr=setup.lr, weight_decay=setup.weight_decay)
    loss = H1Loss(d=2)

    class Operator(torch.nn.Module):
        """The operator as a generator of the family's inputs (normalised inside): what it trains as, and what DiffNet's
        product finishes in its network's place (``benchmarks/peers.py``'s "FNO + DiffNet's finish")."""

        def __init__(self) -> None:
            super().__init__()
            self.fno = model
            self.register_buffer("mean", mean)
            self.register_buffer("std", std)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fno((x - self.mean) / self.std)

    operator = Operator()

    def field(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        f = family.field(operator(x), p)
        return f.reshape(len(p), channels, *f.shape[-2:])

    def fields() -> np.ndarray:
        with torch.no_grad():
            f = field(test_inputs, test_params).double().numpy()
        return f[:, 0] if channels == 1 else f

    generator = torch.Generator().manual_seed(setup.seed)
    epochs, epoch = None, 0
    while not watch.over():
        t0 = watch.seconds()
        order = torch.randperm(len(solved), generator=generator)
        for start in range(0, len(solved), setup.batch):
            idx = order[start:start + setup.batch]
            optimiser.zero_grad()
            value = loss(field(inputs[idx], params[idx]), target[idx])
            value.backward()
            optimiser.step()
            if watch.due():
                watch.record(fields, epoch=epoch)
            if watch.over():
                break
        epoch += 1
        if epochs is None:  # the cosine schedule's length: the epochs the rest of the budget holds at the first's pace
            epochs = max(1, int((budget - solve_seconds) / max(watch.seconds() - t0, 1e-9)))
        for group in optimiser.param_groups:
            group["lr"] = 0.5 * setup.lr * (1 + math.cos(math.pi * min(epoch / epochs, 1.0)))
    train_seconds = watch.seconds()
    error = watch.record(fields, epoch=epoch)
    t0 = time.perf_counter()
    pred = fields()
    infer = (time.perf_counter() - t0) / len(test)
    return {"fields": pred, "error": error, "train_seconds": train_seconds, "solve_seconds": solve_seconds,
            "pairs": len(solved), "solver": solver, "epochs": epoch, "inference_per_instance_s": infer,
            "curve": watch.curve, "parameters": sum(p.numel() for p in model.parameters()), "setup": setup.__dict__,
            "module": operator.eval()}
