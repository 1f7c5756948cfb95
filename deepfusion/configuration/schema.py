"""The run configuration's schema: one frozen dataclass per TOML section, each key with its type,
default, check and meaning (``docs/configuration.md`` is generated from it)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


from deepfusion.configuration.registry import DEFAULT_FAMILY
from diffnet.protocol.options import all_positive as _positive_all
from diffnet.protocol.options import nonnegative as _nonnegative
from diffnet.protocol.options import one_of as _choice
from diffnet.protocol.options import option
from diffnet.protocol.options import positive as _positive

__all__ = ["ConfigError", "OPTIMIZERS", "RENAMED_KEYS", "first_order", "has_lbfgs", "Config", "ProblemConfig", "DataConfig", "ModelConfig", "TrainConfig",
           "MultigridConfig", "ParallelConfig", "OutputConfig"]


class ConfigError(ValueError):
    """A user-supplied configuration value is unknown, mistyped or impossible."""


# Keys renamed, old -> new (CHANGELOG.md): a config or --set that gives the old name is refused in one line naming the
# new one; a run's own stored config of an earlier version is read under the new names.
RENAMED_KEYS: dict[str, str] = {"model.smoothing": "model.sweeps", "multigrid.cycle": "multigrid.schedule",
                                "train.precondition_cycles": "train.precondition_vcycles"}


# Each ``train.optimizer``: its first-order optimiser (None: none) and whether an L-BFGS phase
# follows. The schema's choices, the checks and the trainer all read this map.
OPTIMIZERS: dict[str, tuple[str | None, bool]] = {
    "adam": ("adam", False),
    "sgd": ("sgd", False),
    "lbfgs": (None, True),
    "adam+lbfgs": ("adam", True),
}


def first_order(optimizer: str) -> str | None:
    """The first-order optimiser of ``train.optimizer`` ("adam", "sgd"), or None for L-BFGS alone."""
    return OPTIMIZERS[optimizer][0]


def has_lbfgs(optimizer: str) -> bool:
    """Whether ``train.optimizer`` ends with (or is) an L-BFGS phase."""
    return OPTIMIZERS[optimizer][1]


def _within(low: int, high: int):
    """The check of a whole number in low..high (both included)."""
    return lambda v: None if low <= v <= high else f"must be in {low}..{high}"


def _nonempty(v: str) -> str | None:
    return None if v.strip() else "must not be empty"


def _resolution(v: tuple[int, ...]) -> str | None:
    if len(v) not in (2, 3) or any(n < 3 for n in v):
        return "must be two (3-D: three) node counts, each >= 3, e.g. [64, 64]"
    if any(n > 16385 for n in v):
        return "must be at most 16385 nodes per side"
    return None


def _channels(v: tuple[int, ...]) -> str | None:
    if not 1 <= len(v) <= 8 or any(c < 1 or c > 4096 for c in v):
        return "must be 1 to 8 widths, each 1..4096"
    return None


def _network(v: str) -> str | None:
    from diffnet.generators.networks import NETWORKS  # the generators' name -> class map (imported on use)

    return None if v in NETWORKS else f"must be one of {sorted(NETWORKS)}"


def _key(check=None, *, default, doc: str):
    """A config key: its default, a check returning an error text or None, and its meaning
    (markdown; ``docs/configuration.md`` is generated from it by :mod:`deepfusion.configuration.configdoc`):
    the same declaration a family's keys use (:func:`diffnet.protocol.options.option`)."""
    return option(default, doc, check)


@dataclass(frozen=True)
class ProblemConfig:
    """``[problem]``: which PDE family, on which grid (the family's own keys are in its table)."""

    family: str = _key(_nonempty, default=DEFAULT_FAMILY,
        doc="the PDE family: a registered name (built-in or installed, see docs/families.md) or "
            "`\"package.module:Class\"`; its keys go in a table of its name")
    resolution: tuple[int, ...] = _key(_resolution, default=(64, 64),
        doc="`[N_t, N_x]` or `[N_y, N_x]` nodes, boundary included; 3-D families `[N_z, N_y, N_x]`")


