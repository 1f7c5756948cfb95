"""Issue 64's cases of a run that went on with something wrong, each now refused in one line (status 2, nothing
written) or stopped naming the instance: a family's physical limits on every path an instance comes in by, a
problem without a load, a NaN or a zero reference in an evaluation, and a family checked against itself before
training (private hooks of an earlier version, a loss and a reference of different problems, a truth it cannot
give, inputs that do not match in_channels), with the old module paths' warnings shown once under the CLI."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import ROOT, run_cli

ELASTICITY = str(ROOT / "configs" / "elasticity.toml")
PLUGINS = ROOT / "tests" / "data" / "plugins"
LEGACY = ROOT / "tests" / "data" / "legacy"
TINY_ELASTIC = ["--set", "problem.resolution=[16,16]", "--set", "multigrid.levels=[]", "--set", "model.channels=[4,8]",
                "--set", "data.n_train=8", "--set", "data.sampling=sobol", "--set", "data.n_test=1",
                "--set", "train.batch_size=4", "--set", "train.epochs=1", "--set", "model.coarse_correction=0",
                "--set", "model.sweeps=0",
                "--set", "train.loss=family", "--set", "train.second_stage_epochs=0",
                "--set", "parallel.threads_per_rank=1", "--set", "output.plots=false"]


def _refused(proc, fragment: str, where: Path) -> str:
    """One line with ``fragment``, status 2, and nothing in ``where``."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("deepfusion: error: "), proc.stderr
    assert fragment in lines[0], lines[0]
    assert list(where.iterdir()) == [], list(where.iterdir())
    return lines[0]


@pytest.fixture(scope="module")
def elastic_run(tmp_path_factory) -> Path:
    """A tiny trained elasticity run (16^2, one epoch), read by the tests of the ratio's limits."""
    run = tmp_path_factory.mktemp("elastic") / "run"
    proc = run_cli("train", ELASTICITY, "--out", str(run), *TINY_ELASTIC)
    assert proc.returncode == 0, proc.stderr
    return run


# -- physical limits: one declaration (the Poisson ratio's), read on every path ----------------------------------
@pytest.mark.parametrize("plane, nu", [("strain", 0.5), ("stress", 1.0)])
def test_reference_refuses_a_poisson_ratio_outside_the_material(tmp_path, plane, nu):
    np.save(tmp_path / "a.npy", np.array([[0.0, 0.0, 0.0, 0.0, nu]]))
    out = tmp_path / "out"
    out.mkdir()
    proc = run_cli("reference", "elasticity", "--param", f"a={tmp_path / 'a.npy'}", "--resolution", "9",
                   "--set", f"elasticity.plane={plane}", "--out", str(out / "x.h5"))
    _refused(proc, f"instance 0: a[4] (nu) = {nu:g}; the physics needs -1 < nu < 0.5", out)


def test_infer_and_the_python_api_refuse_it_and_only_warn_inside_the_physics(elastic_run, tmp_path):
    np.save(tmp_path / "one.npy", np.array([[0.0, 0.0, 0.0, 0.0, 1.0]]))
    out = tmp_path / "out"
    out.mkdir()
    proc = run_cli("infer", str(elastic_run), "--param", "a=" + str(tmp_path / "one.npy"), "--out", str(out / "x.h5"))
    _refused(proc, "a[4] (nu) = 1; the physics needs -1 < nu < 0.5", out)
    proc = run_cli("infer", str(elastic_run), "--param", f"a={tmp_path / 'one.npy'}", "--out", str(out / "x.h5"))
    _refused(proc, "a[4] (nu) = 1; the physics needs -1 < nu < 0.5", out)
    from deepfusion import Surrogate
    from deepfusion.configuration.inputs import InputError, ParameterRangeWarning

    surrogate = Surrogate.load(elastic_run)
    with pytest.raises(InputError, match=r"a\[4\] \(nu\) = 1; the physics needs -1 < nu < 0\.5"):
        surrogate(a=[0.0, 0.0, 0.0, 0.0, 1.0])
    with pytest.warns(ParameterRangeWarning, match="extrapolation"):  # 0.45: a material, outside the training range
        assert np.isfinite(surrogate(a=[0.0, 0.0, 0.0, 0.0, 0.45])).all()


def test_a_training_range_past_the_limits_is_refused_at_configuration(tmp_path):
    proc = run_cli("train", ELASTICITY, "--out", str(tmp_path / "run"), "--set", "elasticity.nu_range=[0.3,0.5]")
    _refused(proc, "elasticity.nu_range: need -1 < low < high < 0.5", tmp_path)


