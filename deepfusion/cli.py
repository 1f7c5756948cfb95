"""The ``deepfusion`` command line: the parser, the dispatch and the error policy (the commands are in
:mod:`deepfusion.commands`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

__all__ = ["main", "make_parser"]

EXIT_USAGE = 2

DESCRIPTION = """\
Train DiffNet generators (PDE solvers learnt from the PDE's own residual or energy, no
solution data) data-parallel with MPI, and use them: solve new instances, compare with
classical solvers at equal accuracy, compute statistics over many instances, write reference
solutions and cluster job scripts.

Under mpiexec/srun every rank runs the command; `train` uses them all, the others run on
rank 0. Bad input ends with one line on standard error and exit status 2."""

TRAIN_EPILOG = """\
examples:
  deepfusion train configs/burgers.toml --out runs/burgers
  mpiexec -n 4 deepfusion train configs/poisson.toml --set train.epochs=50 --set data.n_train=2048
  deepfusion train configs/burgers.toml --out runs/burgers --set 'multigrid.epochs=[600,600]'   # train longer
  deepfusion train configs/burgers.toml --out runs/b128 --set 'problem.resolution=[128,128]' \
      --set 'multigrid.levels=[64,128]' --init-from runs/burgers          # start from trained weights

A run directory that already holds checkpoints of the same config is resumed from its
newest valid one, with or without --resume (a requeued job runs the same command again),
at any number of ranks; a longer schedule (train.epochs, multigrid.epochs) continues it.
--set takes SECTION.KEY=VALUE in TOML syntax (lists as [32,64], strings quoted or bare)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, status 2, no usage dump
        from deepfusion.configuration.inputs import InputError

        raise InputError(f"{self.prog}: {message}")


def _command(module: str, function: str = "command"):
    """The handler ``deepfusion.commands.<module>.<function>``, imported only when it runs."""

    def handler(args: argparse.Namespace, comm) -> int:
        import importlib

        return getattr(importlib.import_module(f"deepfusion.commands.{module}"), function)(args, comm)

    return handler


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train a DiffNet generator from a TOML config (resumes automatically)",
                       description="Train a DiffNet generator from a TOML config.", epilog=TRAIN_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", type=Path, help="TOML config (see configs/)")
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a config key (repeatable)")
    p.add_argument("--out", type=Path, help="run directory (overrides output.dir)")
    p.add_argument("--resume", action="store_true",
                   help="insist on continuing: fail if the run directory has no checkpoint (resuming is automatic)")
    p.add_argument("--init-from", metavar="RUN_OR_CHECKPOINT",
                   help="start a new run from the weights of another run (its newest checkpoint) or a checkpoint "
                        "file; the model must have the same layers (any resolution)")
    p.set_defaults(func=_command("train"))


def _run_reader(sub, name: str, **kwargs):
    """A subcommand that reads a trained run: its parser, with the run directory as first argument and the
    choice of its checkpoint."""
    p = sub.add_parser(name, **kwargs)
    p.add_argument("run_dir", type=Path, help="run directory written by `deepfusion train`")
    p.add_argument("--checkpoint", help="a specific checkpoint file (default: the run's newest valid one)")
    return p


def _add_law(p: argparse.ArgumentParser, flag: str, role: str, seeded: str) -> None:
    """A command that draws instances (uq's draw, invert's prior): the family's law of them (``role``), and the seed of
    what it draws (``seeded``)."""
    p.add_argument(flag, default="uniform",
                   help=f"{role}: the family's law of the instances, uniform on the training range (every family), or "
                        "one it declares, e.g. normal KL coefficients (default uniform)")
    p.add_argument("--seed", type=int, default=0, help=f"seed of {seeded} (default 0)")


def _add_instances(p: argparse.ArgumentParser) -> None:
    """The instances of a command, under the family's own names (:func:`deepfusion.configuration.inputs.command_line_instances`)."""
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="instances under the family's own names: its parameter's (a number for a scalar one, "
                        "repeatable: --param c=3.5; a .npy of rows for a vector one: --param a=rows.npy), its entries' "
                        "(a number each, repeatable: --param hole_x=0.5 --param hole_y=0.5 --param hole_r=0.1 "
                        "--param nu=0.3), or its field input's (--param nu=fields.npy)")
    p.add_argument("--c", type=float, action="append", help="Burgers' c, where the family's parameter is named c "
                                                           "(--param c=VALUE; repeatable)")
    p.add_argument("--nu", type=Path, help=".npy of nodal input fields (S, N_y, N_x), where the family's field input "
                                           "is named nu (--param nu=FILE.npy)")
    p.add_argument("--coeffs", type=Path, help=argparse.SUPPRESS)  # retired: refused with the family's own names


