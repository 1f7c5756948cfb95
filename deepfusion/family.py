"""A PDE family from a config, without a trained run: its classical solves, reference and floor from Python (the
classical route of an inverse problem, a study's truth, a check of a network against the solver it replaces)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

__all__ = ["load_family"]


def load_family(config: str | Path, overrides: Sequence[str] = ()):
    """The family a config trains (its ``problem.family`` on ``problem.resolution``, with its table's keys), after
    the checks ``deepfusion train`` makes.

    Parameters
    ----------
    config : str or Path
        A TOML config, e.g. ``configs/poisson.toml``.
    overrides : sequence of str
        ``section.key=value`` as ``train --set`` takes them; a grid of its own with the schedule's levels dropped
        (they end on the config's grid): ``["problem.resolution=[33, 33]", "multigrid.levels=[]"]``.

    Returns
    -------
    diffnet.protocol.family.Family
        Its classical side where it has one: ``discrete_optimum(rows)`` (the same-grid solve: fields and whether
        each converged), ``reference(rows)`` (the converged reference on this grid's nodes),
        ``classical_solver(method, grid)(row)`` with ``classical_to_grid`` (``classical_methods`` lists them),
        ``derived(rows, fields)``; ``parameters`` (the instances' names and ranges) and ``loss_terms(u, instances)``.

    Raises
    ------
    deepfusion.configuration.schema.ConfigError
        A bad file, key or value: one line naming it (a ``ValueError``).
    """
    from deepfusion.configuration.config import load_config
    from deepfusion.configuration.run import Run

    return Run.from_config(load_config(config, list(overrides))).family
