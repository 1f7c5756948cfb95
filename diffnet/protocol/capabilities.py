"""The optional parts of the family protocol: one :class:`typing.Protocol` per capability, with each
member's signature, types and shapes, and the check that a family has what it declares.

A family declares a capability by naming it in ``capabilities``; it then provides that
protocol's members (docs/families.md has a section and a tested example per capability). ``S``
is the number of instances, ``shape`` the instance's (``parameters.shape``), ``grid`` the
family's ``resolution``. :func:`check_capabilities` runs whenever a config names the family:
a member that is missing or of the wrong kind is one line naming it and what was expected.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np
import torch

__all__ = ["PROTOCOLS", "Reference", "Floor", "Classical", "Polish", "InputFields", "Precondition", "LeastSquares", "Domain",
           "Differentiable", "check_capabilities", "describe"]


class Reference(Protocol):
    """``reference``: a classical solve on this grid (``deepfusion reference``); also the evaluation's
    truth unless ``truth`` and ``truth_name`` are overridden (e.g. by a finer solve)."""

    def reference(self, instances: np.ndarray, progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        """Fields (S, *grid), float64, of instances (S, *shape); ``progress(done, total)`` after each."""

    def reference_name(self) -> str:
        """What the reference is, for reports (e.g. ``"Q1 FEM on 61x61 (4x finer)"``)."""

    def truth(self, instances: np.ndarray, progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        """Fields (S, *grid), float64, the evaluation measures against (default: ``reference``)."""

    def truth_name(self) -> str:
        """What the truth is, for reports."""


class Floor(Protocol):
    """``floor``: the best field of the trained loss on this grid (the zero-residual field or the
    energy minimiser), whose error against the truth is the grid's floor."""

    def discrete_optimum(self, instances: np.ndarray, initial: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Fields (S, *grid), float64, and (S,) bool: whether each is a root of the loss's gradient
        (else a least-squares optimum); ``initial`` (S, *grid) a start near the truth."""

    def floor_name(self) -> str:
        """What the floor's field is, for reports."""


class Classical(Protocol):
    """``classical``: the solvers ``deepfusion compare`` and ``uq --classical`` sweep for the cheapest
    configuration of the network's accuracy."""

    #: method -> one line on it, e.g. ``{"fmg": "geometric multigrid, FMG"}``.
    classical_methods: Mapping[str, str]
    #: a method (a key of ``classical_methods``) timed beside the cheapest match on its grid, or None.
    classical_baseline: str | None

    def classical_configurations(self) -> Mapping[str, Sequence[int]]:
        """Method -> its grids (ints, e.g. nodes per side), coarse to fine: the sweep."""

    def classical_solver(self, method: str, grid: int) -> Callable[[np.ndarray], object]:
        """A solve of one instance (a row of shape ``shape``) by ``method`` on ``grid``; what it returns
        (its own grid's field) goes to ``classical_to_grid``. Timed per call."""

    def classical_to_grid(self, method: str, native: object, instances: np.ndarray) -> np.ndarray:
        """The solver's output for the instance ``instances`` (one row) on the network's nodes, (*grid)."""


class Polish(Protocol):
    """``polish``: k classical iterations from the network's output ("DiffNet + k cycles")."""

    #: the name of one iteration, for reports (e.g. ``"V-cycle"``).
    polish_step: str

    def polish(self, instances: np.ndarray, fields: np.ndarray, k: int) -> np.ndarray:
        """Fields (S, *grid) after ``k`` iterations from ``fields`` (S, *grid) for instances (S, *shape)."""


class InputFields(Protocol):
    """``input_fields``: fields that show an instance in plots (e.g. log10 nu)."""

    def input_fields(self, instances: np.ndarray) -> tuple[np.ndarray, list[str]]:
        """Fields (S, C, *grid) and their C labels."""


class Precondition(Protocol):
    """``precondition``: the loss is an energy whose Hessian is a 3^d-point stencil (the earlier declaration of a
    :class:`~diffnet.protocol.loss.Energy`, read by the default :meth:`~diffnet.protocol.family.Family.loss` from the
    members below: the product's coarse correction and sweeps, the preconditioned loss and a second stage then
    apply). A family whose Hessian the torch V-cycle cannot precondition may instead give B g itself as
    ``assembled_correction(u, instances, cycles)`` (the ``target`` form only)."""

    #: members a family may leave out: the engine then reads the Hessian off the loss by C 3^d probes
    #: (:func:`diffnet.multigrid.hessian.hessian_of`), right where the loss couples each node to its 3^d neighbours;
    #: the others it does without.
    OPTIONAL = frozenset({"hessian", "assembled_correction", "fixed_nodes", "admissible"})

    def hessian(self, u: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
        """The Hessian of the summed loss in the field at u (S, *grid) as a (S, 3^d, *grid) stencil; for C
        unknowns, at u (S, C, *grid), a block stencil (S, C, C, 3^d, *grid) (optional: without it the engine
        reads it off the loss by C 3^d probes)."""

    def at_resolution(self, resolution: tuple[int, ...]) -> object:
        """The same family on another grid (the V-cycle's coarse levels)."""

    def assembled_correction(self, u: torch.Tensor, instances: torch.Tensor, cycles: int) -> torch.Tensor:
        """Optional: B g itself, ``cycles`` V-cycles of the family's assembled system on the residual at u (S, *grid),
        where the torch V-cycle of its Hessian does not converge (the immersed families)."""

    def fixed_nodes(self, instances: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Optional: (S, *grid) bool, the nodes the field does not take from the network's output (default: found by
        comparing two fields, :func:`diffnet.multigrid.hessian.fixed_nodes`)."""

    def admissible(self, u: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
        """Optional: (S,) bool, whether each field is one the energy admits (a solid: det F > 0 everywhere); a coarse
        minimiser's line search keeps an admissible field so (default: every field)."""


class LeastSquares(Protocol):
    """``least_squares``: the loss is a sum of squared residuals, one per node (the earlier declaration of a
    :class:`~diffnet.protocol.loss.Residual`, read by the default :meth:`~diffnet.protocol.family.Family.loss` from
    ``residual``: the product's coarse correction by Gauss–Newton and its sweeps on JᵀJ then apply)."""

    def residual(self, u: torch.Tensor, instances: torch.Tensor) -> torch.Tensor:
        """(S, *grid) at the field u (S, *grid); for C unknowns (S, C, *grid) at u (S, C, *grid): the residual at each
        node (zero at the fixed nodes), scaled so that the squares of one sample sum to its summed loss terms; a torch
        function of u with forward-mode derivatives (``torch.autograd.forward_ad``) and local: a node's value reaches the residual
        a few nodes away, not across the grid (measured: :func:`diffnet.multigrid.gauss_newton.reach`)."""


class Domain(Protocol):
    """``domain``: the field lives on a domain cut out of the grid (:mod:`diffnet.instances.geometry`), not on the
    whole box. The engine then reports the field at the domain's nodes only: inference sets every unknown of
    instance k to zero outside instance k's domain (so errors are measured inside; :mod:`diffnet.grid.nodal`),
    field files carry the mask (ParaView shows the inside), plots draw the boundary."""

    def domain(self, instances: np.ndarray) -> np.ndarray:
        """The signed distance to the boundary at the grid's nodes (S, *grid), float64, of instances
        (S, *shape): negative inside, zero on the boundary. One value per instance and node whatever the number
        of unknowns ((S, 1, *grid) is taken as (S, *grid); another shape is refused at configuration)."""


class Derived(Protocol):
    """``derived``: fields derived from the solution the way its FEM reports them (stresses, strains, fluxes), written
    to the field files, plotted and measured in the evaluation as the solution is. A name maps to scalar fields (S,
    *grid) or tensors (S, K, *grid), K components (a symmetric 2-D tensor: xx, yy, xy)."""

    OPTIONAL = frozenset({"truth_derived"})

    def derived(self, instances: np.ndarray, fields: np.ndarray) -> Mapping[str, np.ndarray]:
        """Name -> derived fields of the solutions ``fields`` (S, *grid) or (S, C, *grid) of instances ``instances``."""

    def truth_derived(self, instances: np.ndarray) -> Mapping[str, np.ndarray]:
        """Optional: the same fields of the truth from the reference's own solution (default: ``derived`` of the
        truth's fields)."""


class Quantities(Protocol):
    """``quantities``: scalar quantities of interest per instance (a stress concentration factor, a flux through a
    side), reported by inference, the evaluation and compare with their error against the truth's."""

    OPTIONAL = frozenset({"truth_quantities"})

    def quantities(self, instances: np.ndarray, fields: np.ndarray) -> Mapping[str, np.ndarray]:
        """Name -> (S,) values of the solutions ``fields`` of instances ``instances``."""

    def truth_quantities(self, instances: np.ndarray) -> Mapping[str, np.ndarray]:
        """Optional: the same names' values of the truth from the reference's own solution (its own stress, say;
        default: ``quantities`` of the truth's fields)."""


class Differentiable(Protocol):
    """``differentiable``: the family's ``inputs``, ``field`` and ``loss_terms`` (and ``hessian``, where it writes one)
    are torch functions of the instances, differentiable in them, so that the product's gradient in the instances is exact (no member of its own:
    ``Surrogate.evaluate``, ``deepfusion invert``); a family whose instances reach them through numpy (a cut domain's
    geometry) must not declare it, or its gradients are silently zero there."""


PROTOCOLS: dict[str, type] = {"reference": Reference, "floor": Floor, "classical": Classical, "polish": Polish,
                              "input_fields": InputFields, "precondition": Precondition,
                              "least_squares": LeastSquares, "domain": Domain,
                              "derived": Derived, "quantities": Quantities, "differentiable": Differentiable}


def describe(capability: str) -> str:
    """A capability's one-line description, read off its protocol's docstring (declared once, there): the
    clause after ``name``: up to the first ';', ' (' or sentence end."""
    doc = " ".join((PROTOCOLS[capability].__doc__ or "").split())
    text = doc.split(":", 1)[1].strip() if doc.startswith(f"``{capability}``:") else doc
    for stop in (";", " (", ". "):
        text = text.split(stop, 1)[0]
    return text.rstrip(".")


def _members(protocol: type) -> tuple[dict[str, inspect.Signature], dict[str, object]]:
    """The protocol's methods (name -> signature without self) and attributes (name -> annotation text)."""
    methods = {}
    for name, value in vars(protocol).items():
        if inspect.isfunction(value) and not name.startswith("_"):
            signature = inspect.signature(value)
            methods[name] = signature.replace(parameters=list(signature.parameters.values())[1:])  # no self
    return methods, dict(protocol.__annotations__)


def _takes(function: Callable, signature: inspect.Signature) -> bool:
    """Whether ``function`` accepts the protocol's positional arguments (required and optional)."""
    try:
        actual = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin without a signature: trust it
        return True
    for count in {sum(p.default is p.empty for p in signature.parameters.values()), len(signature.parameters)}:
        try:
            actual.bind(*range(count))
        except TypeError:
            return False
    return True


def _classical_values(family: object) -> str:
    """What is wrong with the values of the classical members ('' when nothing)."""
    methods = family.classical_methods
    if not (isinstance(methods, Mapping) and methods and all(isinstance(k, str) and isinstance(v, str)
                                                              for k, v in methods.items())):
        return f"classical_methods must be a non-empty mapping method -> description (str -> str), got {methods!r:.60}"
    base = family.classical_baseline
    if not (base is None or base in methods):
        return f"classical_baseline must be None or one of classical_methods ({', '.join(methods)}), got {base!r}"
    configurations = family.classical_configurations()
    if not (isinstance(configurations, Mapping) and configurations):
        return (f"classical_configurations() must return a non-empty mapping method -> grids, "
                f"got {type(configurations).__name__}")
    for method, grids in configurations.items():
        if method not in methods:
            return f"classical_configurations(): {method!r} is not one of classical_methods ({', '.join(methods)})"
        if isinstance(grids, (str, bytes)) or not isinstance(grids, Sequence) or not grids or \
                not all(isinstance(g, (int, np.integer)) for g in grids):
            return f"classical_configurations()[{method!r}] must be a non-empty list of int grids, got {grids!r:.60}"
    return ""


def check_capabilities(family: object) -> None:
    """Raise ``TypeError`` (one line) unless ``family`` provides every member of every capability it
    declares, each of the declared kind (a method taking the protocol's arguments, an attribute of
    its type), and its classical members hold values of their types."""
    known = ", ".join(PROTOCOLS)
    for capability in sorted(family.capabilities):
        if capability not in PROTOCOLS:
            raise TypeError(f"{family.name} declares the unknown capability {capability!r} (known: {known})")
        methods, attributes = _members(PROTOCOLS[capability])
        optional = getattr(PROTOCOLS[capability], "OPTIONAL", frozenset())
        for name, signature in methods.items():
            value = getattr(family, name, None)
            if value is None and name in optional:
                continue
            if value is None or not callable(value):
                what = "has no" if value is None else f"has a {type(value).__name__} as"
                raise TypeError(f"{family.name} declares {capability!r} and {what} {name}: expected a method "
                                f"{name}{_text(signature)}")
            if not _takes(value, signature):
                raise TypeError(f"{family.name}.{name}{_text(inspect.signature(value))} does not take the arguments "
                                f"of {name}{_text(signature)} (capability {capability!r})")
        for name, annotation in attributes.items():
            if not hasattr(family, name):
                raise TypeError(f"{family.name} declares {capability!r} and has no {name}: expected an attribute "
                                f"of type {annotation}")
            value = getattr(family, name)
            if callable(value) and not isinstance(value, Mapping):
                raise TypeError(f"{family.name}.{name} is a method: expected an attribute (or property) of type "
                                f"{annotation} (capability {capability!r})")
            if annotation == "str" and not isinstance(value, str):
                raise TypeError(f"{family.name}.{name} must be a str, got {value!r:.60} (capability {capability!r})")
        if capability == "classical":
            wrong = _classical_values(family)
            if wrong:
                raise TypeError(f"{family.name}: {wrong}")


def _text(signature: inspect.Signature) -> str:
    """``(method, grid)``: the parameter names of a signature, without self and annotations."""
    return "(" + ", ".join(name for name in signature.parameters if name != "self") + ")"