def _add_infer(sub) -> None:
    p = _run_reader(sub, "infer", help="solve new instances with a trained run, into an HDF5 field file",
                    description="Solve new instances with a trained run: one forward pass per chunk of instances.")
    p.add_argument("--out", type=Path, required=True, help="HDF5 field file to write (.h5; an .xdmf is written beside)")
    _add_instances(p)
    p.add_argument("--polish", type=int, default=0, metavar="K",
                   help="then K iterations of the family's polish step from the network's output (multigrid "
                        "V-cycles for the Q1 families, Newton steps of the conservative Burgers scheme); default 0 = "
                        "the pure network")
    p.add_argument("--domain", default="", metavar="P[,P...]",
                   help="split each field over the job's ranks (under mpiexec): tiles per axis, e.g. 1,2 or 2,2; one "
                        "number for slabs along the first axis. The product must equal the number of ranks; rank 0 "
                        "writes the file")
    p.set_defaults(func=_command("infer"))


def _add_compare(sub) -> None:
    p = _run_reader(sub, "compare", help="DiffNet against the cheapest classical solve of the same accuracy",
                    description="Measure the run's error on held-out instances against the independent reference "
                                "(and the grid's floor), find the cheapest classical solve that is as accurate "
                                "(a refinement search: geometric multigrid FMG for Q1, Godunov of order 1 and 2 for "
                                "Burgers), and time both per instance; report the ratio and the break-even number "
                                "of queries, training included.")
    p.add_argument("--out", type=Path, required=True, help="JSON report (a .md table and .png plot are written beside it)")
    p.add_argument("--samples", type=int, default=4, help="held-out instances (default 4)")
    p.add_argument("--threads", type=int, nargs="+", metavar="T",
                   help="CPU thread counts for the DiffNet rows (default: 1 and all cores)")
    p.add_argument("--batch", type=int, default=8, help="instances per forward pass in the batched timing")
    p.add_argument("--polish", type=int, nargs="*", default=[1], metavar="K",
                   help="also report \"DiffNet + K polish steps\" rows (the product's fields then K steps of the "
                        "family's polish: V-cycles, Newton steps; timed together), each against its own classical "
                        "match (default: 1; none: --polish)")
    p.set_defaults(func=_command("compare"))


def _add_uq(sub) -> None:
    p = _run_reader(sub, "uq", help="mean and standard deviation of the solution over N drawn instances",
                    description="Draw N instances from the family's distribution, solve them with the trained "
                                "network in batches and write the mean and standard-deviation fields (HDF5 + XDMF "
                                "+ PNG, and a JSON summary beside them). With --classical, the same statistics "
                                "from the classical solve of equal accuracy, both sides' times, both against a "
                                "converged Monte Carlo reference on a subset, and the study's break-even point.")
    p.add_argument("--samples", type=int, required=True, help="instances to draw (N)")
    p.add_argument("--out", type=Path, required=True, help="statistics file (.h5)")
    _add_law(p, "--distribution", "the draw", "the draw")
    p.add_argument("--batch", type=int, default=64, help="instances per batch (default 64)")
    p.add_argument("--classical", action="store_true", help="also the classical solver at equal accuracy")
    p.add_argument("--reference-samples", type=int, default=32,
                   help="instances of the converged Monte Carlo check with --classical (default 32)")
    p.set_defaults(func=_command("uq"))


