"""An optional on-disk cache of the references an evaluation computes: the independent truth and the
grid's floor field, per family, options, grid and instance.

Why: those solves cost far more than a small run's training (a converged Godunov solve per held-out
Burgers instance, a 4x finer FEM per Poisson instance, minutes in 3-D), and they are the same for
every run that evaluates the same family on the same grid and instances: reruns, ``compare``, ``uq``,
a sweep of training settings. Set ``DEEPFUSION_REFERENCE_CACHE`` to a directory to keep them there;
unset (the default), nothing is cached.

A result is filed under a SHA-256 of the package version, the family's class and every field of
the family (its options and grid, encoded exactly: numbers by ``repr``, arrays by their bytes), what
is computed and the instances' bytes. A family that is not a dataclass, or has a field of another
type, is never cached, so no two different problems can share an entry. Files are ``.npz`` read with
``allow_pickle=False`` and written atomically (temporary file, then rename), so ranks or test workers
sharing a directory see whole files only. Clear the directory after changing a reference solver.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Callable

import numpy as np

__all__ = ["ENV", "truth", "discrete_optimum", "truth_side"]

ENV = "DEEPFUSION_REFERENCE_CACHE"


def _encode(value, h) -> bool:
    """Feed ``value`` to the hash exactly; False for a type it cannot encode."""
    if value is None or isinstance(value, (bool, int, float, str)):
        h.update(repr((type(value).__name__, value)).encode())
        return True
    if isinstance(value, np.ndarray):
        h.update(repr((value.dtype.str, value.shape)).encode())
        h.update(np.ascontiguousarray(value).tobytes())
        return True
    if isinstance(value, (tuple, list)):
        h.update(f"{type(value).__name__}{len(value)}(".encode())
        return all(_encode(v, h) for v in value)
    return False


def _path(family, what: str, instances: np.ndarray) -> Path | None:
    root = os.environ.get(ENV)
    if not root or not dataclasses.is_dataclass(family):
        return None
    from importlib.metadata import PackageNotFoundError, version

    h = hashlib.sha256()
    try:
        h.update(version("deepfusion-diffnet").encode())
    except PackageNotFoundError:
        h.update(b"source")
    h.update(f"{type(family).__module__}.{type(family).__qualname__}:{what}".encode())
    for f in dataclasses.fields(family):
        h.update(f.name.encode())
        if not _encode(getattr(family, f.name), h):
            return None
    _encode(np.asarray(instances, dtype=np.float64), h)
    return Path(root) / str(getattr(family, "name", "family")) / f"{what}-{h.hexdigest()}.npz"


def _cached(family, what: str, instances: np.ndarray, compute: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    path = _path(family, what, instances)
    if path is not None and path.is_file():
        try:
            with np.load(path, allow_pickle=False) as f:
                return {k: f[k] for k in f.files}
        except (OSError, ValueError):  # a damaged entry is recomputed and rewritten
            pass
    result = compute()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            np.savez(f, **result)
        os.replace(tmp, path)
    return result


def truth(family, instances: np.ndarray, progress=None) -> np.ndarray:
    """``problem.truth(instances)``, from the cache where it holds it."""
    return _cached(family, "truth", instances, lambda: {"u": family.truth(instances, progress)})["u"]


def discrete_optimum(family, instances: np.ndarray, initial: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``problem.discrete_optimum(instances, initial=initial)``, from the cache where it holds it (the start
    ``initial`` is part of the key: where the loss has several optima it selects one)."""
    key = np.concatenate([np.asarray(instances, dtype=np.float64).ravel(), np.asarray(initial, dtype=np.float64).ravel()])

    def compute() -> dict[str, np.ndarray]:
        optimum, roots = family.discrete_optimum(instances, initial=initial)
        return {"u": optimum, "roots": np.asarray(roots)}

    out = _cached(family, "floor", key, compute)
    return out["u"], out["roots"]


def truth_side(family, what: str, instances: np.ndarray, compute: Callable[[], dict]) -> dict[str, np.ndarray]:
    """A family's own truth-side results (``what``: "truth_derived", "truth_quantities"; a dict of arrays, from the
    reference's own fine solution: the cavity's 257^2 solves), from the cache where it holds them."""
    return _cached(family, what, instances, lambda: {k: np.asarray(v) for k, v in compute().items()})
