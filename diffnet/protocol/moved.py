"""The module paths and class names diffnet had before, and where each went (its subpackages; the built-in families'
folder ``diffnet.problems`` now ``diffnet.families``, their classes named ``...Family``): a plugin written against them is
refused in one line that names the new path (:func:`moved_text`, read by the family registry when a plugin's import
fails). Nothing is installed at import: the earlier version's import hook that kept the old paths working is
retired (CHANGELOG.md). The supported paths are ``diffnet``'s top-level names (docs/families.md) and, for everything
else, the one module that defines a name.
"""

from __future__ import annotations

__all__ = ["MOVED", "RENAMED", "moved_text", "renamed_text"]

# the built-in families' modules, moved with their folder (diffnet/problems -> diffnet/families)
_FAMILY_MODULES = ("burgers", "elastic_plate", "elasticity", "groundwater", "hyperelasticity", "immersed_family",
                   "kl_family", "plate", "poisson", "poisson3d", "reaction_diffusion", "torsion")

# a built-in family class's old name -> (its module, its name now): one suffix, Family, for one concept
RENAMED = {
    "BurgersProblem": ("burgers", "BurgersFamily"), "PoissonProblem": ("poisson", "PoissonFamily"),
    "Poisson3D": ("poisson3d", "Poisson3DFamily"), "ReactionDiffusionProblem": ("reaction_diffusion", "ReactionDiffusionFamily"),
    "Elasticity": ("elasticity", "ElasticityFamily"), "Elasticity3D": ("elasticity", "Elasticity3DFamily"),
    "ElasticPlate": ("elastic_plate", "ElasticPlateFamily"), "Groundwater": ("groundwater", "GroundwaterFamily"),
    "Hyperelasticity": ("hyperelasticity", "HyperelasticityFamily"),
    "Hyperelasticity3D": ("hyperelasticity", "Hyperelasticity3DFamily"),
    "PlateWithHole": ("plate", "PlateWithHoleFamily"), "StarTorsion": ("torsion", "StarTorsionFamily"),
}

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
    "diffnet.problems": "diffnet.families",
    **{f"diffnet.problems.{name}": f"diffnet.families.{name}" for name in _FAMILY_MODULES},
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
    classes = "".join(f", {old} is now {new}" for old, (home, new) in RENAMED.items()
                      if module in ("diffnet.problems", f"diffnet.problems.{home}"))
    return f"{module} moved to {MOVED[module]}{names}{classes}; or import diffnet's top-level names (CHANGELOG.md)"


def renamed_text(message: str) -> str | None:
    """The new names of the renamed classes an import error's ``message`` names, as a clause (None if none)."""
    found = [f"{old} is now {new}" for old, (_, new) in RENAMED.items() if f"'{old}'" in message]
    return "; ".join(found) + " (CHANGELOG.md)" if found else None
