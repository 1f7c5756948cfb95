"""Wiring: how a config becomes a diffnet problem, a generator, its training and held-out instances,
and the generator and problem of each multigrid level."""

from __future__ import annotations

import dataclasses

import numpy as np

from deepfusion.config import Config

__all__ = [
    "build_problem",
    "build_model",
    "level_models",
    "sample_parameters",
    "training_parameters",
    "heldout_parameters",
    "parameter_name",
    "field_attrs",
]



def build_problem(cfg: Config):
    """The diffnet problem instance named by ``[problem]``."""
    p = cfg.problem
    if p.name == "burgers":
        from diffnet.problems.burgers import BurgersProblem

        return BurgersProblem(
            resolution=tuple(p.resolution),
            viscosity=p.viscosity,
            t_final=p.t_final,
            stencil=p.residual,
            scheme_order=p.scheme_order,
            flux=p.flux,
            preconditioner=p.preconditioner,
            boundary=p.boundary,
            penalty=p.penalty,
        )
    family = {
        "resolution": tuple(p.resolution),
        "kl_terms": p.kl_terms,
        "eta": p.kl_eta,
        "coeff_range": tuple(p.coeff_range),
        "constant": p.viscosity if p.diffusivity == "constant" else 0.0,
        "truth_refine": p.truth_refine,
    }
    if p.name == "poisson":
        from diffnet.problems.poisson import PoissonProblem

        return PoissonProblem(**family)
    from diffnet.problems.reaction_diffusion import ReactionDiffusionProblem

    return ReactionDiffusionProblem(**family, kappa=p.kappa, source=p.source)


def sample_parameters(cfg: Config, n: int, sampling: str, seed: int) -> np.ndarray:
    p = cfg.problem
    if p.name == "burgers":
        from diffnet.problems.burgers import sample_c

        return sample_c(tuple(p.c_range), n, sampling, seed)
    from diffnet.problems.poisson import sample_coefficients

    return sample_coefficients(tuple(p.coeff_range), p.kl_terms, n, sampling, seed)


def training_parameters(cfg: Config) -> np.ndarray:
    """Instance parameters of the training set, one row per sample."""
    if cfg.data.sampling == "list":
        return np.asarray(cfg.problem.c_values, dtype=np.float64)
    return sample_parameters(cfg, cfg.data.n_train, cfg.data.sampling, cfg.data.seed)


def heldout_parameters(cfg: Config, count: int | None = None) -> np.ndarray:
    """Held-out instances: Burgers' ``problem.test_c``, or else n_test random draws from another stream.

    With ``count``, the first ``count`` of them (any number of draws for the elliptic
    families: the stream's first rows do not depend on how many are drawn).
    """
    if cfg.problem.name == "burgers" and cfg.problem.test_c:
        c = np.asarray(cfg.problem.test_c, dtype=np.float64)
        if count is not None and count > len(c):
            from deepfusion.inputs import InputError

            raise InputError(f"--samples: this run holds out {len(c)} value{'s' if len(c) != 1 else ''} of c "
                             f"(problem.test_c); got {count}")
        return c if count is None else c[:count]
    return sample_parameters(cfg, cfg.data.n_test if count is None else count, "random", cfg.data.seed + 7919)


def parameter_name(cfg: Config) -> str:
    """The field-file dataset holding the instance parameters: ``c`` or ``a``."""
    return "c" if cfg.problem.name == "burgers" else "a"


def build_model(cfg: Config, problem):
    """The generator of ``[model]``; a multigrid run that deepens (``multigrid.transfer``) gets
    a :class:`~diffnet.networks.LevelStack` with one refinement per finer level."""
    import torch

    from diffnet.networks import build_network

    mg = cfg.multigrid
    model = build_network(cfg.model.name, problem.in_channels, tuple(cfg.model.channels),
                          cfg.model.checkpoint_activations,
                          levels=tuple(mg.levels) if mg.transfer == "deepen" else (), top_channels=mg.top_channels,
                          output=cfg.model.output)
    return model.to(getattr(torch, cfg.train.dtype))


def level_models(cfg: Config, model):
    """``level(k) -> (generator, problem)`` of multigrid level k: the problem on that level's grid
    (or, with ``multigrid.coarse_loss = "galerkin"`` below the finest level, the finest grid's
    problem of the level's prolonged output), and the generator trained there (the deepened
    stack's level k, or the carried network)."""
    from diffnet.galerkin import GalerkinLevel
    from diffnet.networks import LevelStack

    grids: dict[int, object] = {}  # the problem on each level's own grid, built once
    levels = cfg.multigrid.levels
    finest = len(levels) - 1

    def on_grid(k: int):
        if k not in grids:
            grid = tuple(cfg.problem.resolution) if not levels else (levels[k],) * 2
            grids[k] = build_problem(cfg.replace(problem=dataclasses.replace(cfg.problem, resolution=grid)))
        return grids[k]

    def level(k: int):
        galerkin = cfg.multigrid.coarse_loss == "galerkin" and k < finest
        problem = GalerkinLevel(on_grid(k), on_grid(finest)) if galerkin else on_grid(k)
        return (model.level(k) if isinstance(model, LevelStack) else model), problem

    return level


def field_attrs(cfg: Config, source: str) -> dict:
    p = cfg.problem
    if p.name == "burgers":
        return {
            "problem": p.name,
            "source": source,
            "viscosity": p.viscosity,
            "t_final": p.t_final,
            "residual": p.residual,
            **({"scheme_order": p.scheme_order, "flux": p.flux, "preconditioner": p.preconditioner}
               if p.residual == "conservative" else {}),
        }
    attrs = {"problem": p.name, "source": source, "diffusivity": p.diffusivity, "kl_terms": p.kl_terms, "kl_eta": p.kl_eta}
    if p.diffusivity == "constant":
        attrs["nu"] = p.viscosity
    if p.name == "reaction_diffusion":
        attrs |= {"kappa": p.kappa, "f": p.source}
    return attrs
