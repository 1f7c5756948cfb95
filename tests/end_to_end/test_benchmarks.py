"""The benchmark scripts start (argument parsing, imports), use the library rather than the command line,
and the FLOP/s benchmark runs the trainer's own step end to end on a small grid."""

import json
import subprocess
import sys

import pytest
from helpers import ROOT

BENCH = ROOT / "benchmarks"
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if p.name not in ("launch.py", "curves.py"))  # those two are helpers


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_help_runs_and_the_command_line_is_not_imported(script):
    assert "deepfusion.cli" not in script.read_text()
    out = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage:")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the CPU-only answer")
def test_the_gpu_check_says_in_one_line_that_it_needs_a_gpu():
    out = subprocess.run([sys.executable, str(BENCH / "gpu_check.py")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and json.loads(out.stdout) == {"error": "no CUDA device: this check needs one GPU"}


def test_flops_benchmark_times_a_training_step(tmp_path):
    out = subprocess.run([sys.executable, str(BENCH / "flops.py"), "--grids", "32", "--batch", "1", "--steps", "1",
                          "--repeats", "1", "--gemm", "256", "--threads", "1"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["gemm_gflops"] > 0
    assert {r["layout"] for r in report["rows"]} == {"contiguous", "channels_last"}
    for row in report["rows"]:
        # Counts and signs only: the rates are timings, reported as figures, never a pass or a fail.
        assert row["grid"] == 32 and row["step_s"] > 0 and row["step_gflop"] > 0 and row["ratio_vs_gemm"] > 0


@pytest.mark.slow
@pytest.mark.needs_mpiexec
def test_scaling_benchmark_trains_on_one_two_and_four_ranks(tmp_path):
    out = subprocess.run([sys.executable, str(BENCH / "scaling.py"), "--resolutions", "32", "--epochs", "2",
                          "--samples", "8", "--batch", "4", "--reps", "3"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert [(m["resolution"], m["ranks"]) for m in report["measured"]] == [(32, 1), (32, 2), (32, 4)]
    for m in report["measured"]:
        assert m["strong"]["epoch_s"] > 0 and m["weak"]["epoch_s"] > 0
    assert report["allreduce_fit"]["bandwidth_gb_s"] > 0


def test_curves_are_read_at_an_error_and_at_a_time():
    sys.path.insert(0, str(BENCH))
    from curves import time_to, value_at

    points = [{"seconds": 10.0, "error": 0.1}, {"seconds": 20.0, "error": 0.01}, {"seconds": 30.0, "error": 0.02}]
    assert time_to(points, 0.1) == 10.0
    assert abs(time_to(points, 0.0316227766) - 15.0) < 1e-9  # halfway in log error
    assert time_to(points, 0.001) is None
    assert abs(value_at(points, 15.0) - 0.0316227766) < 1e-9
    assert abs(value_at(points, 5.0) - 0.1) < 1e-15 and abs(value_at(points, 99.0) - 0.02) < 1e-15


@pytest.mark.slow
def test_optimizer_benchmark_tunes_every_arm_and_reports_both_figures(tmp_path):
    """Every arm on a 16^2 Burgers problem with a tiny network, one rank, one seed, 0.3 s budgets (20 runs:
    the tuning grid and the calibration are the claim; each run's cost is its interpreter's start)."""
    out = subprocess.run([sys.executable, str(BENCH / "optimizers.py"), "--problem", "burgers", "--seeds", "0",
                          "--budget", "0.3", "--ranks", "1", "--set", "problem.resolution=[16,16]",
                          "--set", "model.channels=[4,8]", "--set", "parallel.threads_per_rank=1",
                          "--set", "burgers.test_c=[3.3,5.5]",
                          "--plot", str(tmp_path / "opt.png")],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    res = report["problems"]["burgers"]
    assert set(res["arms"]) == {"sgd", "adam", "lbfgs", "multibatch", "adam+lbfgs"}
    assert len(res["arms"]["adam"]["candidates"]) == 4 and len(res["arms"]["adam+lbfgs"]["candidates"]) == 3
    # The choice is the candidate with the lowest validation error.
    for arm in res["arms"].values():
        ok = {k: v["validation"] for k, v in arm["candidates"].items() if not v["failed"]}
        assert ok and arm["chosen"] == min(ok, key=ok.get)
    lbfgs = res["arms"]["lbfgs"]["seeds"]["0"]
    assert lbfgs["lbfgs"]["evaluations_per_iteration"] >= 1 and lbfgs["lbfgs"]["stop_reason"]
    assert res["lbfgs_float64"]["lbfgs"]["iterations"] >= 2
    for key in ("lbfgs_vs_sgd_time_to_error", "best_second_order_vs_adam_error_at_equal_time"):
        assert report[key]["burgers"] is None or report[key]["burgers"] > 0
    assert report["best_second_order_vs_adam_error_at_equal_time"]["burgers"] is not None
    assert (tmp_path / "opt.png").stat().st_size > 10_000


@pytest.mark.slow
@pytest.mark.parametrize("case, arms", [("poisson", ["multilevel_galerkin"]), ("loss", ["energy", "preconditioned_target"])])
def test_accuracy_ablation_trains_its_arms_to_one_budget(tmp_path, case, arms):
    out = subprocess.run([sys.executable, str(BENCH / "accuracy_ablation.py"), "--resolution", "64", "--budget-s", "2",
                          "--n-train", "16", "--batch", "8", "--probe-steps", "3", "--n-test", "1", "--ranks", "1",
                          "--case", case, "--arms", *arms],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert set(report["arms"]) == set(arms) and report["levels"] == [32, 64]
    if case == "loss":  # the preconditioned arm reports the error on its grid beside its estimate
        row = report["arms"]["preconditioned_target"]
        assert row["mean_estimated_grid_rel_l2"] > 0 and row["mean_grid_rel_l2"] > 0
        assert report["arms"]["energy"]["step_time_vs_first_arm"] == 1.0
    for arm, row in report["arms"].items():
        assert report[f"ratio_{arm}"] == pytest.approx(row["ratio_to_floor"], rel=1e-2)
        assert len(row["epochs"]) == 2 and all(e >= 1 for e in row["epochs"]) and row["mean_floor"] > 0
        assert 0 <= row["mean_low_mode_share"] <= 1 and -1 <= row["mean_imprint_cosine"] <= 1
    assert report["best_arm"] in report["arms"]


def test_level_change_splits_the_loss_at_a_level_change(tmp_path):
    from helpers import ROOT, run_cli

    run = tmp_path / "run"
    proc = run_cli("train", str(ROOT / "configs" / "burgers.toml"), "--out", str(run),
                   "--set", "problem.resolution=[16,16]", "--set", "model.channels=[8,16]", "--set", "data.n_train=8",
                   "--set", "train.batch_size=4", "--set", "multigrid.levels=[8,16]", "--set", "multigrid.epochs=[3,2]",
                   "--set", "multigrid.top_channels=4", "--set", "train.log_every=1", "--set", "train.keep_checkpoints=0",
                   "--set", "burgers.test_c=[4.0]", "--set", "output.plots=false", "--set", "parallel.threads_per_rank=1")
    assert proc.returncode == 0, proc.stderr
    out = subprocess.run([sys.executable, str(BENCH / "level_change.py"), str(run)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    (change,) = json.loads(out.stdout)["changes"]
    assert change["from_grid"] == [8, 8] and change["to_grid"] == [16, 16] and change["step"] == 6
    for key in ("coarse_loss", "galerkin_loss", "new_level_loss", "last_logged_loss", "first_logged_loss"):
        assert change[key] > 0, key


@pytest.mark.slow  # 4 s with numba's cache warm, 12 s in a fresh clone (the first use of the compiled multigrid)
def test_fem_race_times_both_pipelines_at_equal_accuracy(tmp_path):
    out = subprocess.run([sys.executable, str(BENCH / "fem_vs_inference.py"), "--grids", "33", "--grids3d", "17",
                          "--scaling", "17", "33", "--instances", "1"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    (row,) = report["race"]["33"]["instances"]
    # Both sides at the same accuracy: a tenth of the grid's discretisation error.
    assert row["gmg_meets_target"] and row["pyamg_default_sweep"][-1]["error"] <= row["target_error"]
    assert row["pipeline_s"] >= row["gmg_s"] > 0 and row["assembly_with_csr_s"] >= 0
    assert report["pipeline_vs_pyamg_default_33"] == round(row["pyamg_pipeline_over_pipeline"], 2) > 0
    (row3,) = report["race"]["17^3"]["instances"]  # 3-D: the hexahedral multigrid against pyamg's default
    assert row3["dims"] == 3 and row3["gmg_meets_target"] and row3["pyamg_default_sweep"][-1]["error"] <= row3["target_error"]
    assert report["gmg3d_vs_pyamg_default_16"] == round(row3["pyamg_over_gmg"], 2) > 0
    assert [r["grid"] for r in report["scaling"]] == [17, 33]
    assert all(r["seconds_per_unknown"] > 0 for r in report["scaling"])


@pytest.mark.slow
def test_second_stage_runs_both_arms_at_one_budget(tmp_path):
    out = subprocess.run([sys.executable, str(BENCH / "second_stage.py"), "--resolution", "32", "--budget-s", "2",
                          "--n-train", "16", "--batch", "8", "--probe-steps", "2", "--n-test", "1", "--ranks", "1"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    one, two = report["one_stage"], report["two_stages"]
    assert two["second_stage_epochs"] >= 1 and one["mean_floor"] == pytest.approx(two["mean_floor"])
    assert report["step_seconds"]["second_stage"] > 0
    assert one["ratio_with_one_polish_v_cycle"] < one["ratio_to_floor"]  # a V-cycle from a 2-step network helps
    assert report["ratio_two_stages"] == pytest.approx(two["ratio_to_floor"], rel=1e-2)
    assert two["mean_grid_rel_l2"] > 0 and two["first_stage_ratio_to_floor"] > 0


def test_residual_precision_reports_both_estimates(tmp_path):
    out = subprocess.run([sys.executable, str(BENCH / "residual_precision.py"), "--resolution", "33", "--instances", "2"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout)["rows"]
    for row in rows[:2]:  # a coarse error: both residuals see it, and the estimate is of its size
        assert row["estimate_float64"] == pytest.approx(row["estimate_float32"], rel=1e-3)
        assert 0.3 < row["estimate_float64"] / row["true_rel_error"] < 3


def test_floor_order_measures_both_families_at_order_two(tmp_path):
    out = subprocess.run([sys.executable, str(BENCH / "floor_order.py"), "--grids", "17", "33", "--instances", "2"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    for name in ("torsion", "plate"):
        coarse, fine = report["families"][name]
        assert 0 < fine["floor"] < coarse["floor"] < 0.1
        assert 1.7 < fine["order"] < 2.4  # the method's order 2 (measured 1.91 and 2.01)


def test_family_check_separates_a_familys_own_solution_from_one_ten_percent_off(tmp_path):
    # Relations that follow from the maths: a linear family 10 % off has the ratio 0.1 exactly; its own solution,
    # solved directly, sits far below the tolerance.
    out = subprocess.run([sys.executable, str(BENCH / "family_check.py"), str(ROOT / "configs" / "poisson.toml"),
                          "--set", "problem.resolution=[17,17]", "--set", "multigrid.levels=[]"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    (row,) = report["rows"]
    assert row["grid"] == [17, 17] and row["family"] == "poisson" and report["all_separated"]
    assert row["ratio_own_solution"] < 1e-6 < row["tolerance"] < row["ratio_ten_percent_off"]
    assert row["ratio_ten_percent_off"] == pytest.approx(0.1, rel=1e-6)


def test_product_cost_times_every_part_of_a_two_stage_product_against_its_grids_classical_solve(tmp_path):
    out = subprocess.run([sys.executable, str(BENCH / "product_cost.py"), str(ROOT / "configs" / "poisson.toml"),
                          "--set", "problem.resolution=[33,33]", "--set", "multigrid.levels=[17,33]",
                          "--set", "model.coarse_correction=9", "--set", "train.loss=preconditioned",
                          "--set", "train.second_stage_epochs=1", "--samples", "2", "--batch", "2", "--against", str(ROOT)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    (row,) = json.loads(out.stdout)["rows"]
    # Every part of the product's clock ran (timings are figures, never a pass or a fail: signs only).
    assert set(row["parts_ms_per_instance"]) == {"network", "fine Hessian", "coarse operator A_c", "factorisation",
                                                 "coarse solves", "loss gradient", "V-cycle", "sweeps"}
    assert all(v > 0 for v in row["parts_ms_per_instance"].values())
    assert row["grid"] == [33, 33] and row["second_stage"] and row["coarse_correction"] == 9
    assert 0 < row["correction_share"] < 1 and row["classical_method"] == "fmg" and row["classical_grid"] == 33
    assert row["classical_over_product"] == pytest.approx(row["classical_ms"] / row["product_ms_batched"], rel=1e-9)
    # --against: the same product timed by another checkout's code in a process of its own (here this one's).
    assert row["against_product_ms_batched"] > 0 and row["against_product_ms_single"] > 0
    assert row["speed_up_batched"] == pytest.approx(row["against_product_ms_batched"] / row["product_ms_batched"])
