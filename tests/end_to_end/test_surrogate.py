"""The Python API: ``Surrogate.load(run)(c=...)`` gives what ``deepfusion infer`` writes, in chunks, with
the CLI's checks raised as InputError and a warning outside the training range."""

from __future__ import annotations

import subprocess
import sys
import warnings

import h5py
import re

import numpy as np
import pytest
import torch

from helpers import ROOT, float32_atol, run_cli
from deepfusion import InputError, ParameterRangeWarning, Surrogate
from deepfusion.files.checkpoint import checkpoint_files


@pytest.fixture(scope="module")
def runs(tiny_runs):
    return tiny_runs


def test_import_after_install_needs_no_torch():
    code = "import sys; from deepfusion import Surrogate; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_fields_equal_infer_bitwise(runs, tmp_path):
    c = [3.2, 4.0, 5.75]
    proc = run_cli("infer", str(runs["burgers"]), *(a for v in c for a in ("--c", str(v))), "--out",
                   str(tmp_path / "u.h5"))
    assert proc.returncode == 0, proc.stderr
    s = Surrogate.load(runs["burgers"])
    with h5py.File(tmp_path / "u.h5") as f:
        np.testing.assert_array_equal(s(c=c), f["u"][()])
        assert f.attrs["checkpoint"] == str(s.checkpoint)
    assert set(s.grid) == {"t", "x"} and s.grid["x"].shape == (16,)
    assert s.parameter_range == (3.0, 6.0) and s.config.problem.family == "burgers"
    # Loading the checkpoint file alone gives the same surrogate.
    alone = Surrogate.load(checkpoint_files(runs["burgers"] / "checkpoints")[0])
    np.testing.assert_array_equal(alone(c=c), s(c=c))


@pytest.mark.float32
def test_chunks_and_threads_give_the_same_fields(runs):
    rng = np.random.default_rng(0)
    coeffs = rng.uniform(-3, 3, size=(7, 6))
    tiny = Surrogate.load(runs["poisson"], threads=1, memory_mb=1e-3)
    whole = Surrogate.load(runs["poisson"], threads=2)  # last: the process keeps this machine's default
    assert tiny.chunk == 1 and whole.chunk >= 7
    u = whole(a=coeffs)
    assert u.shape == (7, 16, 16) and u.dtype == np.float64
    # Other batch sizes and thread counts change only float32 rounding inside the network (conftest).
    atol = float32_atol(runs["poisson"], np.abs(u).max())
    np.testing.assert_allclose(tiny(a=coeffs), u, rtol=0, atol=atol)
    # One row, and fields of nu instead of KL rows, are accepted too.
    np.testing.assert_allclose(whole(a=coeffs[0]), u[:1], rtol=0, atol=atol)
    nu = np.exp(rng.normal(size=(2, 16, 16)))
    assert whole(nu=nu).shape == (2, 16, 16)
    # Under the family's own name (the field files' dataset): a = the KL rows.
    assert np.array_equal(whole(a=coeffs), whole(coeffs))  # the parameter by its name, or positionally


