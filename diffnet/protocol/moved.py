"""The module paths diffnet had before its subpackages, and where each went: a plugin written against them is
refused in one line that names the new path (:func:`moved_text`, read by the family registry when a plugin's import
fails). Nothing is installed at import: the earlier version's import hook that kept the old paths working is
retired (CHANGELOG.md). The supported paths are ``diffnet``'s top-level names (docs/families.md) and, for everything
else, the one module that defines a name.
"""

from __future__ import annotations

__all__ = ["MOVED", "moved_text"]

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


def moved_text(module: str) -> str | None:
    """Where an old module path went, as a clause for a message (None for a path that did not move)."""
    if module not in MOVED:
        return None
    elsewhere = _ELSEWHERE.get(module, {})
    names = "".join(f", {name} to {target}" for name, target in elsewhere.items())
    return f"{module} moved to {MOVED[module]}{names}; or import diffnet's top-level names (CHANGELOG.md)"
