"""The PDE-family protocol: what a parametric family gives the engine, and which optional parts it declares.

A family is a frozen dataclass subclassing :class:`Family`, with a ``resolution`` field
(the output grid's nodes per axis, boundary included) and its own configuration keys as fields made
with :func:`diffnet.protocol.options.option` (``Family.Options`` is read off them). The engine (DeepFusion: training,
multigrid levels, checkpoints, inference, evaluation, ``compare``, ``uq``) talks to a
family only through the members below; the built-in families (Burgers, Poisson,
reaction-diffusion) are written against it exactly as a user's family is
(docs/families.md is the tutorial).

Required: ``name``, ``in_channels``, :meth:`Family.parameters`,
:meth:`Family.coordinates`, :meth:`Family.inputs`, :meth:`Family.field`,
:meth:`Family.loss_terms`; :meth:`Family.check_instances` refuses ill-posed instances (default:
non-finite ones). :meth:`Family.loss` gives the loss as an object, an :class:`~diffnet.protocol.loss.Energy` or a
:class:`~diffnet.protocol.loss.Residual` (default: a plain :class:`~diffnet.protocol.loss.Loss`, or what the earlier
capabilities ``precondition`` and ``least_squares`` declared): what may finish the network's field follows from its
kind. Optional parts are *declared* in ``capabilities`` (a command
that needs one the family lacks says so), each a set of members (typed in
:mod:`diffnet.protocol.capabilities`, and checked by :func:`~diffnet.protocol.capabilities.check_capabilities`):

==============  ===============================================================================
capability      members
==============  ===============================================================================
``reference``   ``reference(instances, progress=None)``, ``reference_name()``: a classical solve on
                this grid (``deepfusion reference``); also the evaluation's truth unless
                ``truth``/``truth_name`` are overridden (e.g. by a finer solve)
``floor``       ``discrete_optimum(instances, initial=None)``, ``floor_name()``: the best field of
                the trained loss on this grid (the zero-residual field or energy minimiser)
``classical``   ``classical_methods``, ``classical_configurations()``,
                ``classical_solver(method, grid)``, ``classical_to_grid(method, field, instances)``,
                ``classical_baseline``: the search of ``deepfusion compare``
``polish``      ``polish(instances, fields, k)``, ``polish_step``: k classical iterations from the
                network's output ("DiffNet + k polish steps")
``input_fields`` ``input_fields(instances)``: fields that show an instance in plots (e.g. log10 nu)
``precondition`` ``hessian(u, instances)``, ``assembled_correction``, ``admissible`` (each optional): the
                earlier way to say the loss is an :class:`~diffnet.protocol.loss.Energy` with these members
``least_squares`` ``residual(u, instances)``: the residual at each node (S, [C,] *grid) whose squares sum to the
                loss (the earlier way to say its loss is a :class:`~diffnet.protocol.loss.Residual`)
``domain``      ``domain(instances)``: the signed distance to the domain's boundary at the nodes (S, *grid),
                one value per node whatever the unknowns; the field lives on a domain cut out of the grid
                (errors measured inside, files masked)
``derived``     ``derived(instances, fields)``: name -> fields derived from the solution (stress, strain, flux:
                (S, *grid) or a symmetric tensor (S, K, *grid)); optional ``truth_derived(instances)``
``quantities``  ``quantities(instances, fields)``: name -> (S,) quantities of interest (K_t); optional
                ``truth_quantities(instances)``
``differentiable`` no member: ``inputs``, ``field`` and ``loss_terms`` are differentiable torch functions of the
                instances (``Surrogate.evaluate``, ``deepfusion invert``: exact gradients in them)
==============  ===============================================================================
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Mapping

import numpy as np
import torch

from diffnet.protocol.capabilities import PROTOCOLS
from diffnet.protocol.loss import Energy, Loss, Residual
from diffnet.protocol.options import option_fields, options_class

__all__ = ["CAPABILITIES", "Family", "ParameterSpec", "check_vectors", "retired_members", "sample_box"]

CAPABILITIES = tuple(PROTOCOLS)


@dataclass(frozen=True)
class ParameterSpec:
    """What one instance of a family is.

    Attributes
    ----------
    name : str
        The field-file dataset that holds the instances (e.g. ``"c"``, ``"a"``).
    shape : tuple[int, ...]
        One instance's shape: ``()`` for a scalar, ``(m,)`` for a vector.
    low, high : float or tuple of float
        The training range: one value for every entry, or one per entry (in C order, as many as
        the shape has entries), e.g. ``low=(-1.0, 0.0), high=(1.0, 2.0)``.
    positive : bool
        Values must be > 0 (shorthand for a lower limit of 0 on every entry).
    limits : tuple
        ``(lower, upper)``: the physics' limits, an open interval each entry must lie strictly inside (one value for
        every entry, or one per entry in C order; default none, only finiteness), e.g. a Poisson ratio's
        ``(-1.0, 0.5)``. Declared once, here: the configuration refuses a training range that leaves them, and
        every path an instance comes in by (the training set, ``infer``'s numbers, files and ``--param``,
        :class:`Surrogate`, ``reference``, ``uq``) refuses an instance outside them in one line, through
        :meth:`Family.check_instances`; an instance inside them but outside the training range is only warned of.
    field : str or None
        The name of an alternative input, a positive nodal field on the grid per
        instance (``"nu"`` for the diffusivity families), or None.
    distributions : tuple[str, ...]
        Laws :meth:`Family.draw` knows (``deepfusion uq --distribution``).
    description : str
        What the parameter is, for messages.
    names : tuple[str, ...]
        Names of the entries (C order), for messages and plots, e.g. ``("p1", "p2")``; or none.
    """

    name: str
    shape: tuple[int, ...]
    low: float | tuple[float, ...]
    high: float | tuple[float, ...]
    positive: bool = False
    field: str | None = None
    distributions: tuple[str, ...] = ("uniform",)
    description: str = ""
    names: tuple[str, ...] = ()
    limits: tuple = (-np.inf, np.inf)

    def __post_init__(self) -> None:
        # Lists and arrays become tuples (the spec stays hashable and comparable).
        for key in ("low", "high"):
            value = getattr(self, key)
            if not np.isscalar(value):
                object.__setattr__(self, key, tuple(float(v) for v in np.ravel(value)))
        if len(self.limits) != 2:
            raise ValueError(f"ParameterSpec {self.name!r}: limits must be (lower, upper), got {self.limits!r}")
        object.__setattr__(self, "limits", tuple(float(v) if np.isscalar(v) else tuple(float(x) for x in np.ravel(v))
                                                 for v in self.limits))
        object.__setattr__(self, "shape", tuple(self.shape))
        object.__setattr__(self, "names", tuple(self.names))
        m = int(np.prod(self.shape))
        for key, value in (("low", self.low), ("high", self.high), ("limits' lower", self.limits[0]),
                           ("limits' upper", self.limits[1])):
            if isinstance(value, tuple) and len(value) != m:
                raise ValueError(f"ParameterSpec {self.name!r}: {key} has {len(value)} entries, the shape "
                                 f"{self.shape} has {m}")
        if self.names and len(self.names) != m:
            raise ValueError(f"ParameterSpec {self.name!r}: {len(self.names)} names for {m} entries")
        low, high = self.bounds()
        if not (np.isfinite(low).all() and np.isfinite(high).all() and (low < high).all()):
            raise ValueError(f"ParameterSpec {self.name!r}: every entry needs finite low < high, got {self.range_text()}")
        lower, upper = self.physical()
        leaves = ~((lower < low) & (high < upper))
        if leaves.any():
            i = tuple(int(k) for k in np.argwhere(leaves)[0])
            raise ValueError(f"{self.entry(i)}: the training range [{low[i]:g}, {high[i]:g}] leaves the physics' "
                             f"limits ({self.limit_text(i)})")

    @property
    def per_entry(self) -> bool:
        """Whether the entries have ranges of their own."""
        return isinstance(self.low, tuple) or isinstance(self.high, tuple)

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """The training range per entry: (low, high), each of the instance's ``shape`` (float64)."""
        return tuple(np.broadcast_to(np.asarray(v, dtype=np.float64).reshape(-1 if isinstance(v, tuple) else ()),
                                     (int(np.prod(self.shape)),)).reshape(self.shape).copy()
                     for v in (self.low, self.high))

    def physical(self) -> tuple[np.ndarray, np.ndarray]:
        """The physics' limits per entry (open): (lower, upper), each of the instance's ``shape`` (float64), with
        ``positive``'s lower limit of 0."""
        lower, upper = (np.broadcast_to(np.asarray(v, dtype=np.float64).reshape(-1 if isinstance(v, tuple) else ()),
                                        (int(np.prod(self.shape)),)).reshape(self.shape).copy() for v in self.limits)
        return (np.maximum(lower, 0.0) if self.positive else lower), upper

    def limit_text(self, index: tuple[int, ...] = ()) -> str:
        """The physics' limits of one entry as a condition: ``-1 < nu < 0.5``, ``c > 0``, ``a[0] finite``."""
        lower, upper = (float(v[index]) for v in self.physical())
        name = self.names[int(np.ravel_multi_index(index, self.shape))] if self.names and self.shape else \
            self.entry(index)
        if np.isfinite(lower) and np.isfinite(upper):
            return f"{lower:g} < {name} < {upper:g}"
        if np.isfinite(lower) or np.isfinite(upper):
            return f"{name} > {lower:g}" if np.isfinite(lower) else f"{name} < {upper:g}"
        return f"{name} finite"

    def entry(self, index: tuple[int, ...]) -> str:
        """How messages name one entry: ``a[1] (p2)``, ``a[1]``, or the name of a scalar."""
        if not self.shape:
            return self.name
        flat = int(np.ravel_multi_index(index, self.shape))
        label = f"{self.name}[{', '.join(map(str, index))}]"
        return f"{label} ({self.names[flat]})" if self.names else label

    def range_text(self) -> str:
        """``[3, 6]``, or per entry ``a[0] (p1) in [-1, 1], a[1] (p2) in [0, 2]``."""
        if not self.per_entry:
            return f"[{self.low:g}, {self.high:g}]"
        low, high = self.bounds()
        return ", ".join(f"{self.entry(i)} in [{low[i]:g}, {high[i]:g}]" for i in np.ndindex(*self.shape))

    def outside(self, instances: np.ndarray) -> np.ndarray:
        """Per instance of ``instances`` (S, *shape): whether any entry lies outside its training range."""
        low, high = self.bounds()
        mask = (instances < low) | (instances > high)
        return mask.reshape(len(instances), -1).any(axis=1)