@dataclass(frozen=True)
class DataConfig:
    """``[data]``: the training and held-out instances."""

    n_train: int = _key(_positive, default=64,
        doc="training instances")
    n_test: int = _key(_positive, default=5,
        doc="held-out random instances (for a family without a fixed held-out set, e.g. `burgers.test_c` empty)")
    sampling: str = _key(_nonempty, default="uniform",
        doc="how the training instances are drawn, one of the family's `samplings`: every family knows `uniform` (equispaced; for m parameters a tensor grid, n_train = k^m), `random` and `sobol` (scrambled); a family may add its own (Burgers: `list`, its fixed `burgers.c_values`)")
    seed: int = _key(_nonnegative, default=0,
        doc="seeds sampling, the per-epoch permutation and the initial weights")


@dataclass(frozen=True)
class ModelConfig:
    """``[model]``: the generator."""

    name: str = _key(_network, default="unet",
        doc="generator")
    channels: tuple[int, ...] = _key(_channels, default=(16, 32, 64, 128),
        doc="widths of the U-Net's scales, finest first (the encoder halves the resolution between them)")
    # Recompute each U-Net level in the backward pass instead of storing its activations.
    checkpoint_activations: bool = _key(default=False,
        doc="recompute each U-Net level in the backward pass instead of storing its activations (less memory, same result; see High resolution)")
    output: str = _key(_choice("nodal", "multilevel"), default="nodal",
        doc="output basis: `nodal` (one head on the finest features) or `multilevel` (one term per decoder "
            "resolution, summed through bilinear prolongation: the same loss, far better conditioned smooth modes)")
    coarse_correction: int = _key(lambda v: None if v == 0 or v >= 3 else "must be 0 (off) or at least 3",
        default=0,
        doc="nodes per side of the coarse grid on which the network's field is corrected exactly (0: off), by the kind of "
            "the family's loss: an energy's minimiser over u~ + range(P) (u~ - P A_c^-1 P^T g(u~) for a quadratic one), "
            "a residual's least-squares minimiser (Gauss-Newton); at most half the intervals of each level's grid; part "
            "of the product in training and every command that runs it; see Physics")
    sweeps: int = _key(_within(0, 128), default=0,
        doc="symmetric Gauss-Seidel sweeps after the coarse correction (needs `model.coarse_correction`): an energy's "
            "with its Hessian, a residual's on J^T J; the high-frequency error the coarse space cannot touch, small in "
            "the field and large in its gradient (stress, flux), removed at a few stencil products a sweep; the "
            "product's step in every command that runs a trained generator (the first stage trains without them, a "
            "second stage through them); see Physics")
    cycles: int = _key(_within(1, 16), default=1,
        doc="times the product repeats its coarse correction and sweeps (a two-grid cycle from the network's field; "
            "more than 1 needs `model.sweeps`): the second correction removes the smooth error the first one's sweeps "
            "leave, where more sweeps would not (Poisson 256^2: 1 cycle of 32 sweeps 2.2x the floor, 3 of 8 sweeps "
            "1.00x); inference only, like the sweeps; see Physics")
    polish: int = _key(_within(0, 100), default=0,
        doc="steps of the family's classical polish (Burgers: Newton steps of its implicit scheme; the Q1 "
            "families: V-cycles; the Neo-Hookean solids: Newton steps, Cholesky in 2-D) that finish the product's "
            "field in every command that runs a trained generator: a hybrid, reported as the run's product; nothing "
            "trains through it (no second stage); Newton on a nonlinear energy has the adjoint gradient of the "
            "minimiser it ends at, the others none (inverse problems take central differences); families with the "
            "`polish` capability; see Physics")