def _add_invert(sub) -> None:
    p = _run_reader(sub, "invert", help="the instance behind observations of the field: MAP, Laplace, MCMC",
                    description="Find the instance that explains observations of the field (a CSV of x,y[,z],output,"
                                "value,sigma) through the trained surrogate with exact gradients: the MAP by "
                                "multi-start L-BFGS, the Laplace posterior and, with --samples, MCMC chains; with "
                                "--classical the same by the family's classical solve with adjoint gradients. "
                                "Writes DIR/map.json, DIR/posterior.h5 and DIR/posterior.png.")
    p.add_argument("--observations", type=Path, required=True, help="CSV of x,y[,z],output,value,sigma (one row each)")
    p.add_argument("--out", type=Path, required=True, help="directory to write")
    _add_law(p, "--prior", "the prior", "the starts and the chains")
    p.add_argument("--starts", type=int, default=8, help="L-BFGS starts drawn from the prior (default 8)")
    p.add_argument("--max-iterations", type=int, default=200, help="L-BFGS iterations at most (default 200)")
    p.add_argument("--samples", type=int, default=0, help="MCMC samples to keep after burn-in (default 0: none)")
    p.add_argument("--chains", type=int, default=16, help="MCMC chains, run together (default 16)")
    p.add_argument("--classical", action="store_true",
                   help="also the same by the family's classical solve with adjoint gradients")
    p.add_argument("--classical-samples", type=int, default=None, metavar="N",
                   help="MCMC samples of the classical side (default: --samples); its chains cost a solve a step, "
                        "so fewer of them time it and check the surrogate's posterior")
    p.set_defaults(func=_command("invert"))


def _add_jobs(sub) -> None:
    p = sub.add_parser("jobs", help="print a job script for a cluster (stampede, azure, aws, local)",
                       description="Print a batch script that trains a config on a cluster; every value is validated.")
    p.add_argument("cluster", choices=["stampede", "azure", "aws", "local"])
    p.add_argument("config", type=Path, help="TOML config the job trains (its output.dir is the run directory)")
    p.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    p.add_argument("--ranks-per-node", type=int, required=True, help="MPI ranks per node")
    p.add_argument("--threads", type=int, required=True, help="threads per rank")
    p.add_argument("--time", default="02:00:00", help="wall-clock limit HH:MM:SS")
    p.add_argument("--partition", help="queue (default: the cluster's first node type)")
    p.add_argument("--account", help="allocation to charge")
    p.add_argument("--node-type", help="node type of --partition when the site names its queues itself")
    p.add_argument("--cores-per-node", type=int, help="cores of one node, when not in the shipped table")
    p.add_argument("--memory-per-node", type=float, metavar="GIB",
                   help="memory of one node in GiB: split each sample over ranks (parallel.domain) when a training "
                        "step would not fit a rank's share of it (estimated from the config; see the user guide)")
    p.set_defaults(func=_command("jobs"))


def _add_reference(sub) -> None:
    p = sub.add_parser("reference", help="the family's classical solutions (Godunov, Q1 FEM, a plugin's solver) of "
                                         "given instances",
                       description="Solve given instances of a family with its own reference solver and write an "
                                   "HDF5 field file (+ XDMF). The family's keys are set with --set, as in a config.")
    p.add_argument("family", help="a registered family (e.g. burgers, poisson, reaction_diffusion, or an installed "
                                  "one) or package.module:Class")
    _add_instances(p)
    p.add_argument("--resolution", type=int, nargs="+", default=[64], metavar="N",
                   help="nodes per axis: N, or one count per axis (default 64)")
    p.add_argument("--set", action="append", default=[], metavar="FAMILY.KEY=VALUE",
                   help="a key of the family's table, e.g. burgers.viscosity=0 (repeatable)")
    p.add_argument("--truth", action="store_true",
                   help="write the independent reference the evaluation measures against (e.g. the FEM on a finer "
                        "grid, a body-fitted FEM, converged Godunov) instead of the family's same-grid solve")
    p.add_argument("--out", type=Path, required=True, help="HDF5 field file to write (.h5)")
    p.set_defaults(func=_command("reference"))


def make_parser() -> argparse.ArgumentParser:
    """The ``deepfusion`` argument parser (its errors raise InputError rather than exit)."""
    parser = _Parser(prog="deepfusion", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add in (_add_train, _add_infer, _add_compare, _add_uq, _add_invert, _add_jobs, _add_reference):
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status.

    Under mpiexec/srun every rank runs this. ``train`` (and ``infer --domain``, which splits
    each field over the ranks) works on all ranks; the other commands run on rank 0 alone. User errors are agreed on collectively and reported
    once (status 2); any other exception on one rank aborts the whole job.
    """
    from deepfusion.commands import user_errors
    from deepfusion.parallel.comm import abort_on_error, world
    from deepfusion.parallel.runtime import use_huge_pages

    use_huge_pages()
    comm = world()
    with abort_on_error(comm):
        try:
            args = make_parser().parse_args(argv)
            everyone = args.command == "train" or (args.command == "infer" and args.domain.strip())
            if not everyone and comm.rank != 0:
                return 0
            return args.func(args, comm)
        except user_errors() as exc:
            if comm.rank == 0:
                print(f"deepfusion: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
