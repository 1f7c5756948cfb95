"""Inference over many instances and its accuracy: the relative L2 error against a reference,
and that error measured against the grid's discretisation floor.

The primitives every command and report uses; the run's evaluation report is
:mod:`deepfusion.analysis.evaluate`, the error's structure :mod:`deepfusion.analysis.diagnostics`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from deepfusion.analysis import reference_cache
from deepfusion.training.stepper import to_channels_last
from diffnet.generators.two_stage import TwoStage

__all__ = ["predict", "domain_of", "relative_l2", "FloorReport", "against_floor"]


@torch.inference_mode()
def predict(model: torch.nn.Module, problem, params: np.ndarray, batch: int = 16, tiling=None) -> np.ndarray:
    """Fields for each row of ``params`` by one forward pass per batch, as float64 numpy.

    The input goes in channels-last (NHWC) order, which the convolutions then keep:
    1.2-1.4x faster on CPU here than NCHW, and the model itself is left as it is.
    With a ``tiling`` (a domain split, collective over its ranks) the generator runs on this
    rank's tile and the network's outputs are gathered: every rank of the split gets the
    whole fields. A two-stage generator runs as its second stage (:class:`diffnet.generators.two_stage.SecondStage`).
    A family on a domain cut out of the grid (capability ``domain``) gets zero at the nodes outside
    it: its field there only extends the discrete space, and errors are measured inside.
    """
    if isinstance(model, TwoStage):
        model, problem = model.pair(problem)
    model.eval()
    weight = next(model.parameters())
    out = []
    with torch.inference_mode():  # no autograd graph: only one chunk's activations are alive at a time
        for start in range(0, len(params), batch):
            p = torch.as_tensor(params[start : start + batch], dtype=weight.dtype, device=weight.device)
            if tiling is None:
                raw = model(to_channels_last(problem.inputs(p)))
            else:
                raw = tiling.gather(model(to_channels_last(tiling.local(problem.inputs(p)).contiguous()), tiling))
            out.append(problem.field(raw, p).double().cpu().numpy())
    fields = np.concatenate(out, axis=0)
    domain = domain_of(problem, params)
    return fields if domain is None else np.where(domain <= 0, fields, 0.0)


def domain_of(problem, params: np.ndarray) -> np.ndarray | None:
    """The signed distance at the nodes (S, *grid) of a family with the ``domain`` capability, else None."""
    return np.asarray(problem.domain(np.asarray(params)), dtype=np.float64) if problem.has("domain") else None


def relative_l2(pred: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per-sample ||pred - ref||_2 / ||ref||_2 over all nodes; shape (S,)."""
    if pred.shape != ref.shape:
        raise ValueError(f"shapes differ: {pred.shape} vs {ref.shape}")
    diff = (pred - ref).reshape(len(ref), -1)
    return np.linalg.norm(diff, axis=1) / np.linalg.norm(ref.reshape(len(ref), -1), axis=1)


@dataclass
class FloorReport:
    """Accuracy of predicted fields against the independent reference and the grid's floor.

    ``error`` is each instance's relative L2 distance to the truth (``truth_name``);
    ``floor`` the same for the best field the grid allows under the trained loss
    (``floor_name``: the zero-residual field or energy minimiser); ``ratio`` is mean error
    over mean floor, 1 when the network has done all its grid allows. A family that
    declares no floor gets NaN floors and ratio.
    """

    truth: np.ndarray
    error: np.ndarray
    floor: np.ndarray
    floor_is_root: np.ndarray
    truth_name: str
    floor_name: str
    truth_seconds: float
    floor_seconds: float
    optimum: np.ndarray | None = None  # the floor's fields themselves

    @property
    def ratio(self) -> float:
        return float(self.error.mean() / self.floor.mean())

    def as_dict(self) -> dict:
        return {
            "truth": self.truth_name,
            "floor_field": self.floor_name,
            "rel_l2": self.error.tolist(),
            "mean_rel_l2": float(self.error.mean()),
            "max_rel_l2": float(self.error.max()),
            "floor_rel_l2": self.floor.tolist(),
            "mean_floor": float(self.floor.mean()),
            "ratio_to_floor": self.ratio,
            "floor_is_root": self.floor_is_root.tolist(),
            "truth_seconds": self.truth_seconds,
            "floor_seconds": self.floor_seconds,
        }


def against_floor(problem, params: np.ndarray, pred: np.ndarray, truth: np.ndarray | None = None,
                  progress=None) -> FloorReport:
    """Measure ``pred`` (S, ...) against ``problem.truth`` and the floor ``problem.discrete_optimum``
    (the family's ``reference`` and ``floor`` capabilities; without a floor, NaN floors).

    The floor's direct solve starts from the truth, so where the trained loss has several
    optima (the central Burgers residual) the one nearest the truth is taken. Both come from the
    reference cache when ``DEEPFUSION_REFERENCE_CACHE`` names one (:mod:`~deepfusion.analysis.reference_cache`).
    """
    t0 = time.perf_counter()
    if truth is None:
        truth = reference_cache.truth(problem, params, progress)
    t1 = time.perf_counter()
    if problem.has("floor"):
        optimum, roots = reference_cache.discrete_optimum(problem, params, truth)
        floor, floor_name = relative_l2(optimum, truth), problem.floor_name()
    else:
        optimum, roots, floor, floor_name = None, np.zeros(len(truth), dtype=bool), np.full(len(truth), np.nan), "none"
    t2 = time.perf_counter()
    return FloorReport(truth, relative_l2(pred, truth), floor, roots, problem.truth_name(), floor_name,
                       t1 - t0, t2 - t1, optimum)
