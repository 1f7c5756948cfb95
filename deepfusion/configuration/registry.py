"""The family registry: the one place where family names meet the classes that implement them.

Built-in families are listed here by name; installed packages add theirs through the entry
point group ``deepfusion.families`` (``name = "package.module:Class"``); a config may also
name a class directly, ``problem.family = "package.module:Class"``. All three go through
:func:`family_class`, and the engine never names a family anywhere else.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

__all__ = ["DEFAULT_FAMILY", "ENTRY_POINT_GROUP", "FamilyError", "known_families", "family_class",
           "builtin_families"]

ENTRY_POINT_GROUP = "deepfusion.families"

# name -> "module:Class"; imported only when a run asks for the family.
_BUILTIN = {
    "burgers": "diffnet.families.burgers:BurgersFamily",
    "poisson": "diffnet.families.poisson:PoissonFamily",
    "groundwater": "diffnet.families.groundwater:GroundwaterFamily",
    "poisson3d": "diffnet.families.poisson3d:Poisson3DFamily",
    "reaction_diffusion": "diffnet.families.reaction_diffusion:ReactionDiffusionFamily",
    "plate": "diffnet.families.plate:PlateWithHoleFamily",
    "elastic_plate": "diffnet.families.elastic_plate:ElasticPlateFamily",
    "torsion": "diffnet.families.torsion:StarTorsionFamily",
    "elasticity": "diffnet.families.elasticity:ElasticityFamily",
    "elasticity3d": "diffnet.families.elasticity:Elasticity3DFamily",
    "hyperelasticity": "diffnet.families.hyperelasticity:HyperelasticityFamily",
    "hyperelasticity3d": "diffnet.families.hyperelasticity:Hyperelasticity3DFamily",
    "navier_stokes": "diffnet.families.navier_stokes:CavityFamily",
    "cylinder": "diffnet.families.cylinder:CylinderFamily",
}

DEFAULT_FAMILY = "burgers"


class FamilyError(ValueError):
    """A family that cannot be found or is not a :class:`diffnet.protocol.family.Family`."""


def builtin_families() -> dict[str, str]:
    """The built-in families, name -> ``module:Class``."""
    return dict(_BUILTIN)


def known_families() -> dict[str, str]:
    """Built-in and installed families, name -> ``module:Class`` (an installed one may not shadow a built-in)."""
    found = dict(_BUILTIN)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep.value)
    return found


def _load(target: str, what: str) -> type:
    from diffnet.protocol.family import Family

    module, _, attr = target.partition(":")
    try:
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except ImportError as e:
        from diffnet.protocol.moved import moved_text, renamed_text

        # a plugin written against diffnet's module paths or class names of before
        moved = moved_text(e.name or "") or renamed_text(str(e))
        raise FamilyError(f"{what}: cannot import {module!r} ({e})" + (f"; {moved}" if moved else "")) from None
    except AttributeError:
        raise FamilyError(f"{what}: {module!r} has no {attr!r}") from None
    if not (isinstance(obj, type) and issubclass(obj, Family)):
        raise FamilyError(f"{what}: {target} is not a diffnet.protocol.family.Family subclass")
    for member in ("name", "Options", "in_channels"):
        if not hasattr(obj, member):
            raise FamilyError(f"{what}: {target} does not define {member!r} (see docs/families.md)")
    return obj


def family_class(spec: str) -> type:
    """The family class of ``problem.family``: a registered name or ``package.module:Class``.

    A built-in name or a ``module:Class`` is imported directly; only another name scans the installed entry
    points (about 12 ms: every distribution's metadata is read).
    """
    if ":" in spec:
        return _load(spec, f"problem.family {spec!r}")
    if spec in _BUILTIN:
        return _load(_BUILTIN[spec], f"problem.family {spec!r}")
    known = known_families()
    if spec not in known:
        raise FamilyError(f"problem.family: unknown family {spec!r} (known: {', '.join(sorted(known))}; "
                          f"or 'package.module:Class')")
    return _load(known[spec], f"problem.family {spec!r}")
