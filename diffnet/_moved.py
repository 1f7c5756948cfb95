"""The module paths of diffnet before its subpackages (2026-11), kept working as deprecations.

A plugin written against them (``from diffnet.family import Family``, ``from diffnet.energy import
gauss_basis``) still imports: each old path is a module that hands on the names of the module that now
holds them, with a ``DeprecationWarning`` naming the new path. The supported paths are ``diffnet``'s
top-level names (docs/families.md) and, for everything else, the one module that defines a name.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings

__all__ = ["MOVED", "MovedPathWarning", "install"]



class MovedPathWarning(DeprecationWarning):
    """An old module path imported (the ``deepfusion`` command shows it once, as one line)."""


# old module -> the module that holds its names now
MOVED = {
    "diffnet.family": "diffnet.protocol.family", "diffnet.capabilities": "diffnet.protocol.capabilities",
    "diffnet.options": "diffnet.protocol.options",
    "diffnet.constants": "diffnet.backend.constants", "diffnet.precision": "diffnet.backend.precision",
    "diffnet.geometry": "diffnet.instances.geometry", "diffnet.boundary": "diffnet.instances.boundary",
    "diffnet.kl": "diffnet.instances.kl", "diffnet.cutcell": "diffnet.instances.cutcell",
    "diffnet.energy": "diffnet.discretisation.energy", "diffnet.elasticity": "diffnet.discretisation.elasticity",
    "diffnet.finite_difference": "diffnet.discretisation.finite_difference",
    "diffnet.finite_volume": "diffnet.discretisation.finite_volume", "diffnet.immersed": "diffnet.discretisation.immersed",
    "diffnet.vcycle": "diffnet.multigrid.vcycle", "diffnet.preconditioned": "diffnet.multigrid.preconditioned",
    "diffnet.coarse": "diffnet.multigrid.coarse",
    "diffnet.networks": "diffnet.generators.networks", "diffnet.multilevel": "diffnet.generators.multilevel",
    "diffnet.tiling": "diffnet.generators.tiling", "diffnet.galerkin": "diffnet.generators.galerkin",
    "diffnet.stages": "diffnet.generators.two_stage", "diffnet.classical": "diffnet.solvers.classical",
}

# names that left their old module for another one
_ELSEWHERE = {
    "diffnet.energy": dict.fromkeys(("ELEMENT_NODES", "element_nodes", "gauss_basis"), "diffnet.grid.element"),
    "diffnet.elasticity": dict.fromkeys(("PLANES", "lame"), "diffnet.grid.material"),
    "diffnet.multilevel": {"interpolation_matrix": "diffnet.grid.transfer"},
    "diffnet.vcycle": {**dict.fromkeys(("components", "as_blocks", "as_fields", "apply_stencil"), "diffnet.multigrid.stencil"),
                       **dict.fromkeys(("probe_stencil", "fixed_nodes", "loss_gradient", "block_hessian"),
                                       "diffnet.multigrid.hessian")},
}


class _Old(types.ModuleType):
    """An old path: attribute lookups go to the module that holds the name now."""

    def __getattr__(self, name: str):
        elsewhere = _ELSEWHERE.get(self.__name__, {})
        return getattr(importlib.import_module(elsewhere.get(name, MOVED[self.__name__])), name)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, self) if name in MOVED else None

    def create_module(self, spec):
        warnings.warn(f"{spec.name} is deprecated: import from {MOVED[spec.name]} (or diffnet's top-level names)",
                      MovedPathWarning, stacklevel=2)
        module = _Old(spec.name, f"Deprecated path of :mod:`{MOVED[spec.name]}`.")
        module.__all__ = list(getattr(importlib.import_module(MOVED[spec.name]), "__all__", [])) + \
            list(_ELSEWHERE.get(spec.name, {}))
        return module

    def exec_module(self, module):
        pass


def install() -> None:
    """Put the finder of the old paths on ``sys.meta_path`` (once; it finds nothing but :data:`MOVED`'s keys)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