def check_vectors(unknowns: tuple[str, ...], vectors: Mapping[str, tuple[str, ...]], dims: int) -> None:
    """Raise ``ValueError`` unless each of ``vectors`` names ``dims`` components among ``unknowns`` under a name
    of its own (:attr:`Family.vectors`)."""
    for name, parts in vectors.items():
        if name in unknowns or len(parts) != dims or any(p not in unknowns for p in parts):
            raise ValueError(f"vectors: {name!r} needs {dims} components among the unknowns {list(unknowns)} "
                             f"under another name, got {list(parts)}")


def sample_box(low, high, shape: tuple[int, ...], n: int, sampling: str, seed: int) -> np.ndarray:
    """n instances with every entry in [low, high], shape (n, *shape); ``low`` and ``high`` one value
    for every entry or one per entry (arrays of ``shape``, or flat in C order).

    ``uniform``: equispaced values including both ends (for m entries the tensor grid with
    k values each, which needs n = k^m); ``random``: i.i.d. uniform draws from
    ``numpy.random.default_rng(seed)``; ``sobol``: a scrambled Sobol sequence.
    """
    m = int(np.prod(shape)) if shape else 1
    if not (np.isscalar(low) and np.isscalar(high)):  # per entry: flat (m,), broadcast along the samples
        low = np.broadcast_to(np.asarray(low, dtype=np.float64).ravel(), (m,))
        high = np.broadcast_to(np.asarray(high, dtype=np.float64).ravel(), (m,))
    if sampling == "random":
        if np.isscalar(low):
            return np.random.default_rng(seed).uniform(low, high, size=(n, *shape))
        return np.random.default_rng(seed).uniform(low, high, size=(n, m)).reshape(n, *shape)
    if sampling == "sobol":
        from scipy.stats import qmc

        return (low + (high - low) * qmc.Sobol(d=m, scramble=True, seed=seed).random(n)).reshape(n, *shape)
    if sampling == "uniform":
        k = round(n ** (1.0 / m))
        if k**m != n:
            raise ValueError(f"uniform sampling of {m} parameters is a tensor grid and needs n = k^{m} samples, "
                             f"got {n}; use sampling = 'sobol' or 'random'")
        lows, highs = np.broadcast_to(low, (m,)), np.broadcast_to(high, (m,))
        axes = [np.linspace(a, b, k) if k > 1 else np.array([(a + b) / 2.0]) for a, b in zip(lows, highs)]
        return np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(n, *shape)
    raise ValueError(f"sampling {sampling!r} is not available for this family (uniform, random, sobol)")


