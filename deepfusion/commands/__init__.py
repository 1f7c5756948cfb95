"""The ``deepfusion`` subcommands, one module each; :mod:`deepfusion.cli` parses and dispatches."""

from __future__ import annotations

import sys

__all__ = ["warn", "agree", "user_errors"]


def user_errors() -> tuple[type[Exception], ...]:
    """The exception types that mean bad input (one line, exit status 2); imported on use,
    since checkpoints and devices bring in h5py and torch."""
    from deepfusion.analysis.inference import EvaluationError
    from deepfusion.configuration.schema import ConfigError
    from deepfusion.files.checkpoint import CheckpointError
    from deepfusion.files.fields import FieldFileError
    from deepfusion.configuration.inputs import InputError
    from deepfusion.parallel.runtime import DeviceError
    from diffnet.multigrid.minimiser import CoarseNewtonError

    # CoarseNewtonError: a coarse correction's Newton that did not converge for an instance (the family's energy there).
    return InputError, ConfigError, CheckpointError, FieldFileError, DeviceError, EvaluationError, CoarseNewtonError


def warn(line: str) -> None:
    """A warning on standard error, one line."""
    print(f"deepfusion: warning: {line}", file=sys.stderr, flush=True)


def agree(comm, fn):
    """Run ``fn`` on every rank; if it fails with a user error on any rank, fail on all.

    Every rank then raises the same :class:`~deepfusion.configuration.inputs.InputError` (the lowest
    failing rank's message), so the job ends with status 2 everywhere and no rank is left
    waiting.
    """
    from deepfusion.configuration.inputs import InputError

    try:
        result, error = fn(), None
    except user_errors() as exc:
        result, error = None, str(exc)
    errors = [e for e in comm.allgather(error) if e]
    if errors:
        raise InputError(errors[0])
    return result
