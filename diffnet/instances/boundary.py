"""Boundary conditions per side of the unit square or cube: a Dirichlet value or a Neumann flux on each.

A side is named by its axis and end: ``x0`` is the side x = 0, ``x1`` x = 1, likewise ``y0``, ``y1``
and, in 3-D, ``z0``, ``z1``. Its condition is written ``"u=VALUE"`` (Dirichlet: the field's value) or
``"flux=VALUE"`` (Neumann: the outward flux ν ∂u/∂n; ``"flux=0"`` insulates). The Q1 families take
them as keys of their table, e.g. ``[poisson] x0 = "u=1"``.

What a family needs of them: the Dirichlet nodes and values (imposed exactly, by the field's
construction and in the assembled system; where two Dirichlet sides meet, the corner takes the value
of the side whose axis comes first in x, y, z), a smooth lift of those values for the network's field,
and the load of the fluxes, ∫_side q N_a dS per node, exact for the multilinear N_a (the trapezoid
weights of the side's grid).
"""

from __future__ import annotations

import re
import dataclasses
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import torch

__all__ = ["SIDES", "SideFields", "SIDE_DOC", "VECTOR_SIDE_DOC", "Side", "parse_side", "side_check", "parse_vector_side",
           "vector_side_check", "PIN_DOC", "parse_pin", "pin_check", "BoxBoundary", "component_boundaries"]

SIDES = ("x0", "x1", "y0", "y1", "z0", "z1")
SIDE_DOC = "the side {}: \"u=VALUE\" (Dirichlet) or \"flux=VALUE\" (outward flux ν ∂u/∂n)"
_FORM = re.compile(r"^\s*(u|flux)\s*=\s*([-+0-9.eE]+)\s*$")
VECTOR_SIDE_DOC = ("the side {}: \"u=VALUE\" or \"u=V_X,V_Y[,V_Z]\" (held displacement; a component \"free\": "
                   "a roller), \"traction=T_X,T_Y[,T_Z]\" (surface load), \"free\"")
_VECTOR_FORM = re.compile(r"^\s*(u|traction)\s*=\s*(.+)$")


class SideFields:
    """Mixed into a family on the unit box whose conditions are its fields x0, x1, y0, y1[, z0, z1] (each a key of
    its own, made with :func:`~diffnet.protocol.options.option`)."""

    @property
    def sides(self) -> tuple[str, ...]:
        """The box's conditions in the order of :data:`SIDES`, as many as the grid has sides."""
        return tuple(getattr(self, k) for k in SIDES[: 2 * self.dims])

    def sides_text(self) -> str:
        """The conditions as a run's banner shows them: ``x0:u=0 x1:traction=0,-1 ...``."""
        return " ".join(f"{k}:{v}" for k, v in zip(SIDES, self.sides))

    def default_sides(self) -> tuple[str, ...]:
        """The conditions the family has when a configuration names none: its side fields' defaults."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        return tuple(defaults[k] for k in SIDES[: 2 * self.dims])


@dataclass(frozen=True)
class Side:
    """One side's condition: ``kind`` "u" (Dirichlet value) or "flux" (outward flux), and its ``value``."""

    kind: str
    value: float

    def __str__(self) -> str:
        return f"{self.kind}={self.value:g}"


def parse_side(text: str) -> Side:
    """``"u=1"`` or ``"flux=-0.5"`` as a :class:`Side`; ValueError naming the form otherwise."""
    match = _FORM.match(str(text))
    if match is None:
        raise ValueError(f"{text!r} is not a side condition; write \"u=VALUE\" or \"flux=VALUE\"")
    try:
        value = float(match.group(2))
    except ValueError:
        raise ValueError(f"{text!r}: {match.group(2)!r} is not a number") from None
    if not np.isfinite(value):
        raise ValueError(f"{text!r}: the value must be finite")
    return Side(match.group(1), value)


def side_check(text: str) -> str | None:
    """An :func:`diffnet.protocol.options.option` check for a side key."""
    try:
        parse_side(text)
    except ValueError as error:
        return str(error)
    return None


