"""Declaring configuration keys, once: a family's keys are the fields of its own dataclass made with
:func:`option` (each with a default, a one-line meaning and a check); the engine's sections are
dataclasses of such fields too. :func:`options_class` reads a family's keys off its fields as the
frozen dataclass ``Family.Options`` the configuration parses into, and ``Family.from_options`` hands
them back to the fields; docs/configuration.md is generated from the same fields.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import field
from typing import Any, Callable

__all__ = ["option", "option_fields", "options_class", "one_of", "positive", "nonnegative", "interval",
           "all_positive", "integer_in"]

Check = Callable[[Any], "str | None"]


def option(default: Any, doc: str, check: Check | None = None, *, key: str | None = None):
    """A configuration key: its default, its meaning (markdown, one line) and an optional
    ``check(value) -> error text or None``. The type comes from the field's annotation:
    ``int``, ``float``, ``bool``, ``str`` or ``tuple[T, ...]`` of one of them (a TOML list).
    ``key``: the key's name in the configuration where it is not the field's (Burgers' field ``stencil``
    is the key ``residual``)."""
    return field(default=default, metadata={"check": check, "doc": doc, "key": key})


def option_fields(cls: type) -> dict[str, dataclasses.Field]:
    """The configuration keys a dataclass declares with :func:`option`, key -> its field, in field order."""
    return {f.metadata.get("key") or f.name: f for f in dataclasses.fields(cls) if "doc" in f.metadata}


@functools.cache
def options_class(family: type) -> type:
    """The frozen dataclass of ``family``'s configuration keys (``Family.Options``), read off its fields made
    with :func:`option`: one field per key, with the field's type, default, meaning and check; its docstring
    ``[name]: `` and the first sentence of the family's."""
    hints = typing.get_type_hints(family)
    keys = [(key, hints[f.name], dataclasses.field(default=f.default, metadata=f.metadata))
            for key, f in option_fields(family).items()]
    options = dataclasses.make_dataclass(f"{family.__name__}Options", keys, frozen=True)
    own = family.__dict__.get("__doc__") or ""  # its own docstring, not a base class's
    summary = " ".join(own.split()).split(". ")[0].rstrip(".") or f"the {family.name} family's keys"
    options.__doc__ = f"``[{family.name}]``: {summary}."
    options.__module__ = family.__module__
    options.__qualname__ = f"{family.__qualname__}.Options"
    return options


def one_of(*allowed: str) -> Check:
    def check(v: str) -> str | None:
        return None if v in allowed else f"must be one of {list(allowed)}"

    return check


def positive(v: float) -> str | None:
    return None if v > 0 else "must be > 0"


def nonnegative(v: float) -> str | None:
    return None if v >= 0 else "must be >= 0"


def interval(v: tuple[float, ...]) -> str | None:
    """A range ``[low, high]`` with low < high."""
    if len(v) != 2 or not v[0] < v[1] or not all(math.isfinite(x) for x in v):
        return "must be [low, high] with low < high"
    return None


def all_positive(v: tuple[float, ...]) -> str | None:
    return None if all(x > 0 for x in v) else "every value must be > 0"


def integer_in(low: int, high: int) -> Check:
    def check(v: int) -> str | None:
        return None if low <= v <= high else f"must be in {low}..{high}"

    return check