# -- no load: a zero solution, refused before anything is trained or written ----------------------------------
def test_a_problem_without_a_load_is_refused_at_configuration_and_on_reference(tmp_path):
    held = ["--set", "elasticity.x1=free"]  # x0 held at 0, every other side free, no traction
    proc = run_cli("train", ELASTICITY, "--out", str(tmp_path / "run"), *held)
    _refused(proc, "elasticity.x1: no load: every side is held at 0 or free and none carries a traction", tmp_path)
    np.save(tmp_path / "a.npy", np.array([[0.0, 0.0, 0.0, 0.0, 0.3]]))
    out = tmp_path / "out"
    out.mkdir()
    proc = run_cli("reference", "elasticity", "--param", "a=" + str(tmp_path / "a.npy"), "--out", str(out / "x.h5"), *held)
    _refused(proc, "elasticity.x1: no load", out)
    # A plugin's: the generic check (the zero field is stationary for the loss) names no key of its own.
    config = tmp_path / "plugin.toml"
    config.write_text('[problem]\nfamily = "hole_fields:HoleFields2"\nresolution = [17, 17]\n\n[hole_fields]\nload = 0.0\n'
                      '\n[data]\nsampling = "sobol"\n\n[multigrid]\nlevels = []\n')
    proc = run_cli("train", str(config), "--out", str(out / "run"), path=[PLUGINS])
    _refused(proc, "problem.family: the hole_fields family (as configured) has no load", out)
    np.save(tmp_path / "holes.npy", np.array([[0.5, 0.1]]))
    proc = run_cli("reference", "hole_fields:HoleFields2", "--param", f"hole={tmp_path / 'holes.npy'}",
                   "--set", "hole_fields.load=0", "--resolution", "17", "--out", str(out / "x.h5"), path=[PLUGINS])
    _refused(proc, "has no load", out)


def test_an_evaluation_stops_at_a_nan_or_a_zero_reference_naming_the_instance():
    sys.path.insert(0, str(PLUGINS))
    try:
        from hole_fields import HoleFields2

        from deepfusion.analysis.inference import EvaluationError, against_floor

        family = HoleFields2((17, 17))
        params = np.array([[0.4, 0.12], [0.6, 0.18]])
        truth = family.truth(params)
        pred = truth.copy()
        pred[1, 0, 8, 3] = np.nan
        with pytest.raises(EvaluationError, match=r"^instance 1 \(cx = 0.6, r = 0.18\): DiffNet's field has NaN or Inf "
                                                  r"at 1 of 578 values; no error can be measured against it$"):
            against_floor(family, params, pred)
        truth[1] = 0.0  # one instance without a load
        with pytest.raises(EvaluationError, match=r"^instance 1 \(cx = 0.6, r = 0.18\): the reference \(the Q1 solve "
                                                  r"2x finer\) is zero at every node inside its domain: a relative"):
            against_floor(family, params, truth, truth=truth)
    finally:
        sys.path.remove(str(PLUGINS))


# -- a family checked against itself ---------------------------------------------------------------------------
def _legacy_config(tmp_path: Path, family: str) -> Path:
    config = tmp_path / f"{family.split(':')[1]}.toml"
    config.write_text(f'[problem]\nfamily = "{family}"\nresolution = [17, 17]\n\n[data]\nn_train = 8\nn_test = 1\n'
                      'sampling = "sobol"\n\n[model]\nchannels = [4, 8]\n\n[train]\nbatch_size = 4\nepochs = 1\n\n'
                      '[multigrid]\nlevels = []\n\n[output]\nplots = false\n')
    return config