@dataclass(frozen=True)
class TrainConfig:
    """``[train]``: optimiser, schedule and cadence (steps count optimiser steps)."""

    optimizer: str = _key(_choice(*OPTIMIZERS), default="adam",
        doc="`adam`, `sgd` (with `train.momentum`), `lbfgs`, or `adam+lbfgs` (`train.epochs` of Adam, then L-BFGS)")
    lr: float = _key(_positive, default=2e-3,
        doc="peak learning rate")
    lr_schedule: str = _key(_choice("constant", "cosine", "onecycle"), default="onecycle",
        doc="`onecycle` (warm-up then cosine), `cosine` or `constant`")
    warmup: float = _key(lambda v: None if 0 <= v < 1 else "must be in [0, 1)", default=0.05,
        doc="warm-up fraction of the steps (onecycle)")
    momentum: float = _key(lambda v: None if 0 <= v < 1 else "must be in [0, 1)", default=0.9,
        doc="heavy-ball momentum of `sgd`")
    batch_size: int = _key(_positive, default=16,
        doc="global batch")
    epochs: int = _key(_positive, default=100,
        doc="epochs (each uses ⌊n_train / batch⌋ steps)")
    checkpoint_every: int = _key(_nonnegative, default=0,
        doc="steps between checkpoints (0: only the final one)")
    keep_checkpoints: int = _key(_nonnegative, default=3,
        doc="how many of the newest checkpoint files to keep (0: all)")
    log_every: int = _key(_positive, default=10,
        doc="steps between metrics lines")
    dtype: str = _key(_choice("float32", "float64"), default="float32",
        doc="`float32` or `float64`")
    loss: str = _key(_choice("family", "preconditioned"), default="family",
        doc="`family` (the family's own loss, e.g. the Q1 energy) or `preconditioned` (1/2 |B g|^2, the family's "
            "gradient g through B, `train.precondition_vcycles` V-cycles of its Hessian, in float64: an estimate of the "
            "squared relative error; families whose loss is an energy; see Physics)")
    precondition_vcycles: int = _key(_within(1, 10), default=1,
        doc="V-cycles in B (`train.loss = 'preconditioned'`, a second stage's input, the estimated error)")
    precondition_form: str = _key(_choice("target", "loss"), default="target",
        doc="`target` (1/2 |u - sg(u - B g)|^2: gradient B g) or `loss` (1/2 |B g(u)|^2: gradient H B B g)")
    second_stage_epochs: int = _key(_nonnegative, default=0,
        doc="epochs of a second network on the finest grid after the first stage: u = u1 + eps v, v fed the "
            "first stage's preconditioned gradient B g1 / eps, trained on the same loss (0: one stage; families "
            "whose loss is an energy; see Physics)")
    second_stage_lr: float = _key(lambda v: None if 0 < v < 1 else "must be in (0, 1)", default=1e-3,
        doc="peak learning rate of the second stage (its own Adam and schedule)")
    # L-BFGS (optimizer "lbfgs", or "adam+lbfgs": `epochs` of Adam, then L-BFGS).
    lbfgs_mode: str = _key(_choice("full", "multibatch"), default="full",
        doc="`full` (fixed objective, torch's L-BFGS with strong-Wolfe line search) or `multibatch` (overlapping batches)")
    lbfgs_iterations: int = _key(_positive, default=50,
        doc="L-BFGS iterations (one per training step)")
    lbfgs_history: int = _key(_within(1, 1000), default=20,
        doc="curvature pairs kept")
    lbfgs_lr: float = _key(_positive, default=1.0,
        doc="first trial step length")
    lbfgs_batch: int = _key(_nonnegative, default=0,
        doc="samples in the objective: 0 = the whole training set (full) or `train.batch_size` (multibatch)")
    lbfgs_overlap: int = _key(_positive, default=8,
        doc="samples shared by consecutive multi-batches (< half the batch)")
    lbfgs_max_eval: int = _key(_positive, default=20,
        doc="loss evaluations per full-batch iteration (line search)")
    lbfgs_tolerance_grad: float = _key(_nonnegative, default=1e-9,
        doc="L-BFGS stops when the largest gradient entry falls below this")
    lbfgs_tolerance_change: float = _key(_nonnegative, default=1e-12,
        doc="L-BFGS stops when the change of the loss falls below this")
    lbfgs_dtype: str = _key(_choice("train", "float32", "float64"), default="train",
        doc="precision of the L-BFGS phase (parameters, history, line search): `train` (= `train.dtype`), `float32` or `float64`; checkpoints and inference keep `train.dtype`")
    lbfgs_chunk: int = _key(_nonnegative, default=0,
        doc="samples per forward pass on a rank while evaluating the objective (0 = `train.batch_size`)")


