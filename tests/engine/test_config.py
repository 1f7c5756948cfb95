"""Config loading, overrides and validation."""

import pytest

from helpers import ROOT, run_cli
from deepfusion.configuration.schema import Config, ConfigError
from deepfusion.configuration.config import config_from_dict, load_config, parse_override, to_toml
from deepfusion.configuration.run import Run
from diffnet.families.poisson import PoissonFamily


def test_defaults_and_roundtrip(tmp_path):
    cfg = Config()
    path = tmp_path / "c.toml"
    path.write_text(to_toml(cfg))
    assert load_config(path) == cfg


def test_overrides_are_toml_literals(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[burgers]\nviscosity = 0.02\n')
    cfg = load_config(path, ["problem.resolution=[32,48]", "train.lr=1e-3", "output.plots=false",
                             "burgers.residual=scharr", "train.epochs=3"])
    assert cfg.problem.resolution == (32, 48)
    assert cfg.family_keys.viscosity == 0.02
    assert cfg.train.lr == 1e-3 and cfg.train.epochs == 3
    assert cfg.output.plots is False
    assert cfg.family_keys.residual == "scharr"  # a bare word is a string


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
        ({"problem": {"viscosty": 0.1}}, "problem.viscosty: not a key of [problem] (family, resolution) nor of the burgers family"),
        ({"problm": {}}, "problm: unknown section"),
        ({"burgers": {"viscosity": -1}}, "burgers.viscosity: must be >= 0"),
        ({"burgers": {"viscosity": "a lot"}}, "burgers.viscosity: expected a number"),
        ({"burgers": {"viscosty": 0.1}}, "burgers.viscosty: unknown key"),
        ({"problem": {"viscosity": 0.1}}, "problem.viscosity: a key of the burgers family; set it in its table [burgers]"),
        ({"problem": {"resolution": [64]}}, "problem.resolution: must be two (3-D: three) node counts"),
        ({"problem": {"resolution": [64, 2]}}, "problem.resolution"),
        ({"problem": {"resolution": [64.0, 64]}}, "problem.resolution: expected an integer"),
        ({"burgers": {"c_range": [6, 3]}}, "burgers.c_range: must be [low, high]"),
        ({"problem": {"family": "navier_stokes3d"}}, "problem.family: unknown family 'navier_stokes3d' (known: "),
        ({"problem": {"family": "math:pi"}}, "is not a diffnet.protocol.family.Family subclass"),
        ({"problem": {"family": "no_such_module_x:Family"}}, "problem.family 'no_such_module_x:Family': cannot import"),
        ({"problem": {"family": "poisson"}, "burgers": {"t_final": 5.0}}, "burgers: the table of another family"),
        ({"problem": {"family": "poisson", "t_final": 5.0}}, "problem.t_final: not a key of [problem] (family, resolution) nor of the poisson family"),
        ({"problem": {"family": "poisson"}, "data": {"sampling": "list"}}, "data.sampling: the poisson family samples"),
        ({"problem": {"family": "poisson"}, "data": {"sampling": "uniform", "n_train": 100}}, "data.n_train: uniform sampling of 6 coefficients"),
        ({"problem": {"family": "reaction_diffusion"}, "reaction_diffusion": {"diffusivity": "constant", "viscosity": 0},
          "data": {"sampling": "random"}}, "reaction_diffusion.viscosity: the constant diffusivity must be > 0"),
        ({"train": {"lr": 0}}, "train.lr: must be > 0"),
        ({"train": {"epochs": 2.5}}, "train.epochs: expected an integer"),
        ({"train": {"batch_size": True}}, "train.batch_size: expected an integer"),
        ({"train": {"batch_size": 128}}, "train.batch_size: must be <= data.n_train"),
        ({"data": {"sampling": "list"}}, "burgers.c_values"),
        ({"output": {"plots": "yes"}}, "output.plots: expected true or false"),
        ({"model": {"channels": []}}, "model.channels"),
        ({"problem": "burgers"}, "problem: must be a table"),
        ({"burgers": {"preconditioner": "implicit_diffusion"}}, "burgers.preconditioner: applies to the conservative"),
        ({"burgers": {"preconditioner": "jacobi"}}, "burgers.preconditioner: must be one of"),
        ({"problem": {"family": "poisson"}, "data": {"sampling": "random"}, "model": {"sweeps": 2}},
         "model.sweeps: the sweeps follow the coarse correction"),
        ({"model": {"sweeps": -1}}, "model.sweeps: must be in 0..128"),
        ({"model": {"smoothing": 2}}, "model.smoothing: the earlier name of model.sweeps; set model.sweeps"),
        ({"multigrid": {"cycle": "v"}}, "multigrid.cycle: the earlier name of multigrid.schedule"),
        ({"train": {"precondition_cycles": 2}}, "train.precondition_cycles: the earlier name of train.precondition_vcycles"),
        ({"problem": {"family": "poisson"}, "data": {"sampling": "random"},
          "model": {"coarse_correction": 5, "cycles": 3}}, "model.cycles: repeating the exact coarse correction"),
        ({"model": {"cycles": 0}}, "model.cycles: must be in 1..16"),
        ({"model": {"polish": 101}}, "model.polish: must be in 0..100"),
        ({"model": {"polish": 2}}, "model.polish: the burgers family (as configured) declares no polish step"),
        ({"problem": {"family": "poisson"}, "data": {"sampling": "random"}, "model": {"polish": 1},
          "train": {"second_stage_epochs": 2}}, "model.polish: a second stage trains through the product"),
    ],
)
def test_invalid_values_name_the_key(data, fragment):
    with pytest.raises(ConfigError) as exc:  # the keys' own checks, or the family's as the run builds it
        Run.from_config(config_from_dict(data))
    assert fragment in str(exc.value)
    assert "\n" not in str(exc.value)


