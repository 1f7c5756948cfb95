"""Families that wrap a family, with what each passes on declared: the preconditioned loss, the coarse-corrected field,
the second stage's, the Galerkin coarse loss.

A wrapper is a :class:`~diffnet.protocol.family.Family` to the engine. Each member of the protocol
(:func:`protocol_members`: the base class's and every capability's) is, for each wrapper, one of three things, decided
in its class: *passed on* (named in ``passed_on``: the wrapped family's member, unchanged), *withheld* (named in
``withheld``: an ``AttributeError`` naming the wrapper, as for a family that lacks an optional member), or *defined*
by the wrapper itself (``output_loss_terms`` is decided once, here, for every wrapper: of its own field and loss).
Nothing is forwarded that was not named: a member added to the protocol later is undecided for
every wrapper until someone decides (``tests/methods/test_wrappers.py`` lists it), instead of silently returning the
wrapped family's answer.
"""

from __future__ import annotations

from typing import ClassVar

from diffnet.protocol.capabilities import PROTOCOLS
from diffnet.protocol.family import Family

__all__ = ["INSTANCE_MEMBERS", "Wrapper", "protocol_members"]

#: What a family says about its instances, its grid and their classical solutions, which no wrapper of its field or
#: its loss changes: a wrapper that keeps the family's instances passes these on (named here, not computed, so that a
#: member added to the protocol is decided, not inherited).
INSTANCE_MEMBERS = frozenset({
    "name", "Options", "from_options", "check_options", "describe", "retired", "dims", "resolution", "unknowns",
    "vectors", "velocities", "capabilities", "has", "samplings", "unique_optimum", "smooth_error_lever",
    "parameters", "sample", "fixed_heldout", "draw", "check_instances", "coordinates",
    "reference", "reference_name", "truth", "truth_name", "discrete_optimum", "floor_name",
    "classical_methods", "classical_baseline", "classical_configurations", "classical_solver", "classical_to_grid",
    "polish", "polish_step", "input_fields", "domain", "derived", "truth_derived", "quantities", "truth_quantities",
})


def protocol_members() -> frozenset[str]:
    """Every member the engine may read from a family: :class:`Family`'s public ones and each capability's
    (:data:`~diffnet.protocol.capabilities.PROTOCOLS`), optional ones included."""
    names: set[str] = set()
    for klass in (Family, *PROTOCOLS.values()):
        names |= {name for name in vars(klass) if not name.startswith("_") and name != "OPTIONAL"}
        names |= set(vars(klass).get("__annotations__", {}))
    return frozenset(names)


class _PassedOn:
    """The wrapped family's member of the same name (a non-data descriptor: read on every access)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: object, owner: type) -> object:
        if instance is None:
            return self
        return getattr(getattr(instance, owner.wraps), self.name)


class _Withheld:
    """A member the wrapper does not have: ``AttributeError``, so ``getattr(w, name, None)`` is None."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: object, owner: type) -> object:
        raise AttributeError(f"{owner.__name__} has no {self.name!r} (withheld: see its class)")


class Wrapper(Family):
    """Base of the families that wrap one: ``wraps`` names the dataclass field holding the wrapped family,
    ``passed_on`` and ``withheld`` the members it passes on and withholds; the wrapper defines every other member of
    :func:`protocol_members` itself."""

    wraps: ClassVar[str]
    passed_on: ClassVar[frozenset[str]] = frozenset()
    withheld: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        both = cls.passed_on & cls.withheld
        defined = {name for name in vars(cls) if name in cls.passed_on | cls.withheld}
        if both or defined:
            raise TypeError(f"{cls.__name__}: {', '.join(sorted(both | defined))} decided twice "
                            f"(passed on, withheld or defined: one of them)")
        for name in cls.passed_on:
            descriptor = _PassedOn()
            descriptor.__set_name__(cls, name)
            setattr(cls, name, descriptor)
        for name in cls.withheld:
            descriptor = _Withheld()
            descriptor.__set_name__(cls, name)
            setattr(cls, name, descriptor)

    def output_loss_terms(self, raw: "torch.Tensor", instances: "torch.Tensor") -> dict:
        """The wrapper's own loss terms of its own field of the network's output (decided here for every wrapper: the
        wrapped family's would read another field; one whose loss reads the network's own field beside it, the coarse
        correction's pull, defines its own)."""
        return self.loss_terms(self.field(raw, instances), instances)
