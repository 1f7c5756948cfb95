"""DeepXDE's physics-informed network on a DiffNet family, trained to a wall-clock budget: parametric (x, y and the
instance's parameters as inputs; one network for the family) or on one instance (the whole budget for it).

Set up as DeepXDE's documentation and examples advise: a tanh MLP with Glorot-normal weights, inputs mapped to
[-1, 1] (``apply_feature_transform``), Dirichlet sides exact (``apply_output_transform``), the flux and traction
sides as ``OperatorBC`` penalties, random ("pseudo") collocation points resampled every ``resample`` iterations
(``PDEPointResampler``; the sides' points stay, as its default keeps them), Adam at 1e-3 for a share of the budget
(``PinnSetup``), then L-BFGS for the rest. The strong forms: :mod:`peer_arms.forms`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from peer_arms.forms import form_of
from peer_arms.watch import Watch

__all__ = ["PinnSetup", "train_pinn"]


@dataclass(frozen=True)
class PinnSetup:
    """DeepXDE's knobs (the defaults: what was measured best here at these budgets; docs/results.md)."""

    width: int = 64
    depth: int = 4
    points: int = 4096  # collocation points in the box (x, y[, parameters])
    boundary: int = 2048  # on the box's faces (those of the flux or traction sides are kept)
    resample: int = 100  # iterations between fresh points
    lr: float = 1e-3
    # Adam's share of the budget, L-BFGS the rest. Measured (Poisson 64^2, 264 s): the parametric PINN's L-BFGS on fixed
    # points in 8-D overfits them (0.255 -> 0.294), so resampled Adam takes most; one instance's L-BFGS took
    # 0.41 -> 0.13 in its last fifth, so it takes most there.
    adam_share: float = 0.8
    one_adam_share: float = 0.2
    bc_weight: float = 1.0  # the weight of each side's penalty against the equation's (DeepXDE's loss_weights)
    seed: int = 0


def _dde():
    os.environ.setdefault("DDE_BACKEND", "pytorch")
    import deepxde as dde

    if dde.backend.backend_name != "pytorch":
        raise RuntimeError(f"peers: DeepXDE must run on its pytorch backend (DDE_BACKEND=pytorch), got "
                           f"{dde.backend.backend_name}")
    return dde


def train_pinn(family, test: np.ndarray, score, budget: float, setup: PinnSetup = PinnSetup(),
               fixed: np.ndarray | None = None, label: str = "pinn") -> dict:
    """Train DeepXDE's PINN on ``family`` for ``budget`` training seconds (evaluations off the clock); ``fixed``:
    one instance (its row) instead of the family. Returns the arm's record: the held-out fields of ``test`` (the
    fixed instance's alone when ``fixed``), the error curve, training and inference seconds."""
    dde = _dde()
    import torch

    dde.config.set_random_seed(setup.seed)
    form = form_of(family, fixed)
    low, high = form.box
    geometry = dde.geometry.Hypercube(low, high) if len(low) > 2 else dde.geometry.Rectangle(low, high)
    data = dde.data.PDE(geometry, form.pde, form.conditions(geometry), num_domain=setup.points,
                        num_boundary=setup.boundary, train_distribution="pseudo")
    net = dde.nn.FNN([len(low)] + [setup.width] * setup.depth + [form.channels], "tanh", "Glorot normal")
    net.apply_feature_transform(form.features)
    net.apply_output_transform(form.output)
    model = dde.Model(data, net)
    points = form.grid_points(test)

    def fields() -> np.ndarray:
        return form.to_fields(model.predict(points), len(test))

    watch = Watch(budget, score, label=label)

    class Budget(dde.callbacks.Callback):
        """Stops a phase at its share of the budget and records the curve at the watch's marks."""

        def __init__(self, until: float, phase: str) -> None:
            super().__init__()
            self.until, self.phase = until, phase

        def on_epoch_end(self) -> None:
            if watch.due():
                watch.record(fields, phase=self.phase, iteration=int(self.model.train_state.iteration))
            if watch.seconds() >= self.until:
                self.model.stop_training = True

    resampler = dde.callbacks.PDEPointResampler(period=setup.resample, pde_points=True)
    weights = [1.0] * form.channels + [setup.bc_weight] * len(data.bcs)  # one equation per unknown, then the sides
    model.compile("adam", lr=setup.lr, loss_weights=weights)
    share = setup.adam_share if fixed is None else setup.one_adam_share
    model.train(iterations=10**9, callbacks=[Budget(share * budget, "adam"), resampler],
                display_every=10**9, verbose=0)
    if watch.seconds() < budget:
        dde.optimizers.set_LBFGS_options(maxiter=10**9)
        # DeepXDE's torch L-BFGS takes iter_per_step iterations (up to 1000) between callbacks: 10 lets the budget
        # stop it within a few iterations of its end; the optimiser's history carries across the steps.
        dde.optimizers.config.LBFGS_options["iter_per_step"] = 10
        model.compile("L-BFGS", loss_weights=weights)
        model.train(callbacks=[Budget(budget, "lbfgs")], display_every=10**9, verbose=0)
    train_seconds = watch.seconds()
    error = watch.record(fields, phase="end", iteration=int(model.train_state.iteration))
    t0 = time.perf_counter()
    with torch.no_grad():
        pred = fields()
    infer = (time.perf_counter() - t0) / len(test)
    return {"fields": pred, "error": error, "train_seconds": train_seconds, "inference_per_instance_s": infer,
            "curve": watch.curve, "iterations": int(model.train_state.iteration),
            "parameters": sum(p.numel() for p in net.parameters()), "setup": setup.__dict__}
