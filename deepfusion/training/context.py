"""Where and how a run trains: the one value every training phase receives instead of a bag of arguments."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from deepfusion.configuration.schema import ParallelConfig
from deepfusion.parallel.halo import DomainSplit, data_group
from deepfusion.training.signals import StopRequest

if TYPE_CHECKING:  # built by the trainer, which imports this module
    from deepfusion.training.recorder import Recorder

__all__ = ["TrainingContext"]


@dataclass(frozen=True)
class TrainingContext:
    """The run's communicator, parallel layout and side channels, fixed for the whole run.

    Parameters
    ----------
    comm : deepfusion.parallel.comm.MPICommunicator or SerialCommunicator
        The whole job; every rank passes its own.
    seed : int
        The run's sample-order seed (``data.seed``).
    threads : int
        OpenMP threads per rank, for the metrics.
    parallel : ParallelConfig
        Gradient sums, CUDA graphs, autocast, parameter checks, collective timeout.
    domain : DomainSplit, optional
        Each sample split over a group of ranks (``parallel.domain``).
    stop : StopRequest
        Set by a signal handler; honoured at the next step boundary.
    run_dir : Path, optional
        Where rank 0 writes ``metrics.jsonl`` and checkpoints (None: nothing written).
    config_text : str
        The resolved configuration each checkpoint carries.
    log : callable
        Rank 0's progress lines.
    recorder : Recorder, optional
        The run's metrics and checkpoints: set by :func:`deepfusion.training.trainer.train` for its phases.
    """

    comm: object
    seed: int = 0
    threads: int = 1
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    domain: DomainSplit | None = None
    stop: StopRequest = field(default_factory=StopRequest)
    run_dir: Path | None = None
    config_text: str = ""
    log: Callable[[str], None] = print
    recorder: Recorder | None = None

    @property
    def data_group(self) -> tuple[int, int]:
        """(this rank's data-parallel group, the number of groups): the rank and the job's size
        without a domain split, the split's groups with one."""
        return data_group(self.comm, self.domain)
