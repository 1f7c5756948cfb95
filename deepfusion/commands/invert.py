"""``deepfusion invert``: the instance behind observations of the field, through the trained surrogate (exact
gradients), and with ``--classical`` the same by the family's classical solve with adjoint gradients: MAP, the
Laplace posterior and, with ``--samples``, MCMC chains; DIR/map.json, DIR/posterior.h5 and DIR/posterior.png."""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

from deepfusion.commands import warn
from deepfusion.configuration.inputs import InputError, require

__all__ = ["command"]


def _check(args: argparse.Namespace) -> None:
    if args.out.exists() and not args.out.is_dir():
        raise InputError(f"--out: {args.out} is a file; invert writes a directory (map.json, posterior.h5, posterior.png)")
    if not 1 <= args.starts <= 1024:
        raise InputError(f"--starts: must be in 1..1024, got {args.starts}")
    for flag, samples in (("--samples", args.samples), ("--classical-samples", args.classical_samples)):
        if not (samples is None or samples == 0 or 10 <= samples <= 10_000_000):
            raise InputError(f"{flag}: must be 0 (no MCMC) or in 10..10000000, got {samples}")
    if args.classical_samples is not None and not args.classical:
        raise InputError("--classical-samples: only with --classical")
    if not 1 <= args.chains <= 4096:
        raise InputError(f"--chains: must be in 1..4096, got {args.chains}")
    if not 1 <= args.max_iterations <= 100_000:
        raise InputError(f"--max-iterations: must be in 1..100000, got {args.max_iterations}")


class Side(NamedTuple):
    """One side of the inversion: its ``name``, its ``forward`` model, ``calls()`` its count of forward evaluations
    for the report, its chains' ``samples`` and whether its gradients are ``exact``."""

    name: str
    forward: Callable
    calls: Callable[[], dict]
    samples: int
    exact: bool