@dataclass(frozen=True)
class MultigridConfig:
    """``[multigrid]``: train on a hierarchy of grids, coarse levels first (MGDiffNet).

    ``levels`` lists the nodes per side of every training grid, coarse to fine, the last
    equal to ``problem.resolution`` (empty: one level, the problem's grid). ``schedule`` orders
    the visits: ``half_v`` coarse to fine once; ``v``, ``w``, ``f`` start and end on the
    finest grid as multigrid's cycles do. ``epochs``, ``lr`` and ``batch_size`` give each
    level's epochs per visit, peak learning rate and global batch (empty: ``train.epochs``,
    ``train.lr``, ``train.batch_size`` at every level; unused when ``levels`` is empty). ``transfer``: ``deepen`` adds one
    refinement level at the top of the generator for each finer grid (``top_channels`` wide)
    and keeps the coarser generator on its own grid; ``carry`` trains the same network on
    every grid.
    """

    levels: tuple[int, ...] = _key(lambda v: None if len(v) <= 8 and all(3 <= n <= 16385 for n in v)
                                   and list(v) == sorted(set(v)) else
                                   "must be at most 8 node counts, increasing, each in 3..16385", default=(),
        doc="nodes per side of each training grid, coarse to fine, the last = `problem.resolution` (square or cubic); `[]`: one level")
    schedule: str = _key(_choice("half_v", "v", "w", "f"), default="half_v",
        doc="the order the training visits its levels: `half_v` (coarse to fine), or the shape of a multigrid cycle, "
            "`v`, `w`, `f` (starting and ending on the finest)")
    epochs: tuple[int, ...] = _key(lambda v: None if all(e >= 1 for e in v) else "every value must be >= 1",
                                   default=(),
        doc="epochs per visit of each level (`[]`: `train.epochs`)")
    lr: tuple[float, ...] = _key(_positive_all, default=(),
        doc="peak learning rate of each level (`[]`: `train.lr`), the shape from `train.lr_schedule` per visit")
    batch_size: tuple[int, ...] = _key(lambda v: None if all(b >= 1 for b in v) else "every value must be >= 1",
                                       default=(),
        doc="global batch of each level (`[]`: `train.batch_size`)")
    transfer: str = _key(_choice("deepen", "carry"), default="deepen",
        doc="`deepen`: one refinement level added on top of the generator per finer grid; `carry`: the same network on every grid")
    top_channels: int = _key(_within(1, 4096), default=16,
        doc="width of each added refinement level")
    coarse_loss: str = _key(_choice("rediscretised", "galerkin"), default="rediscretised",
        doc="loss of the coarser levels: `rediscretised` (the problem on the level's own grid) or `galerkin` "
            "(the finest grid's loss of the level's output prolonged there: no coarse discretisation error imprinted)")


