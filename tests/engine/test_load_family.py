"""``deepfusion.load_family`` (deepfusion/family.py): a config's family from Python without a trained run, its classical side at hand."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import ROOT
from deepfusion import load_family
from deepfusion.configuration.schema import ConfigError


def test_a_configs_family_solves_without_a_trained_run():
    family = load_family(ROOT / "configs" / "poisson.toml", ["problem.resolution=[9, 9]", "multigrid.levels=[]",
                                                             "model.coarse_correction=0", "model.sweeps=0"])
    assert family.name == "poisson" and tuple(family.resolution) == (9, 9)
    rows = np.array([[0.5, -1.0, 0.0, 2.0, 0.0, 0.3], [0.0] * 6])
    fields, converged = family.discrete_optimum(rows)
    assert fields.shape == (2, 9, 9) and converged.all()
    # The same-grid solve is the direct solve of the same system: two routes, one field.
    direct = family.classical_solver("cholesky", 9)
    for row, u in zip(rows, fields):
        np.testing.assert_allclose(family.classical_to_grid("cholesky", direct(row), row), u, atol=1e-10)


def test_a_bad_override_is_one_line():
    with pytest.raises(ConfigError, match="problem.resolution") as info:
        load_family(ROOT / "configs" / "poisson.toml", ["problem.resolution=[33, 33]"])
    assert "\n" not in str(info.value)


def test_the_user_guides_example_runs_as_written(monkeypatch):
    guide = (ROOT / "docs" / "user-guide.md").read_text()
    start = guide.index("from deepfusion import load_family")
    snippet = guide[guide.rindex("```python", 0, start) + len("```python"):].split("```")[0]
    monkeypatch.chdir(ROOT)  # its config path is the repository's
    scope: dict = {}
    exec(snippet, scope)  # the guide's lines, as written
    assert scope["family"].kl_modes == "tensor" and scope["head"].shape == (4, 33, 33) and scope["converged"].all()
    assert scope["flux"].shape == (4, 33, 33)
    np.testing.assert_allclose(scope["first"], scope["head"][0], atol=1e-9)
