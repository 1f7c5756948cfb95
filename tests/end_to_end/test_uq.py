"""``deepfusion uq`` (deepfusion/commands/uq.py): the streamed moments, the draws, and the statistics files on tiny trained runs."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from helpers import float32_atol, run_cli
from deepfusion.analysis.uq import Moments, draw_parameters

def test_merged_moments_equal_the_direct_ones():
    rng = np.random.default_rng(0)
    data = 100.0 + rng.normal(size=(103, 4, 5))  # an offset that would cancel digits in a sum of squares
    m = Moments()
    for chunk in np.split(data, [1, 7, 40, 41, 90]):
        m.add(chunk)
    assert m.count == 103
    np.testing.assert_allclose(m.mean, data.mean(axis=0), rtol=1e-13)
    np.testing.assert_allclose(m.std, data.std(axis=0, ddof=1), rtol=1e-11)


def test_draws_follow_the_family():
    from diffnet.families.burgers import BurgersFamily
    from diffnet.families.poisson import PoissonFamily

    burgers = BurgersFamily((9, 9), c_range=(3.0, 6.0))
    c = draw_parameters(burgers, 500, "uniform", 1)
    assert c.shape == (500,) and 3.0 <= c.min() and c.max() <= 6.0
    kl = PoissonFamily((9, 9), coeff_range=(-3.0, 3.0), kl_terms=6)
    a = draw_parameters(kl, 2000, "normal", 1)
    assert a.shape == (2000, 6) and abs(a.mean()) < 0.05 and abs(a.std() - 1.0) < 0.05
    assert np.array_equal(draw_parameters(kl, 5, "uniform", 3), draw_parameters(kl, 5, "uniform", 3))
    with pytest.raises(ValueError):
        draw_parameters(burgers, 5, "normal", 1)


@pytest.mark.float32
@pytest.mark.parametrize("name, key", [("burgers", "c"), ("poisson", "a")])
def test_statistics_match_numpy_over_the_same_instances(tiny_runs, tmp_path, name, key):
    run_dir = tiny_runs[name]
    out = tmp_path / "stats.h5"
    proc = run_cli("uq", str(run_dir), "--samples", "37", "--batch", "8", "--classical", "--reference-samples", "5",
                   "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    with h5py.File(out) as f:
        params, mean, std = f[key][...], f["mean"][...], f["std"][...]
        classical_mean = f["classical_mean"][...]
        assert f.attrs["samples"] == 37 and f.attrs["std_divisor"] == "N - 1"
    from deepfusion import Surrogate

    surrogate = Surrogate.load(run_dir)
    assert len(params) == 37
    # uq's own chunking (--batch 8) is the same float32 computation, so only the streamed moments'
    # float64 arithmetic separates its statistics from numpy's over the same fields.
    u = np.concatenate([surrogate.fields(params[i : i + 8]) for i in range(0, 37, 8)])
    np.testing.assert_allclose(mean, u.mean(axis=0), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(std, u.std(axis=0, ddof=1), rtol=1e-9, atol=1e-12)
    # All 37 in one call is another batch shape: equal to float32 rounding, not bitwise (conftest).
    whole = surrogate.fields(params)
    atol = float32_atol(run_dir, np.abs(u).max())
    np.testing.assert_allclose(whole, u, rtol=0, atol=atol)
    # A mean moves by at most the fields' largest change; a standard deviation by at most twice it.
    np.testing.assert_allclose(mean, whole.mean(axis=0), rtol=0, atol=atol)
    np.testing.assert_allclose(std, whole.std(axis=0, ddof=1), rtol=0, atol=2 * atol)
    assert classical_mean.shape == mean.shape
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["reference_samples"] == 5 and summary["classical_seconds"] > 0
    for side in ("diffnet", "classical"):
        assert 0 < summary[f"mean_error_{side}"] < 10 and 0 < summary[f"std_error_{side}"] < 10
    per_classical, per_diffnet = summary["classical_seconds"] / 37, summary["diffnet_seconds"] / 37
    if per_classical > per_diffnet:
        assert summary["break_even_samples"] == pytest.approx(summary["train_seconds"] / (per_classical - per_diffnet))
    else:
        assert summary["break_even_samples"] is None
    assert "<Attribute Name=\"std\"" in out.with_suffix(".xdmf").read_text()
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert "DiffNet: 37/37 instances" in proc.stdout and "break-even for this study" in proc.stdout
    if name == "poisson":  # the classical match ties the flux too, as compare's does
        assert "flux_x" in proc.stdout and "binds" in proc.stdout


def test_bad_uq_input_is_one_line_and_status_2(tiny_runs, tmp_path):
    run_dir = tiny_runs["burgers"]
    for args, message in [(["--samples", "1"], "--samples: must be in 2..10000000"),
                          (["--samples", "8", "--distribution", "normal"], "--distribution: the burgers family draws from uniform (got 'normal')"),
                          (["--samples", "8", "--distribution", "levy"], "draws from uniform (got 'levy')"),
                          (["--samples", "8", "--batch", "0"], "--batch")]:
        proc = run_cli("uq", str(run_dir), *args, "--out", str(tmp_path / "s.h5"))
        assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "s.h5").exists()