@dataclass(frozen=True)
class ParallelConfig:
    """``[parallel]``: threads per rank (0 = the node's cores / ranks on it), device, and
    gradient summation (bucketed Iallreduce overlapped with backward, or one flat
    Allreduce), with a cross-rank parameter check every ``check_every`` steps (0: never)."""

    threads_per_rank: int = _key(_nonnegative, default=0,
        doc="threads per rank; 0 = cores available / ranks on the node")
    cache_gib: float = _key(_nonnegative, default=0.0,
        doc="GiB each rank may keep of its instances' set-up (coarse spaces and factors, cut cells, Hessians, "
            "multigrids; past it the least recently used is built again); 0 = a third of the node's memory / ranks "
            "on the node, at most 12")
    device: str = _key(_choice("cpu", "cuda"), default="cpu",
        doc="`cpu` or `cuda` (one GPU per rank; see GPU)")
    gradsync: str = _key(_choice("bucketed", "flat", "hierarchical"), default="bucketed",
        doc="`bucketed` (Iallreduce per bucket, overlapped with backward), `flat` (one Allreduce) or "
            "`hierarchical` (buckets summed within the node, across nodes by one rank each, broadcast back)")
    grad_dtype: str = _key(_choice("train", "bfloat16"), default="train",
        doc="type of the gradient sum between nodes: `train` (`train.dtype`) or `bfloat16` (half the bytes; CPU)")
    progress_ms: float = _key(_nonnegative, default=1.0,
        doc="with buckets, poke MPI from a background thread this often (ms) while they are in flight, so they move "
            "during backward over a network (0: only from the gradient hooks)")
    collective_timeout_s: float = _key(_nonnegative, default=600.0,
        doc="a collective that takes longer ends the job on every rank it can reach, naming the step (0: never)")
    bucket_mb: float = _key(lambda v: None if 0 < v <= 4096 else "must be in (0, 4096]", default=4.0,
        doc="bucket size in MiB")
    check_every: int = _key(_nonnegative, default=100,
        doc="steps between cross-rank parameter checks (0: never)")
    domain: tuple[int, ...] = _key(lambda v: None if len(v) <= 3 and all(1 <= p <= 4096 for p in v) else
                                   "must be at most 3 tile counts, each 1..4096", default=(),
        doc="split each sample's grid over this many ranks per axis (`[P_y, P_x]`, 3-D `[P_z, P_y, P_x]`; one number: "
            "slabs along the first axis); the other ranks form data-parallel groups of prod(domain) ranks. `[]`: no "
            "split (see Domain parallelism)")
    # CUDA only: how gradient buckets are summed, TF32 matrix products/convolutions,
    # bf16 autocast of the network, and the training step replayed as a CUDA graph.
    gpu_reduce: str = _key(_choice("auto", "nccl", "mpi", "staged"), default="auto",
        doc="CUDA: `nccl`, `mpi` (CUDA-aware MPI), `staged` (pinned host copies) or `auto`")
    tf32: bool = _key(default=False,
        doc="CUDA: TF32 matrix products and convolutions")
    autocast: str = _key(_choice("none", "bf16"), default="none",
        doc="`bf16`: the network under bf16 autocast (the loss stays in `train.dtype`)")
    cuda_graphs: bool = _key(default=False,
        doc="CUDA: capture forward, loss and backward once and replay them (Adam; flat gradient sum)")


@dataclass(frozen=True)
class OutputConfig:
    """``[output]``: where the run directory goes and whether to draw plots."""

    dir: str = _key(_nonempty, default="runs/diffnet",
        doc="run directory (`--out` overrides)")
    plots: bool = _key(default=True,
        doc="write PNG plots")


@dataclass(frozen=True)
class Config:
    """The whole run configuration; every key has a default."""

    problem: ProblemConfig = field(default_factory=ProblemConfig)
    family_keys: object = None  # the family's own keys, the table [<family name>] (its Options; None: its defaults)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    multigrid: MultigridConfig = field(default_factory=MultigridConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    def __post_init__(self) -> None:
        if self.family_keys is None:  # the family's defaults
            from deepfusion.configuration.registry import family_class

            object.__setattr__(self, "family_keys", family_class(self.problem.family).Options())

    def replace(self, **sections: object) -> "Config":
        """A copy with whole sections replaced."""
        return dataclasses.replace(self, **sections)
