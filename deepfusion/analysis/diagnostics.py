"""Where a network's error lives: its share in the lowest modes, and how much of it is the
coarse level's imprint (the coarse generator's output prolonged, minus the grid's optimum).

A generator whose error sits in the smoothest modes and points along the coarse imprint has
not removed the coarse level's discretisation error: the symptom the multilevel output basis
and Galerkin coarse levels address (docs/physics.md, "The output basis").
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.fft import dctn

from diffnet.generators.multilevel import prolong

__all__ = ["LOW_MODES", "low_mode_share", "cosine", "coarse_imprint", "error_structure"]

# Modes (k_y, k_x) of the orthonormal cosine transform with k_y + k_x <= LOW_MODES (3-D: k_z + k_y + k_x)
# count as "lowest".
LOW_MODES = 8


def low_mode_share(error: np.ndarray, k_max: int = LOW_MODES, dims: int | None = None) -> np.ndarray:
    """Per sample of ``error`` (S, *grid), or (S, C, *grid) for several unknown fields with ``dims`` the
    grid's axes, the fraction of ||error||^2 in the DCT-I modes with k_y + k_x <= k_max (3-D: k_z + k_y + k_x),
    every field's modes together.

    The type-I cosine transform fits nodal grids that include the boundary (any field is a
    sum of its modes; the orthonormal form keeps the squared norm).
    """
    error = np.asarray(error, dtype=np.float64)
    dims = error.ndim - 1 if dims is None else dims
    grid_axes = tuple(range(error.ndim - dims, error.ndim))
    coeff = dctn(error, type=1, axes=grid_axes, norm="ortho")
    low = np.indices(error.shape[-dims:]).sum(axis=0) <= k_max
    per_sample = tuple(range(1, coeff.ndim - dims + 1))  # after the mask the grid is one axis, last
    total = np.square(coeff).sum(axis=tuple(range(1, coeff.ndim)))
    return np.square(coeff[..., low]).sum(axis=per_sample) / np.maximum(total, 1e-300)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per sample, <a, b> / (|a| |b|) over all nodes (0 where either is zero)."""
    a, b = (np.asarray(v, dtype=np.float64).reshape(len(v), -1) for v in (a, b))
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.where(norms > 0, (a * b).sum(axis=1) / np.where(norms > 0, norms, 1.0), 0.0)


def coarse_imprint(run, model, instances: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """The coarsest multigrid level's fields for ``instances``, prolonged to ``shape`` (None for one level);
    ``run`` a :class:`~deepfusion.configuration.run.Run` (its level 0, the family on that grid built once)."""
    if len(run.cfg.multigrid.levels) < 2:
        return None
    coarsest = run.schedule(model).target(next(s for s in run.visits if s.level == 0))
    generator, family = coarsest.generator, coarsest.family
    from diffnet.product.product import Product

    coarse = Product(family, generator).fields(instances)  # the level's own fields, as that level trained them
    if coarse.shape[1:] != tuple(shape):  # a rediscretised level: its own grid; a Galerkin level is already fine
        # Bilinear (trilinear) between nodal grids, the transfer the multigrid levels use; several unknown
        # fields are the channels.
        several = len(family.unknowns) > 1
        grid = tuple(shape[1:]) if several else tuple(shape)
        fields = torch.as_tensor(coarse) if several else torch.as_tensor(coarse)[:, None]
        coarse = prolong(fields, grid).numpy()
        coarse = coarse if several else coarse[:, 0]
    return coarse


def error_structure(pred: np.ndarray, truth: np.ndarray, optimum: np.ndarray | None,
                    coarse: np.ndarray | None, dims: int | None = None) -> dict:
    """The diagnostics ``eval.json`` carries: the low-mode share of the error against the truth,
    and, for multigrid runs, the cosine between the network's distance from the grid's optimum
    and the coarse imprint (prolonged coarse output minus that optimum), with the imprint's size.
    ``dims``: the grid's axes, where the fields are (S, C, *grid)."""
    share = low_mode_share(pred - truth, dims=dims)
    out = {"low_mode_k_max": LOW_MODES, "low_mode_share": share.tolist(), "mean_low_mode_share": float(share.mean())}
    if coarse is not None and optimum is not None:
        imprint = coarse - optimum
        cos = cosine(pred - optimum, imprint)
        size = np.linalg.norm(imprint.reshape(len(imprint), -1), axis=1) / np.linalg.norm(
            truth.reshape(len(truth), -1), axis=1)
        out |= {"imprint_cosine": cos.tolist(), "mean_imprint_cosine": float(cos.mean()),
                "coarse_imprint_rel_l2": size.tolist(), "mean_coarse_imprint_rel_l2": float(size.mean())}
    return out