@pytest.mark.parametrize("run, kwargs, fragment", [
    ("burgers", {"c": [-1.0]}, "c: instance 0: c = -1; every entry must be finite and > 0"),
    ("burgers", {"c": [np.nan]}, "NaN or Inf"),
    ("burgers", {"c": []}, "non-empty"),
    ("burgers", {"coeffs": np.zeros((1, 6))}, "coeffs: this run's family (burgers) takes its instances as c (the generic "
                                              "'coeffs' of earlier versions is retired)"),
    ("burgers", {"c": "four"}, "expected numbers"),
    ("poisson", {"c": [4.0]}, "c: this run's family (poisson) takes its instances as a (rows of 6) or nu (nodal fields)"),
    ("poisson", {}, "this run's family (poisson) takes its instances as a (rows of 6) or nu (nodal fields)"),
    ("poisson", {"a": np.zeros((2, 5))}, "a: each instance must have shape (6,)"),
    ("poisson", {"nu": np.ones((1, 8, 8))}, "the run's resolution"),
    ("poisson", {"nu": -np.ones((1, 16, 16))}, "nu: nu must be > 0 everywhere"),
    ("poisson", {"k": [1.0]}, "k: this run's family (poisson) takes its instances as a (rows of 6) or nu (nodal fields)"),
    ("poisson", {"a": np.zeros((1, 6)), "nu": np.ones((1, 16, 16))}, "this run's family (poisson) takes exactly one of a "
                                                                     "(rows of KL coefficients) or nu (nodal nu fields)"),
    ("burgers", {"c": [4.0, 9.0], "a": [1.0]}, "a: this run's family (burgers) takes its instances as c"),
    ("poisson", {"a": torch.zeros(1, 6, requires_grad=True)}, "a: a tensor that requires grad"),
])
def test_bad_input_raises_input_error(runs, run, kwargs, fragment):
    s = Surrogate.load(runs[run])
    with pytest.raises(InputError, match=re.escape(fragment)):
        s(**kwargs)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"device": "tpu"}, "device: must be"),
    ({"threads": 0}, "threads: must be"),
    ({"memory_mb": 0}, "memory_mb: must be > 0"),
])
def test_bad_load_options(runs, kwargs, fragment):
    with pytest.raises(InputError, match=fragment):
        Surrogate.load(runs["burgers"], **kwargs)


def test_missing_run_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="no such run directory or checkpoint"):
        Surrogate.load(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="not a run directory"):
        Surrogate.load(tmp_path / "empty")