def test_flat_layout_of_earlier_versions_is_read():
    # Before families had tables, [problem] held the family's keys and problem.name; a run's
    # stored config listed every family's keys.
    old = {"problem": {"name": "poisson", "resolution": [33, 33], "kl_terms": 4, "viscosity": 0.01, "t_final": 1.0},
           "data": {"sampling": "random"}}
    cfg = config_from_dict(old, saved=True)
    assert cfg.problem.family == "poisson" and cfg.family_keys.kl_terms == 4
    with pytest.raises(ConfigError, match="problem.viscosity: not a key of"):
        config_from_dict(old)  # a user's file: another family's key is refused by name
    del old["problem"]["viscosity"], old["problem"]["t_final"]
    assert config_from_dict(old) == cfg


def test_a_runs_stored_config_of_an_earlier_version_reads_its_renamed_keys_under_their_new_names():
    # model.smoothing, multigrid.cycle and train.precondition_cycles were renamed (CHANGELOG.md): a user's config is
    # refused in one line naming the new key (above), a run directory written before is read as it was meant.
    old = {"problem": {"family": "poisson", "resolution": [33, 33]}, "data": {"sampling": "random"},
           "model": {"coarse_correction": 5, "smoothing": 3}, "multigrid": {"cycle": "v"},
           "train": {"precondition_cycles": 2}}
    cfg = config_from_dict(old, saved=True)
    assert (cfg.model.sweeps, cfg.multigrid.schedule, cfg.train.precondition_vcycles) == (3, "v", 2)


@pytest.mark.parametrize("extra, message", [
    ({"family": "burgers"}, r"problem.name: the older layout's name of problem.family, given beside it "
                            r"\(problem.name = 'poisson', problem.family = 'burgers'\); set only problem.family"),
    ({"family": "poisson"}, "problem.name: .* given beside it"),
])
def test_a_legacy_key_beside_its_new_name_is_refused_in_one_line(extra, message):
    with pytest.raises(ConfigError, match=message) as exc:
        config_from_dict({"problem": {"name": "poisson", **extra}})
    assert "\n" not in str(exc.value)
    # A family key in both places (the flat layout's [problem] and the family's table): neither is dropped in silence.
    with pytest.raises(ConfigError, match=r"problem.kl_terms: the older layout's place of poisson.kl_terms, which is "
                                          r"given too; set only poisson.kl_terms"):
        config_from_dict({"problem": {"name": "poisson", "kl_terms": 4}, "poisson": {"kl_terms": 5}})