def _side(side: Side, observations, prior, starts, args, names) -> dict:
    """One side's MAP, Laplace posterior and (``side.samples``) chains, printed as it goes. With exact gradients the
    surrogate's Jacobian by a batch of copies, the classical one by an adjoint solve per observation
    (:func:`~deepfusion.analysis.inverse.jacobian`); central differences carry their Jacobian already."""
    import torch

    name, forward, calls, samples, exact = side

    from deepfusion.analysis.inverse import laplace, map_estimate, objective
    from deepfusion.analysis.mcmc import effective_sample_size, metropolis

    def progress(iteration: int, best: float) -> None:
        if iteration % 5 == 0:
            print(f"  {name}: L-BFGS iteration {iteration}, best objective {best:.6g}", flush=True)

    t0 = time.perf_counter()
    result = map_estimate(forward, observations, prior, starts, args.max_iterations, progress)
    post = laplace(forward, observations, prior, result.map.reshape(prior.low.shape),  # one instance, its own shape
                   copies=name == "surrogate" and exact)
    seconds_map = time.perf_counter() - t0
    out = {"map": dict(zip(names, result.map.reshape(-1).tolist())), "objective": result.objective,
           "misfit_rms": result.misfit_rms, "seconds": seconds_map, "iterations": result.iterations,
           "message": result.message, "starts": len(starts), "start_objectives": result.initial.tolist(),
           "end_objectives": result.objectives.tolist(),
           "laplace_std": dict(zip(names, post["std"].tolist())), "unidentified_directions": post["unidentified"]}
    print(f"  {name}: MAP objective {result.objective:.6g}, misfit {result.misfit_rms:.3f} sigma (rms), "
          f"{result.iterations} iterations from {len(starts)} starts, {seconds_map:.2f} s ({result.message})", flush=True)
    if post["unidentified"]:
        warn(f"{name}: {post['unidentified']} direction(s) of the parameters the observations do not determine "
             "(their Laplace spread is the prior's)")
    arrays = {"map": result.map, "laplace_covariance": post["covariance"], "starts": starts, "ends": result.ends}
    with torch.no_grad():
        arrays["predicted"] = forward(torch.as_tensor(result.map[None]))[0].numpy()
    if samples:
        shape = result.map.shape
        chains = args.chains
        steps = -(-samples // chains)
        burn_in = max(1, steps // 5)
        rng = np.random.default_rng(args.seed + 1)
        jitter = rng.multivariate_normal(np.zeros(post["std"].size), post["covariance"], chains) * 0.1
        starts_mcmc = np.clip(result.map.reshape(1, -1) + jitter, prior.low.reshape(-1), prior.high.reshape(-1))

        def log_posterior(x: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                return -objective(forward, observations, prior, torch.as_tensor(x.reshape(-1, *shape))).numpy()

        def report(step: int, acceptance: float) -> None:
            bar = "#" * int(20 * step / (steps + burn_in))
            print(f"  {name}: MCMC [{bar:<20}] step {step}/{steps + burn_in}, acceptance {acceptance:.1%}", flush=True)

        t1 = time.perf_counter()
        run = metropolis(log_posterior, starts_mcmc, post["covariance"], steps + burn_in,
                         lambda x: prior.inside(x.reshape(-1, *shape)), args.seed, report)
        kept = run.samples[:, burn_in:]
        ess = effective_sample_size(kept)
        drawn = kept.reshape(-1, kept.shape[2])
        out["mcmc"] = {"samples": int(len(drawn)), "chains": chains, "burn_in": burn_in,
                       "acceptance": float(run.accepted.mean()), "seconds": time.perf_counter() - t1,
                       "mean": dict(zip(names, drawn.mean(0).tolist())),
                       "std": dict(zip(names, drawn.std(0, ddof=1).tolist())),
                       "effective_sample_size": dict(zip(names, ess.tolist()))}
        finite = ess[np.isfinite(ess)]
        spread = f"{finite.min():.0f} (the least) .. {finite.max():.0f}" if finite.size else "none (no move accepted)"
        print(f"  {name}: MCMC {len(drawn)} samples ({chains} chains after {burn_in} steps of burn-in), acceptance "
              f"{run.accepted.mean():.1%}, effective sample size {spread}, {out['mcmc']['seconds']:.1f} s", flush=True)
        arrays["samples"] = run.samples  # every step; the first burn_in of each chain are not the posterior's
        arrays["burn_in"] = burn_in
    out["gradients"] = "exact" if exact else "central differences"
    out["seconds_total"] = time.perf_counter() - t0
    out.update(calls())
    return {"report": out, "arrays": arrays, "std": post["std"]}


def command(args: argparse.Namespace, comm) -> int:
    import h5py

    from deepfusion.analysis.inverse import classical_forward, parameter_names, prior_of, surrogate_forward
    from deepfusion.analysis.observations import read_observations
    from deepfusion.files.plots import plot_posterior
    from deepfusion.surrogate import Surrogate

    _check(args)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        surrogate = Surrogate.load(args.run_dir, checkpoint=args.checkpoint)
    for w in caught:
        warn(str(w.message))
    family = surrogate.family
    exact_gradients = {"surrogate": surrogate.exact_gradients, "classical": family.has("differentiable")}
    if args.classical:
        require(family, "floor", "--classical")
    try:
        observations = read_observations(args.observations, family)
        prior = prior_of(family, args.prior)
    except ValueError as e:
        raise InputError(str(e)) from None
    names = parameter_names(family)
    starts = prior.draw(args.starts, args.seed)
    print(f"deepfusion invert: {args.run_dir} ({family.name}, {'x'.join(map(str, family.resolution))}), checkpoint "
          f"{surrogate.checkpoint}; {len(observations)} observations of {', '.join(sorted(set(observations.names)))}; "
          f"prior {args.prior} on the training range; {len(names)} parameters ({', '.join(names[:6])}"
          f"{', …' if len(names) > 6 else ''}); gradients " + ", ".join(
              f"{side}'s {'exact' if exact else 'by central differences (none exact in the instances)'}"
              for side, exact in exact_gradients.items() if side == "surrogate" or args.classical), flush=True)

    calls = [0]
    forward = surrogate_forward(surrogate, observations)

    def counted(p):
        calls[0] += len(p)
        return forward(p)

    sides = {"surrogate": _side(Side("surrogate", counted, lambda: {"surrogate_calls": calls[0]}, args.samples,
                                     exact_gradients["surrogate"]), observations, prior, starts, args, names)}
    if args.classical:
        solves = [0, 0]
        solver = classical_forward(family, observations, solves)
        sides["classical"] = _side(Side("classical", solver, lambda: {"solves": solves[0], "adjoint_solves": solves[1]},
                                        args.samples if args.classical_samples is None else args.classical_samples,
                                        exact_gradients["classical"]), observations, prior, starts, args, names)
    report = {"run_dir": str(args.run_dir), "checkpoint": str(surrogate.checkpoint), "family": family.name,
              "observations": len(observations), "prior": args.prior, "parameters": names,
              **sides["surrogate"]["report"]}
    if args.classical:
        report["classical"] = sides["classical"]["report"]
        import torch

        from deepfusion.analysis.inverse import objective

        a, b = (np.asarray(list(sides[k]["report"]["map"].values())) for k in ("surrogate", "classical"))
        with torch.no_grad():  # the surrogate's answer judged by the classical model
            judged = float(objective(solver, observations, prior, torch.as_tensor(sides["surrogate"]["arrays"]["map"][None]))[0])
        report["map_difference"] = {"max_abs": float(np.abs(a - b).max()),
                                    "in_classical_std": float(np.max(np.abs(a - b) / sides["classical"]["std"])),
                                    "classical_objective_at_surrogate_map": judged,
                                    "relative_to_classical_map": judged / report["classical"]["objective"] - 1.0}
        print(f"  the two MAPs differ by {report['map_difference']['max_abs']:.3g} at most "
              f"({report['map_difference']['in_classical_std']:.2f} classical Laplace standard deviations); the "
              f"surrogate's MAP in the classical model: objective {judged:.6g}, "
              f"{report['map_difference']['relative_to_classical_map']:+.2%} from the classical MAP's", flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "map.json").write_text(json.dumps(report, indent=2) + "\n")
    with h5py.File(args.out / "posterior.h5", "w") as f:
        f.attrs["parameters"] = json.dumps(names)
        f.create_dataset("observed", data=observations.values)
        f.create_dataset("sigma", data=observations.sigma)
        f.create_dataset("points", data=observations.points)
        for side, data in sides.items():
            group = f.create_group(side)
            for key, value in data["arrays"].items():
                if np.ndim(value) == 0:  # burn_in: an attribute of the side
                    group.attrs[key] = value
                else:
                    group.create_dataset(key, data=np.asarray(value, dtype=np.float64))
    plot_posterior(observations.values, {side: {"predicted": d["arrays"]["predicted"],
                                                "map": d["arrays"]["map"].reshape(-1), "std": d["std"],
                                                "samples": d["arrays"]["samples"][:, d["arrays"]["burn_in"]:].reshape(
                                                    -1, len(names)) if "samples" in d["arrays"] else None}
                                         for side, d in sides.items()}, names, args.out / "posterior.png")
    print(f"wrote {args.out / 'map.json'}, {args.out / 'posterior.h5'}, {args.out / 'posterior.png'}")
    return 0
