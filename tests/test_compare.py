"""``deepfusion compare``: the report's fields, and its FEM side against the Poisson reference solver."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from conftest import ROOT, TINY, run_cli, train_once
from deepfusion.compare import time_inference, time_reference
from diffnet.problems.poisson import PoissonProblem, sample_coefficients
from diffnet.problems.reaction_diffusion import ReactionDiffusionProblem

POISSON = str(ROOT / "configs" / "poisson.toml")
BURGERS = str(ROOT / "configs" / "burgers.toml")
TIMINGS = ("fem_assembly_s", "fem_solve_s", "fem_amg_setup_s", "fem_direct_solve_s", "inference_first_s",
           "inference_single_s", "inference_batched_per_instance_s", "speedup_single", "speedup_batched")


@pytest.fixture(scope="module")
def poisson_run(tmp_path_factory):
    run_dir, _ = train_once(tmp_path_factory, POISSON, "poisson", *TINY, "--set", "data.n_test=3",
                            "--set", "output.plots=false")
    return run_dir


def test_report_on_a_tiny_run_has_every_field(poisson_run, tmp_path):
    out = tmp_path / "cmp" / "report.json"
    proc = run_cli("compare", str(poisson_run), "--resolution", "16", "24", "--samples", "2", "--batch", "2",
                   "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["problem"] == "poisson" and report["samples"] == 2 and report["threads"] == 1
    assert report["model_load_s"] > 0 and report["amg_tol"] == 1e-8
    assert np.asarray(report["instances"]).shape == (2, 6)
    rows = report["rows"]
    assert [r["resolution"] for r in rows] == [[16, 16], [24, 24]]
    for row in rows:
        assert row["threads"] == 1 and row["reference"] == "fem" and row["inference_batch"] == 2
        assert row["fem_cg_iterations"] >= 1
        for key in TIMINGS:
            assert math.isfinite(row[key]) and row[key] > 0, (key, row[key])
        assert 0 <= row["fem_amg_vs_direct"] < 1e-6
    # The error needs a model trained at the grid: the run's 16 x 16 has it, 24 x 24 not.
    assert 0 < rows[0]["rel_l2"] <= rows[0]["rel_l2_max"] < 1
    assert rows[1]["rel_l2"] is None and rows[1]["rel_l2_max"] is None
    # The same held-out instances, the same error as the run's own evaluation.
    evaluation = json.loads((poisson_run / "eval.json").read_text())
    assert rows[0]["rel_l2_max"] == pytest.approx(max(evaluation["rel_l2"][:2]), rel=1e-4)
    table = out.with_suffix(".md").read_text().splitlines()
    assert len(table) == 4 and table[2].startswith("| 16×16 | 1 |")
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert "1 thread for both solvers" in proc.stdout and "no model trained at this grid" in proc.stdout


@pytest.mark.parametrize("problem", [PoissonProblem((33, 41)), ReactionDiffusionProblem((29, 29), kappa=2.0)])
def test_fem_side_equals_the_reference_solver(problem):
    a = sample_coefficients((-3.0, 3.0), 6, 3, "random", 11)
    fields, timings = time_reference(problem, a, tol=1e-11, say=lambda line: None)
    expected = problem.reference(a, method="direct")
    assert np.abs(fields - expected).max() < 1e-8
    assert timings["fem_assembly_s"] > 0 and timings["fem_solve_s"] >= timings["fem_amg_setup_s"] > 0
    assert timings["fem_direct_solve_s"] > 0 and timings["fem_amg_vs_direct"] < 1e-8


def test_inference_timing_reports_the_batched_fields():
    calls = []

    def predict(params, batch):
        calls.append((len(params), batch))
        return np.repeat(params[:, :, None], 2, axis=2)

    params = np.arange(6.0).reshape(3, 2)
    fields, timings = time_inference(predict, params, batch=8, say=lambda line: None)
    np.testing.assert_array_equal(fields[:, :, 0], params)
    # First call, each instance alone, then all of them batched.
    assert calls == [(1, 1), (1, 1), (1, 1), (1, 1), (3, 8)]
    assert timings["inference_batch"] == 3 and timings["inference_single_s"] > 0


def test_burgers_compares_against_godunov(tmp_path_factory, tmp_path):
    run_dir, _ = train_once(tmp_path_factory, BURGERS, "burgers", *TINY, "--set", "train.epochs=2",
                            "--set", "output.plots=false")
    out = tmp_path / "b.json"
    proc = run_cli("compare", str(run_dir), "--samples", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(out.read_text())["rows"]
    assert row["reference"] == "godunov" and row["fem_solve_s"] > 0 and row["fem_assembly_s"] is None
    assert row["resolution"] == [16, 16] and 0 < row["rel_l2"] < 2
    assert "Godunov" in out.with_suffix(".md").read_text()
