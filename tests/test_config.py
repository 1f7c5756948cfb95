"""Config loading, overrides and validation."""

import pytest

from conftest import ROOT
from deepfusion.config import Config, ConfigError, config_from_dict, load_config, parse_override, to_toml


def test_defaults_and_roundtrip(tmp_path):
    cfg = Config()
    path = tmp_path / "c.toml"
    path.write_text(to_toml(cfg))
    assert load_config(path) == cfg


def test_overrides_are_toml_literals(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[problem]\nviscosity = 0.02\n')
    cfg = load_config(path, ["problem.resolution=[32,48]", "train.lr=1e-3", "output.plots=false",
                             "problem.residual=scharr", "train.epochs=3"])
    assert cfg.problem.resolution == (32, 48)
    assert cfg.problem.viscosity == 0.02
    assert cfg.train.lr == 1e-3 and cfg.train.epochs == 3
    assert cfg.output.plots is False
    assert cfg.problem.residual == "scharr"  # a bare word is a string


def test_parse_override_forms():
    assert parse_override("a.b=1") == ("a", "b", 1)
    assert parse_override("a.b = [1, 2]") == ("a", "b", [1, 2])
    assert parse_override("a.b=hello") == ("a", "b", "hello")
    for bad in ["ab=1", "a.b", "a.b.c=1", ".b=1"]:
        with pytest.raises(ConfigError):
            parse_override(bad)


@pytest.mark.parametrize(
    "data, fragment",
    [
        ({"problem": {"viscosty": 0.1}}, "problem.viscosty: unknown key"),
        ({"problm": {}}, "problm: unknown section"),
        ({"problem": {"viscosity": -1}}, "problem.viscosity: must be >= 0"),
        ({"problem": {"viscosity": "a lot"}}, "problem.viscosity: expected a number"),
        ({"problem": {"resolution": [64]}}, "problem.resolution: must be two node counts"),
        ({"problem": {"resolution": [64, 2]}}, "problem.resolution"),
        ({"problem": {"resolution": [64.0, 64]}}, "problem.resolution: expected an integer"),
        ({"problem": {"c_range": [6, 3]}}, "problem.c_range: must be [low, high]"),
        ({"problem": {"name": "navier_stokes"}}, "problem.name: must be one of"),
        ({"train": {"lr": 0}}, "train.lr: must be > 0"),
        ({"train": {"epochs": 2.5}}, "train.epochs: expected an integer"),
        ({"train": {"batch_size": True}}, "train.batch_size: expected an integer"),
        ({"train": {"batch_size": 128}}, "train.batch_size: must be <= data.n_train"),
        ({"data": {"sampling": "list"}}, "problem.c_values"),
        ({"output": {"plots": "yes"}}, "output.plots: expected true or false"),
        ({"model": {"channels": []}}, "model.channels"),
        ({"problem": "burgers"}, "problem: must be a table"),
        ({"problem": {"preconditioner": "implicit_diffusion"}}, "problem.preconditioner: applies to the conservative"),
        ({"problem": {"preconditioner": "jacobi"}}, "problem.preconditioner: must be one of"),
    ],
)
def test_invalid_values_name_the_key(data, fragment):
    with pytest.raises(ConfigError) as exc:
        config_from_dict(data)
    assert fragment in str(exc.value)
    assert "\n" not in str(exc.value)


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[problem\nname=1")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(bad)


def test_shipped_configs_load():
    from pathlib import Path

    configs = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.toml"))
    assert len(configs) >= 4
    for path in configs:
        load_config(path)  # raises ConfigError on an unknown key or an invalid value
    inviscid = load_config(configs[0].parent / "burgers_inviscid.toml")
    assert (inviscid.problem.viscosity, inviscid.problem.residual, inviscid.problem.scheme_order) == (0.0, "conservative", 2)


def test_configuration_reference_is_generated_from_the_schema():
    # docs/configuration.md lists every key with its type, default and meaning; regenerate it
    # with `python -m deepfusion.configdoc > docs/configuration.md` after changing the schema.
    import dataclasses
    import typing

    from deepfusion.configdoc import markdown
    from deepfusion.schema import Config

    assert (ROOT / "docs" / "configuration.md").read_text() == markdown()
    for section, cls in typing.get_type_hints(Config).items():
        for f in dataclasses.fields(cls):
            assert f.metadata["doc"].strip(), f"{section}.{f.name} has no meaning"
            assert f"| `{section}.{f.name}` |" in markdown()