def test_outside_the_training_range_warns(runs):
    s = Surrogate.load(runs["burgers"])
    with pytest.warns(ParameterRangeWarning, match=r"7 is outside the training range \[3, 6\]"):
        s(c=[4.0, 7.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # inside the range: no warning at all
        s(c=[3.0, 6.0])
    with pytest.warns(ParameterRangeWarning, match="outside the training range"):
        Surrogate.load(runs["poisson"])(a=np.full((1, 6), 3.5))


def test_infer_warns_outside_the_range_on_one_line(runs, tmp_path):
    proc = run_cli("infer", str(runs["burgers"]), "--c", "7", "--out", str(tmp_path / "u.h5"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "deepfusion: warning: --c: 7 is outside the training range [3, 6]; " \
                                  "the field is an extrapolation"
    assert "1 field (16, 16)" in proc.stdout and "from checkpoint" in proc.stdout


def test_polish_moves_the_fields_to_the_grids_fem_solution(runs, tmp_path):
    """``polish=k``: k multigrid V-cycles from the network's fields; ``infer --polish k`` writes the same."""
    s = Surrogate.load(runs["poisson"])
    coeffs = np.random.default_rng(4).uniform(-3, 3, size=(2, 6))
    fem = s.family.reference(coeffs, method="direct")
    distance = [np.abs(s(a=coeffs, polish=k) - fem).max() for k in (0, 1, 3)]
    assert distance[1] < 0.5 * distance[0] and distance[2] < 0.5 * distance[1]
    np.save(tmp_path / "a.npy", coeffs)
    proc = run_cli("infer", str(runs["poisson"]), "--param", "a=" + str(tmp_path / "a.npy"), "--polish", "1",
                   "--out", str(tmp_path / "u.h5"))
    assert proc.returncode == 0, proc.stderr
    assert "+ 1 polish iteration" in proc.stdout
    with h5py.File(tmp_path / "u.h5") as f:
        assert f.attrs["polish"] == 1
        np.testing.assert_array_equal(f["u"][()], s(a=coeffs, polish=1))
    with pytest.raises(InputError, match="polish: must be an integer"):
        s(a=coeffs, polish=-1)
    # The tiny Burgers run trained the central (Sobel) residual: no scheme to polish with.
    with pytest.raises(InputError, match=r"the burgers family \(as configured\) does not declare the 'polish' capability"):
        Surrogate.load(runs["burgers"])(c=[4.0], polish=1)
    bad = run_cli("infer", str(runs["poisson"]), "--param", "a=" + str(tmp_path / "a.npy"), "--polish", "-2",
                  "--out", str(tmp_path / "v.h5"))
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == ["deepfusion: error: --polish: must be in 0..1000, got -2"]


def test_values_at_points_are_the_fields_read_by_the_shape_functions(runs):
    s = Surrogate.load(runs["poisson"])
    coeffs = np.random.default_rng(2).uniform(-3, 3, size=(3, 6))
    u = s(a=coeffs)
    n_y, n_x = u.shape[1:]
    nodes = np.array([[3 / (n_x - 1), 5 / (n_y - 1)], [1.0, 1.0]])  # x first: node (y 5, x 3), and the last corner
    got = s.at(nodes, a=coeffs)
    np.testing.assert_allclose(got, np.stack([u[:, 5, 3], u[:, -1, -1]], axis=1), atol=1e-12)
    mid = np.array([[0.5 * (3 + 4) / (n_x - 1), 5 / (n_y - 1)]])  # half-way along an element's edge
    np.testing.assert_allclose(s.at(mid, a=coeffs)[:, 0], 0.5 * (u[:, 5, 3] + u[:, 5, 4]), atol=1e-12)
    both = s.at(nodes, a=coeffs, outputs=["u", "flux_x"])
    assert both["u"].shape == both["flux_x"].shape == (3, 2)
    flux = s(a=coeffs, outputs=["flux_x"])["flux_x"]
    np.testing.assert_allclose(both["flux_x"][:, 0], flux[:, 5, 3], atol=1e-12)
    with pytest.raises(InputError, match="points: point 0 .* outside the unit square"):
        s.at([[1.5, 0.5]], a=coeffs)
    guide = (ROOT / "docs" / "user-guide.md").read_text()
    start = guide.index("wells = [[0.25")
    scope = {"poisson": s, "rows": coeffs}
    exec(guide[start:].split("```")[0], scope)  # the user guide's lines, as written
    assert scope["heads"].shape == (3, 3) and scope["both"]["flux_x"].shape == (3, 3)
    np.testing.assert_allclose(scope["heads"], scope["both"]["u"])


def test_the_user_guides_gradient_and_inverse_examples_run_as_written(runs, tmp_path, monkeypatch):
    s = Surrogate.load(runs["poisson"])
    guide = (ROOT / "docs" / "user-guide.md").read_text()
    wells = [[0.25, 0.5], [0.7, 0.1], [0.9, 0.9]]
    scope = {"poisson": s, "wells": wells}
    start = guide.index("a = torch.zeros(1, 6")
    exec("import torch\n" + guide[start:].split("```")[0], scope)  # the gradient example, as written
    assert scope["a"].grad.shape == (1, 6) and scope["J"].shape == (1, 3, 6)
    np.testing.assert_allclose(scope["J"][0].T @ (scope["heads"].detach().numpy()[0] - [0.8, 0.3, 0.1]) / 0.01**2,
                               scope["a"].grad.numpy()[0], rtol=1e-6, atol=1e-6 * float(scope["a"].grad.abs().max()))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "wells.csv").write_text("x,y,output,value,sigma\n" + "".join(f"{x},{y},u,{v},0.01\n" for (x, y), v in
                                                                          zip(wells, (0.8, 0.3, 0.1))))
    start = guide.index("from deepfusion.analysis.inverse import laplace")
    exec(guide[start:].split("```")[0], scope)  # the inverse example, as written
    assert scope["best"].map.shape == (6,) and scope["posterior"]["std"].shape == (6,)
    assert scope["best"].objective <= scope["best"].initial.min()