def test_a_legacy_name_set_on_a_current_config_is_refused_by_the_cli(tmp_path):
    proc = run_cli("train", str(ROOT / "configs" / "burgers.toml"), "--set", 'problem.name="navier"',
                   "--out", str(tmp_path / "r"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "set only problem.family" in proc.stderr
    assert not (tmp_path / "r").exists()


def test_family_tables_round_trip(tmp_path):
    cfg = load_config(ROOT / "configs" / "reaction_diffusion.toml", ["reaction_diffusion.kappa=2.5"])
    text = to_toml(cfg)
    assert "[reaction_diffusion]\n" in text and "kappa = 2.5" in text and "[burgers]" not in text
    path = tmp_path / "c.toml"
    path.write_text(text)
    assert load_config(path) == cfg


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[problem\nname=1")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(bad)


def test_shipped_configs_load():
    configs = sorted((ROOT / "configs").glob("*.toml"))
    assert len(configs) >= 4
    for path in configs:  # the keys, then the family on its full grid tried on one instance (ConfigError, one line)
        run = Run.from_config(load_config(path))
        assert tuple(run.family.resolution) == tuple(run.cfg.problem.resolution)
    inviscid = load_config(configs[0].parent / "burgers_inviscid.toml")
    assert (inviscid.family_keys.viscosity, inviscid.family_keys.residual, inviscid.family_keys.scheme_order) == (0.0, "conservative", 2)


def test_configuration_reference_is_generated_from_the_schema():
    # docs/configuration.md lists every key with its type, default and meaning; regenerate it
    # with `python -m deepfusion.configuration.configdoc > docs/configuration.md` after changing the schema.
    import dataclasses
    import typing

    from deepfusion.configuration.configdoc import markdown
    from deepfusion.configuration.schema import Config

    assert (ROOT / "docs" / "configuration.md").read_text() == markdown()
    from deepfusion.configuration.registry import builtin_families, family_class

    sections = {k: v for k, v in typing.get_type_hints(Config).items() if k != "family_keys"}
    sections |= {name: family_class(name).Options for name in builtin_families()}
    for section, cls in sections.items():
        for f in dataclasses.fields(cls):
            assert f.metadata["doc"].strip(), f"{section}.{f.name} has no meaning"
            assert f"| `{section}.{f.name}` |" in markdown()


def test_a_family_without_its_table_says_which_defaults_it_took(tmp_path):
    from deepfusion.configuration.config import defaults_notice

    bare = tmp_path / "bare.toml"
    bare.write_text('[problem]\nfamily = "poisson"\nresolution = [16, 16]\n')
    cfg = load_config(bare)
    line = defaults_notice(bare, [], cfg)
    assert line.startswith("poisson: the config has no [poisson] table; the family's defaults: kl_terms = 6, ")
    assert "\n" not in line
    assert defaults_notice(bare, ["poisson.kl_eta=0.4"], load_config(bare, ["poisson.kl_eta=0.4"])) == ""
    assert defaults_notice(ROOT / "configs" / "poisson.toml", [], load_config(ROOT / "configs" / "poisson.toml")) == ""
    proc = run_cli("train", str(bare), "--out", str(tmp_path / "r"), "--set", "model.channels=[4,8]",
                   "--set", "data.n_train=4", "--set", "data.sampling=sobol", "--set", "data.n_test=1",
                   "--set", "train.batch_size=4",
                   "--set", "train.epochs=1", "--set", "output.plots=false", "--set", "parallel.threads_per_rank=1")
    assert proc.returncode == 0, proc.stderr
    assert line in proc.stdout.splitlines()


class OwnSampling(PoissonFamily):
    """A family with a sampling of its own (Halton points): the schema leaves the choice to the family."""

    name = "own_sampling"
    samplings = (*PoissonFamily.samplings, "halton")

    def sample(self, n, sampling, seed):
        if sampling != "halton":
            return super().sample(n, sampling, seed)
        from scipy.stats import qmc

        lo, hi = self.coeff_range
        return lo + (hi - lo) * qmc.Halton(d=self.kl_terms, seed=seed).random(n)


def test_sampling_choices_are_the_familys():
    own = {"problem": {"family": "test_config:OwnSampling", "resolution": [9, 9]}, "multigrid": {"levels": []}}
    cfg = config_from_dict(own | {"data": {"sampling": "halton", "n_train": 8}, "train": {"batch_size": 4}})
    from deepfusion.configuration.run import Run  # the training set is the family's own draw
    from scipy.stats import qmc

    assert cfg.data.sampling == "halton"
    assert (Run.from_config(cfg).training == -3 + 6 * qmc.Halton(d=6, seed=cfg.data.seed).random(8)).all()
    with pytest.raises(ConfigError, match="data.sampling.*uniform, random, sobol, halton"):
        config_from_dict(own | {"data": {"sampling": "list"}})
    with pytest.raises(ConfigError, match="data.sampling.*uniform, random, sobol"):  # a built-in family's own list
        config_from_dict({"problem": {"family": "poisson"}, "data": {"sampling": "halton"}})
    with pytest.raises(ConfigError, match="data.sampling: must not be empty"):
        config_from_dict({"data": {"sampling": " "}})


def test_a_config_of_the_flat_layout_is_read_with_a_one_line_notice(tmp_path):
    from deepfusion.configuration.config import defaults_notice

    old = tmp_path / "old.toml"
    old.write_text('[problem]\nname = "poisson"\nresolution = [33, 33]\nkl_terms = 4\n')
    cfg = load_config(old)
    assert cfg.problem.family == "poisson" and cfg.family_keys.kl_terms == 4
    assert defaults_notice(old, [], cfg) == (f"{old}: the older flat layout (problem.kl_terms, problem.name), read as "
                                             "problem.family and the table [poisson]; write it so (CHANGELOG.md)")
