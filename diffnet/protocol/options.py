"""Declaring configuration keys: a family's ``Options`` (and the engine's own sections) are frozen
dataclasses whose fields come from :func:`option`, each with a default, a one-line meaning
and a check; docs/configuration.md is generated from them."""

from __future__ import annotations

import math
from dataclasses import field
from typing import Any, Callable

__all__ = ["option", "one_of", "positive", "nonnegative", "interval", "all_positive", "integer_in"]

Check = Callable[[Any], "str | None"]


def option(default: Any, doc: str, check: Check | None = None):
    """A configuration key: its default, its meaning (markdown, one line) and an optional
    ``check(value) -> error text or None``. The type comes from the field's annotation:
    ``int``, ``float``, ``bool``, ``str`` or ``tuple[T, ...]`` of one of them (a TOML list)."""
    return field(default=default, metadata={"check": check, "doc": doc})


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