def parse_vector_side(text: str, dims: int) -> tuple[Side, ...]:
    """A side's condition on a ``dims``-component vector field, one scalar :class:`Side` per component (x first).

    ``"u=0"`` holds every component at 0, ``"u=0,0.1"`` each at its own value (a clamp, a prescribed
    displacement), ``"u=0,free"`` the first component only (a roller: u_x = 0, u_y free); ``"traction=0,-1"`` loads the side with the surface force t (per component the outward
    flux of that component's equation, as the scalar families' ``"flux=VALUE"``); ``"free"`` is a zero traction.
    """
    if str(text).strip() == "free":
        return (Side("flux", 0.0),) * dims
    match = _VECTOR_FORM.match(str(text))
    if match is None:
        raise ValueError(f"{text!r} is not a side condition; write \"u=VALUE\", \"u=V_X,V_Y\", "
                         f"\"traction=T_X,T_Y\" or \"free\"")
    parts = match.group(2).split(",")
    if len(parts) not in ({1, dims} if match.group(1) == "u" else {dims}):
        raise ValueError(f"{text!r}: give {dims} components (x first)" + (" or one value" if match.group(1) == "u" else ""))
    kind = "u" if match.group(1) == "u" else "flux"
    sides = []
    for part in parts:
        if kind == "u" and part.strip() == "free":  # this component not held: a roller, a symmetry plane
            sides.append(Side("flux", 0.0))
            continue
        try:
            value = float(part)
        except ValueError:
            raise ValueError(f"{text!r}: {part.strip()!r} is not a number" + (" or \"free\"" if kind == "u" else "")) \
                from None
        if not np.isfinite(value):
            raise ValueError(f"{text!r}: the values must be finite")
        sides.append(Side(kind, value))
    if kind == "u" and all(s.kind == "flux" for s in sides):
        raise ValueError(f"{text!r} holds no component; write \"free\"")
    return tuple(sides) * dims if len(sides) == 1 else tuple(sides)


def vector_side_check(dims: int):
    """An :func:`diffnet.protocol.options.option` check for a vector side key of a ``dims``-D body."""
    def check(text: str) -> str | None:
        try:
            parse_vector_side(text, dims)
        except ValueError as error:
            return str(error)
        return None
    return check


PIN_DOC = ("a point held at zero displacement, \"X,Y[,Z]\" (the grid's nearest node: with a roller it stops what "
           "the sides leave free), or \"none\"")


def parse_pin(text: str, dims: int) -> tuple[float, ...] | None:
    """A pinned point ``"X,Y[,Z]"`` in the unit box (x first), or None for ``"none"``; ValueError naming the form."""
    if str(text).strip() == "none":
        return None
    try:
        point = tuple(float(v) for v in str(text).split(","))
    except ValueError:
        raise ValueError(f"{text!r} is not a point; write \"{','.join('XYZ'[:dims])}\" or \"none\"") from None
    if len(point) != dims or not all(0.0 <= c <= 1.0 for c in point):
        raise ValueError(f"{text!r}: give {dims} coordinates in [0, 1] (x first)")
    return point


def pin_check(dims: int):
    """An :func:`diffnet.protocol.options.option` check for a pin key of a ``dims``-D body."""
    def check(text: str) -> str | None:
        try:
            parse_pin(text, dims)
        except ValueError as error:
            return str(error)
        return None
    return check

def _axis(side: str, dims: int) -> tuple[int, int]:
    """A side's array axis in a grid of ``dims`` axes (outermost first) and its end (0 or -1)."""
    k = "xyz".index(side[0])
    return dims - 1 - k, 0 if side[1] == "0" else -1