def test_a_family_with_the_private_hooks_of_an_earlier_version_is_told_what_replaced_each(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    proc = run_cli("train", str(_legacy_config(tmp_path, "legacy_lheat:LHeat")), "--out", str(out / "run"),
                   path=[LEGACY])
    line = _refused(proc, "problem.family: the l_heat family defines members the engine no longer reads", out)
    for old, new in (("_nu", "coefficient(instances)"), ("_system_arguments", "source"), ("_box", "box_conditions"),
                     ("_input_channels", "input_channels(instances, sdf)"), ("_body_fitted", "body_fitted(instances, h)")):
        assert f"LHeat.{old} -> {new}" in line
    # The partial port of item 7: _box and _body_fitted renamed, _nu left (its loss reads it, the grid solve not).
    proc = run_cli("train", str(_legacy_config(tmp_path, "legacy_lheat:LHeatPartial")), "--out", str(out / "run"),
                   path=[LEGACY])
    line = _refused(proc, "LHeatPartial._nu -> coefficient(instances)", out)
    assert "_box" not in line and "_body_fitted" not in line


def test_a_family_that_cannot_give_its_truth_is_refused_before_training(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    proc = run_cli("train", str(_legacy_config(tmp_path, "legacy_lheat:LHeatNoTruth")), "--out", str(out / "run"),
                   path=[LEGACY])
    _refused(proc, "problem.family: l_heat.truth failed on one instance (cx = ", out)
    assert "NotImplementedError: the LHeatNoTruth family declares no body_fitted(instances, h)" in proc.stderr


MISMATCHED = '''
"""The loss reads a conductivity of 2 inside the domain; the reference and floor solve with the family's 1."""
from dataclasses import dataclass

import torch

from diffnet import reaction_diffusion_energy
from hole_fields import HoleFields2


@dataclass(frozen=True)
class Mismatched(HoleFields2):
    def loss_terms(self, u, hole):
        h = 1.0 / (self.resolution[1] - 1)
        nu = 2.0 * torch.as_tensor(self.nu(hole.detach().cpu().numpy()), dtype=u.dtype)
        return {"energy": sum(reaction_diffusion_energy(u[:, c], nu, 0.0, c + 1.0, h, h) for c in range(2))}


@dataclass(frozen=True)
class WrongChannels(HoleFields2):
    in_channels = 4  # inputs gives 3
'''


def test_a_loss_and_a_reference_of_different_problems_are_refused_naming_both(tmp_path):
    (tmp_path / "mismatched.py").write_text(MISMATCHED)
    out = tmp_path / "out"
    out.mkdir()
    proc = run_cli("train", str(_legacy_config(tmp_path, "mismatched:Mismatched")), "--out", str(out / "run"),
                   path=[tmp_path, PLUGINS])
    line = _refused(proc, "problem.family: the hole_fields family's loss and its floor (the Q1 solve on this grid) "
                          "describe different problems: on one instance (cx = ", out)
    ratio = float(line.split("the loss's gradient at that solution is ")[1].split(" ")[0])
    assert ratio > 0.1  # the measured 1e-15 of a matching family (the hole_fields family itself) is far below 1e-2
    proc = run_cli("train", str(_legacy_config(tmp_path, "mismatched:WrongChannels")), "--out", str(out / "run"),
                   path=[tmp_path, PLUGINS])
    _refused(proc, "hole_fields.in_channels: inputs(instances) returned shape [1, 3, 17, 17] for one instance; the "
                   "network is built for in_channels = 4, [1, 4, 17, 17]", out)


def test_a_domain_of_the_wrong_shape_is_refused_at_configuration_and_one_channel_is_taken(tmp_path):
    (tmp_path / "domains.py").write_text(
        "from dataclasses import dataclass\nimport numpy as np\nfrom hole_fields import HoleFields2\n\n\n"
        "@dataclass(frozen=True)\nclass PerUnknown(HoleFields2):\n    def domain(self, hole):\n"
        "        sdf = super().domain(hole)\n        return np.stack([sdf, sdf], axis=1)\n\n\n"
        "@dataclass(frozen=True)\nclass OneChannel(HoleFields2):\n    def domain(self, hole):\n"
        "        return super().domain(hole)[:, None]\n")
    out = tmp_path / "out"
    out.mkdir()
    proc = run_cli("train", str(_legacy_config(tmp_path, "domains:PerUnknown")), "--out", str(out / "run"),
                   path=[tmp_path, PLUGINS])
    _refused(proc, "hole_fields.domain(instances) returned shape [1, 2, 17, 17] for 1 instance; it must be one value per "
                   "instance and node, [1, 17, 17], whatever the number of unknowns", out)
    proc = run_cli("train", str(_legacy_config(tmp_path, "domains:OneChannel")), "--out", str(out / "run"),
                   path=[tmp_path, PLUGINS])
    assert proc.returncode == 0, proc.stderr  # (S, 1, *grid), as a field of one unknown is written: taken


def test_a_plugin_on_the_old_module_paths_is_one_line_naming_the_move(tmp_path):
    # A fresh process, as a user runs it: status 2, one line, nothing written.
    proc = run_cli("reference", "legacy_screened:ScreenedPoisson", "--param", "k=3", "--resolution", "9", "--out",
                   str(tmp_path / "x.h5"), path=[LEGACY], process=True)
    assert proc.returncode == 2 and not (tmp_path / "x.h5").exists()
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("deepfusion: error: problem.family 'legacy_screened:ScreenedPoisson': cannot import") and \
        "diffnet.energy moved to diffnet.discretisation.energy" in line