def retired_members(family: type) -> list[tuple[str, str, str]]:
    """(class, member, what replaced it) for each member a class of ``family``'s MRO defines that the engine no
    longer reads: the ``retired`` tables of its bases name them (e.g. a cut-domain family's ``_nu``, read by an
    earlier version, now ``coefficient(instances)``). Such a member would be ignored without a word."""
    table: dict[str, str] = {}
    for klass in family.__mro__:
        table.update({k: v for k, v in vars(klass).get("retired", {}).items() if k not in table})
    return [(klass.__name__, name, table[name]) for klass in family.__mro__ for name in vars(klass) if name in table]


class _DeclaredKeys:
    """``Family.Options``: the frozen dataclass of a family's configuration keys, read off the family's own fields
    made with :func:`~diffnet.protocol.options.option` (:func:`~diffnet.protocol.options.options_class`); a family
    that assigns its own ``Options`` class (the layout of an earlier version) keeps it."""

    def __get__(self, instance: object, owner: type) -> type:
        return options_class(owner)


class Family:
    """Base of every PDE family; see the module docstring for the protocol.

    Class attributes
    ----------------
    name : str
        The family's name: the registry's key for built-in and entry-point families, and
        the name of its configuration table (``[name]``).
    Options : type
        Frozen dataclass of the family's own configuration keys, read off the family's fields made with
        :func:`diffnet.protocol.options.option` (declared once, there; ``key=`` where a key's name is not its field's).
    in_channels : int
        Channels of the network input :meth:`inputs` builds.
    dims : int
        Spatial dimensions of the grid (2: fields (N_y, N_x) or space-time (N_t, N_x); 3: (N_z, N_y, N_x)):
        ``problem.resolution`` has this many entries and the generator is built in this many dimensions.
    unknowns : tuple[str, ...]
        The unknown fields' names, one network output channel each (default ``("u",)``). With one,
        :meth:`field` returns (S, *resolution); with several, (S, len(unknowns), *resolution) in this order.
    vectors : Mapping[str, tuple[str, ...]]
        Unknowns that form a vector, by name: its components among ``unknowns``, x first (e.g.
        ``{"u": ("u_x", "u_y")}`` for a displacement): written as one vector attribute for ParaView and
        drawn as its magnitude beside the components; a 2-D one also as the deformed shape.
    velocities : tuple[str, ...]
        The ``vectors`` that are velocities (default none): drawn as streamlines over the vorticity (the family's
        derived ``vorticity`` where it has one, else over the speed) instead of as a deformed shape.
    capabilities : frozenset[str]
        The optional parts the family provides (a subset of :data:`CAPABILITIES`).
    samplings : tuple[str, ...]
        The ``data.sampling`` values :meth:`sample` knows.
    unique_optimum : bool
        Whether ``discrete_optimum`` (the ``floor`` capability) gives the same field from any ``initial``, which then
        changes its cost only (an energy's unique minimiser: default True). An inverse problem's classical solves
        then start from the nearest instance already solved (:class:`deepfusion.analysis.inverse.WarmStarts`).
        Burgers' central stencils have several roots, and ``initial`` picks one: False.
    """

    name: ClassVar[str]
    Options: ClassVar[type] = _DeclaredKeys()
    in_channels: ClassVar[int]
    dims: ClassVar[int] = 2
    unknowns: ClassVar[tuple[str, ...]] = ("u",)
    vectors: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    velocities: ClassVar[tuple[str, ...]] = ()
    capabilities: ClassVar[frozenset[str]] = frozenset()
    # A family's own key against a network's smooth error where it has no Hessian for the coarse correction
    # or the preconditioned loss (named in their refusals), e.g. "burgers.preconditioner".
    smooth_error_lever: ClassVar[str] = ""
    samplings: ClassVar[tuple[str, ...]] = ("uniform", "random", "sobol")  # data.sampling values :meth:`sample` knows
    unique_optimum: ClassVar[bool] = True
    # Members a family defined under an earlier version of a base class, by name -> what replaced them
    # (:func:`retired_members`; the configuration refuses a family that still defines one).
    retired: ClassVar[Mapping[str, str]] = {}
    resolution: tuple[int, ...]

    # -- construction from the configuration -------------------------------------------
    @classmethod
    def from_options(cls, options: object, resolution: tuple[int, ...]) -> "Family":
        """The family on ``resolution`` with the keys of its table: each key goes to the field that declares it
        (:func:`~diffnet.protocol.options.option`, ``key=`` where the names differ); a family that declares its
        own ``Options`` class gets them under the same names."""
        field_of = {key: f.name for key, f in option_fields(cls).items()}
        return cls(resolution=tuple(resolution), **{field_of.get(f.name, f.name): getattr(options, f.name)
                                                    for f in dataclasses.fields(options)})

    @classmethod
    def check_options(cls, options: object, *, n_train: int, sampling: str, resolution: tuple[int, ...]) -> None:
        """Constraints among the family's keys, the data section and the grid (``problem.resolution``):
        raise ``ValueError("key: what is wrong")``. Each key's own check runs before this; a ValueError
        from ``from_options`` or ``inputs`` (on one instance) at configuration time is reported the same
        way: one line, exit status 2, nothing written."""

    def at_resolution(self, resolution: tuple[int, ...]) -> "Family":
        """The same family on another grid (the multigrid levels)."""
        return dataclasses.replace(self, resolution=tuple(resolution))

    def describe(self) -> str:
        """One line on the instance family for the training banner."""
        return ""

    # -- instances --------------------------------------------------------------------
    @property
    def parameters(self) -> ParameterSpec:
        """What one instance is (:class:`ParameterSpec`)."""
        raise NotImplementedError

    def sample(self, n: int, sampling: str, seed: int) -> np.ndarray:
        """``n`` training instances, shape (n, *parameters.shape) (default: :func:`sample_box`)."""
        spec = self.parameters
        return sample_box(spec.low, spec.high, spec.shape, n, sampling, seed)

    def fixed_heldout(self) -> np.ndarray | None:
        """The family's own held-out instances, or None for random draws from a separate stream."""
        return None

    def draw(self, n: int, distribution: str, seed: int) -> np.ndarray:
        """``n`` instances from one of ``parameters.distributions`` (default: uniform on the range, per entry)."""
        spec = self.parameters
        if distribution != "uniform":
            raise ValueError(f"distribution {distribution!r} is not one of {list(spec.distributions)}")
        if not spec.per_entry:
            return np.random.default_rng(seed).uniform(spec.low, spec.high, (n, *spec.shape))
        low, high = spec.bounds()
        return np.random.default_rng(seed).uniform(low, high, (n, *spec.shape))

    def check_instances(self, instances: np.ndarray) -> None:
        """Raise ``ValueError`` naming the first invalid instance of ``instances`` (S, *parameters.shape) by
        its index (``instance 3: ...``), one line. Default: every entry finite and inside the physics' limits
        (:attr:`ParameterSpec.limits`, and > 0 where the spec is ``positive``). Override it (calling this one)
        where an instance can be ill-posed in a way the limits of each entry alone do not say, e.g. a hole that
        leaves the plate; ``infer``, ``Surrogate``, ``uq``, ``reference`` and training then refuse such
        instances in one line (exit status 2)."""
        spec = self.parameters
        rows = np.asarray(instances, dtype=np.float64).reshape(len(instances), -1)
        lower, upper = (v.reshape(-1) for v in spec.physical())
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(rows) | (rows <= lower) | (rows >= upper)
        if bad.any():
            i, j = np.argwhere(bad)[0]
            index = tuple(int(k) for k in np.unravel_index(j, spec.shape))
            where = spec.entry(index) if spec.shape else spec.name
            if not np.isfinite(rows[i, j]) or spec.limits == (-np.inf, np.inf):  # finiteness, or `positive` alone
                need = "finite and > 0" if spec.positive else "finite"
                raise ValueError(f"instance {i}: {where} = {rows[i, j]:g}; every entry must be {need}")
            raise ValueError(f"instance {i}: {where} = {rows[i, j]:g}; the physics needs {spec.limit_text(index)}")

    def has(self, capability: str) -> bool:
        return capability in self.capabilities

    def clear_caches(self) -> None:
        """Drop what the family keeps per instance (set-up built once because training revisits every
        instance: a cut domain's quadrature, an assembled multigrid). ``compare`` and ``uq`` call it before
        every timed solve, so that each side, network or classical, pays its own set-up. Default: nothing kept."""

    # -- the field and the loss -------------------------------------------------------
    def coordinates(self) -> dict[str, np.ndarray]:
        """Nodal coordinates per axis, in the fields' axis order (float64)."""
        raise NotImplementedError

    def inputs(self, instances: torch.Tensor) -> torch.Tensor:
        """Network input (S, in_channels, *resolution) of instances (S, *shape) or fields."""
        raise NotImplementedError

    def field(self, raw: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
        """The field (S, *resolution) of the network's output (S, 1, *resolution), boundary conditions imposed;
        for several :attr:`unknowns`, (S, C, *resolution) of the output (S, C, *resolution)."""
        raise NotImplementedError

    def loss_terms(self, u: torch.Tensor, instances: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-sample loss terms, each (S,); the training loss is their sum."""
        raise NotImplementedError

    def loss(self) -> Loss:
        """The loss as an object (:mod:`diffnet.protocol.loss`): an :class:`~diffnet.protocol.loss.Energy` (its Hessian a
        3^d-point stencil) or a :class:`~diffnet.protocol.loss.Residual` (one residual per node), whose kind decides
        what may finish the network's field (coarse correction, sweeps, the preconditioned loss); a plain
        :class:`~diffnet.protocol.loss.Loss` of ``loss_terms`` when neither is declared.

        Default: read off the members an earlier version declared by capability, so such a family keeps its
        steps: ``precondition`` an Energy of its ``hessian``, ``assembled_correction`` and ``admissible`` (each where
        it has one), ``least_squares`` a Residual of its ``residual`` (``precondition`` first where both are)."""
        if self.has("precondition"):
            return Energy(self.loss_terms, hessian=getattr(self, "hessian", None),
                          assembled_correction=getattr(self, "assembled_correction", None),
                          admissible=getattr(self, "admissible", None))
        if self.has("least_squares"):
            return Residual(self.loss_terms, residual=self.residual)
        return Loss(self.loss_terms)

    def output_loss_terms(self, raw: torch.Tensor, instances: torch.Tensor) -> dict[str, torch.Tensor]:
        """The per-sample loss terms of the network's output ``raw`` (S, C, *resolution), as a training step takes them:
        ``loss_terms(field(raw, instances), instances)``. A wrapper whose loss reads the network's own field beside the
        one it makes of it (the coarse correction's pull) defines its own; a family has no reason to."""
        return self.loss_terms(self.field(raw, instances), instances)

    def tile_loss_terms(self, raw: torch.Tensor, instances: torch.Tensor, tiling: object) -> dict[str, torch.Tensor]:
        """The whole grid's per-sample loss terms from one tile ``raw`` (S, 1, *tile) of the network's
        output under a domain split (a :class:`diffnet.generators.tiling.Tiling`); every tile gets the same values.

        The default is exact for any family: the tiles' outputs gathered (one field per sample, a
        small part of a generator's memory), then :meth:`field` and :meth:`loss_terms` on the whole
        grid, on every tile. A family whose loss is a sum over elements overrides it to work on its
        tile with a halo (the Q1 energies do).
        """
        return self.loss_terms(self.field(tiling.gather(raw), instances), instances)

    # -- defaults of optional members (the Hessian's, by probing, lives with the multigrid that needs it:
    # diffnet.multigrid.hessian.hessian_of) -------------------------------------------------------------
    def truth(self, instances: np.ndarray, progress=None) -> np.ndarray:
        """The independent reference on this grid's nodes (default: :meth:`reference`)."""
        return self.reference(instances, progress)

    def truth_name(self) -> str:
        return self.reference_name()

