"""``docs/configuration.md``, generated from the config schema: every key with its type, default and meaning.

    python -m deepfusion.configuration.configdoc > docs/configuration.md

``tests/engine/test_config.py`` fails when the file and the schema drift apart.
"""

from __future__ import annotations

import dataclasses
import typing

__all__ = ["markdown"]

_INTRO = """\
# Configuration reference

A run is configured by one TOML file with the sections below; every key has a default and
an unknown key is an error. `deepfusion train CONFIG --set SECTION.KEY=VALUE` overrides a
key (TOML syntax: `--set 'multigrid.levels=[32,64]'`, `--set train.lr=1e-3`). The run
directory's `config.toml` holds the fully resolved config the run was trained with.

`[problem]` names the family and the grid; the family's own keys go in a table of the
family's name (`[burgers]`, `[poisson]`, `[reaction_diffusion]`, or a plugin's, see
[families](families.md)), and another family's keys are refused.

The shipped configs in `configs/` are the starting points; see the [user guide](user-guide.md).
This page is generated from `deepfusion/configuration/schema.py` and the built-in families' `Options`
(`python -m deepfusion.configuration.configdoc`).
"""


def _type_name(hint) -> str:
    if typing.get_origin(hint) is tuple:
        return f"list of {typing.get_args(hint)[0].__name__}"
    return {"str": "string", "bool": "boolean"}.get(hint.__name__, hint.__name__)


def markdown() -> str:
    """The configuration reference as markdown."""
    from deepfusion.configuration.config import toml_value
    from deepfusion.configuration.registry import builtin_families, family_class
    from deepfusion.configuration.schema import Config

    engine = {k: v for k, v in typing.get_type_hints(Config).items() if k != "family_keys"}
    families = {name: family_class(name).Options for name in builtin_families()}
    sections = {"problem": engine.pop("problem"), **families, **engine}
    out = [_INTRO]
    for section, cls in sections.items():
        hints = typing.get_type_hints(cls)
        text = " ".join(cls.__doc__.split()).replace("``", "`").removeprefix(f"`[{section}]`: ")
        out.append(f"## `[{section}]`\n\n{text[0].upper()}{text[1:]}\n")
        out.append("| key | type | default | meaning |\n|---|---|---|---|")
        for f in dataclasses.fields(cls):
            default = toml_value(f.default).replace("|", "\\|")
            doc = f.metadata["doc"].replace("|", "\\|")
            out.append(f"| `{section}.{f.name}` | {_type_name(hints[f.name])} | `{default}` | {doc} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(markdown(), end="")