@dataclass(frozen=True)
class BoxBoundary:
    """The conditions on every side of a ``dims``-dimensional box (``sides``: name -> :class:`Side`)."""

    sides: Mapping[str, Side]

    @classmethod
    def of(cls, texts: Mapping[str, str], dims: int) -> "BoxBoundary":
        """From side texts, e.g. ``{"x0": "u=1", "x1": "u=0", "y0": "flux=0", "y1": "flux=0"}``, with ``dims`` the
        box's dimension (2: the sides x0, x1, y0, y1; 3: also z0, z1), every side once."""
        need = set(SIDES[: 2 * dims])
        if set(texts) != need:
            raise ValueError(f"a {dims}-D box has the sides {sorted(need)}, got {sorted(texts)}")
        return cls({k: parse_side(texts[k]) for k in SIDES[: 2 * dims]})

    @property
    def dims(self) -> int:
        return len(self.sides) // 2

    @property
    def dirichlet(self) -> tuple[str, ...]:
        """The sides with a Dirichlet value."""
        return tuple(k for k, s in self.sides.items() if s.kind == "u")

    @property
    def varies(self) -> bool:
        """Whether the Dirichlet values differ from side to side (else the lift is constant: no energy)."""
        return len({self.sides[k].value for k in self.dirichlet}) > 1

    def describe(self) -> str:
        return " ".join(f"{k}:{s}" for k, s in self.sides.items())

    def fixed(self, resolution: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The Dirichlet nodes (bool) and their values (zero elsewhere), shape ``resolution``."""
        mask, values = np.zeros(resolution, dtype=bool), np.zeros(resolution)
        for name in reversed(self.dirichlet):  # the first axis's sides written last: they win at corners
            axis, end = _axis(name, len(resolution))
            index = [slice(None)] * len(resolution)
            index[axis] = end
            mask[tuple(index)] = True
            values[tuple(index)] = self.sides[name].value
        return mask, values

    def lift(self, resolution: Sequence[int], like: torch.Tensor) -> torch.Tensor:
        """A smooth field with the Dirichlet values on the Dirichlet sides, in ``like``'s dtype and device:
        along the first axis (x, y, z) with a Dirichlet side, the linear blend of its two values (the one
        value where one side is Dirichlet), constant across; the other Dirichlet sides' nodes then take
        their values. (For u = 1 at x = 0 and u = 0 at x = 1 that is 1 - x, to the bit.)"""
        dims = len(resolution)
        out = torch.zeros(tuple(resolution), dtype=like.dtype, device=like.device)
        for k in "xyz"[:dims]:
            low, high = self.sides[k + "0"], self.sides[k + "1"]
            if low.kind == "u" or high.kind == "u":
                axis = dims - 1 - "xyz".index(k)
                s = torch.linspace(0.0, 1.0, resolution[axis], dtype=like.dtype, device=like.device)
                v0 = low.value if low.kind == "u" else high.value
                v1 = high.value if high.kind == "u" else low.value
                shape = [1] * dims
                shape[axis] = -1
                out = ((1.0 - s) * v0 + s * v1).reshape(shape).expand(tuple(resolution))
                break
        mask, values = self.fixed(resolution)
        return torch.where(torch.as_tensor(mask, device=like.device), torch.as_tensor(values, dtype=like.dtype,
                                                                                       device=like.device), out)

    def flux_load(self, resolution: Sequence[int]) -> np.ndarray:
        """∫_side q N_a dS per node for the flux sides (the Neumann load), shape ``resolution``."""
        dims = len(resolution)
        out = np.zeros(resolution)
        for name, side in self.sides.items():
            if side.kind != "flux" or side.value == 0.0:
                continue
            axis, end = _axis(name, dims)
            weight = np.ones(())
            for other in range(dims):  # the side's own grid: trapezoid weights, exact for Q1
                if other == axis:
                    continue
                w = np.full(resolution[other], 1.0 / (resolution[other] - 1))
                w[[0, -1]] *= 0.5
                weight = np.multiply.outer(weight, w)
            index = [slice(None)] * dims
            index[axis] = end
            out[tuple(index)] += side.value * weight
        return out

    def free(self, resolution: Sequence[int], like: torch.Tensor) -> torch.Tensor:
        """1 off the Dirichlet nodes, 0 on them, in ``like``'s dtype and device."""
        return torch.as_tensor(~self.fixed(resolution)[0], dtype=like.dtype, device=like.device)


def component_boundaries(texts: Mapping[str, str], dims: int) -> tuple[BoxBoundary, ...]:
    """The per-side conditions of a ``dims``-component vector field (``texts``: side -> vector side text,
    :func:`parse_vector_side`) as one :class:`BoxBoundary` per component, x first: each component's
    Dirichlet nodes and values, lift and traction load are then a scalar field's."""
    need = set(SIDES[: 2 * dims])
    if set(texts) != need:
        raise ValueError(f"a {dims}-D box has the sides {sorted(need)}, got {sorted(texts)}")
    per_side = {k: parse_vector_side(texts[k], dims) for k in SIDES[: 2 * dims]}
    return tuple(BoxBoundary({k: per_side[k][i] for k in SIDES[: 2 * dims]}) for i in range(dims))
