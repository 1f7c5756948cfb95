"""``model.polish`` (diffnet/product/polished.py): a finished run's product finished by its family's classical polish
step, gained by its config alone (the run is evaluated again), reported as the product, given by the Python API,
without gradients."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch

from helpers import run_cli
from deepfusion import InputError, Surrogate
from deepfusion.training.rundir import training_time


def test_a_finished_run_gains_the_polish_by_its_config_and_every_path_gives_the_polished_product(tiny_runs, tmp_path):
    run_dir = tmp_path / "poisson"
    shutil.copytree(tiny_runs["poisson"], run_dir)  # the session's run is read only
    before = json.loads((run_dir / "eval.json").read_text())
    (run_dir / "eval.json").unlink()  # as when the first evaluation died: the training time comes from metrics.jsonl
    proc = run_cli("train", str(run_dir / "config.toml"), "--out", str(run_dir), "--set", "model.polish=2")
    assert proc.returncode == 0, proc.stderr
    assert "evaluating it again" in proc.stdout
    assert "product: U-Net -> 2 V-cycles (the first stage trains" in proc.stdout  # the banner
    assert "\nproduct: U-Net -> 2 V-cycles\n" in proc.stdout and "; the polish " in proc.stdout  # the evaluation's
    after = json.loads((run_dir / "eval.json").read_text())
    assert after["mean_floor"] == pytest.approx(before["mean_floor"])
    # the seconds as logged, to the last logged step
    assert 0 < after["train_seconds"] == training_time(run_dir)[0] <= before["train_seconds"]
    # Two V-cycles from a two-epoch network: most of the way to the grid's own solution.
    assert after["ratio_to_floor"] < 1 + 0.25 * (before["ratio_to_floor"] - 1)
    assert after["inference_parts_per_instance_s"]["polish"] > 0

    plain, polished = Surrogate.load(tiny_runs["poisson"]), Surrogate.load(run_dir)
    # The product polishes the instances as the network saw them (in its float32): the same rows here.
    a = plain.run.heldout.astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(polished.fields(a), plain.fields(a, polish=2), rtol=0, atol=1e-12)
    np.save(tmp_path / "a.npy", a[:1])
    proc = run_cli("infer", str(run_dir), "--param", "a=" + str(tmp_path / "a.npy"), "--out", str(tmp_path / "u.h5"))
    assert proc.returncode == 0 and "+ 2 polish iterations" in proc.stdout, proc.stderr
    with h5py.File(tmp_path / "u.h5") as f:
        np.testing.assert_array_equal(f["u"][()], polished.fields(a[:1]))
        assert f.attrs["polish"] == 2
    assert plain.exact_gradients and not polished.exact_gradients  # inverse problems take central differences
    with pytest.raises(InputError, match=r"product \(U-Net -> 2 V-cycles\) has no exact gradients in the instances \(2 "
                                         r"V-cycles: numpy steps without gradients\)"):
        polished.evaluate(torch.as_tensor(a[:1]))


def test_compare_names_the_polished_product():
    from diffnet.families.burgers import BurgersFamily
    from diffnet.generators.networks import UNet
    from diffnet.product.product import Finish, Product

    family = BurgersFamily((9, 17), stencil="conservative")
    network = UNet(family.in_channels, 1, (4, 8))
    assert Product(family, network).name() == "DiffNet"
    polished = Product(family, network, Finish(polish=2))
    assert polished.name() == "DiffNet + 2 Newton steps" and polished.chain() == "U-Net -> 2 Newton steps"


@pytest.mark.slow
def test_burgers_trained_with_the_polish_reports_the_hybrid_at_its_floor(tmp_path):
    """The issue's Burgers row as a user runs it: the conservative residual, two Newton steps of its scheme finish
    the product, and the evaluation's table is the hybrid's (a 16^2 network at ten epochs alone is far off)."""
    from helpers import ROOT, TINY

    tiny = [a for pair in zip(TINY[::2], TINY[1::2]) if pair[1] != "burgers.residual=sobel" for a in pair]
    proc = run_cli("train", str(ROOT / "configs" / "burgers.toml"), "--out", str(tmp_path / "run"), *tiny,
                   "--set", "burgers.residual=conservative", "--set", "model.polish=2", "--set", "output.plots=false",
                   "--set", "burgers.test_c=[4.1]")
    assert proc.returncode == 0, proc.stderr
    assert "product: U-Net -> 2 Newton steps (the first stage trains" in proc.stdout
    report = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert report["ratio_to_floor"] < 1.05
    assert report["inference_parts_per_instance_s"]["polish"] > 0
    # The benchmark that sets the hybrid against the same marching without the network (docs/results.md), end to end.
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "residual_correction.py"), str(tmp_path / "run"),
                           "--coarse", "--steps", "1", "2", "--samples", "1", "--out", str(tmp_path / "arms.json")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    arms = {row["arm"]: row for row in json.loads((tmp_path / "arms.json").read_text())["rows"]}
    assert list(arms) == ["network", "1 Newton step", "2 Newton steps", "no network: the scheme, 1 Newton iteration "
                          "a row", "no network: the scheme, 2 Newton iterations a row", "the scheme's own solve"]
    assert arms["2 Newton steps"]["ratio"] == pytest.approx(report["ratio_to_floor"], rel=1e-6)  # the same instance
    assert arms["no network: the scheme, 2 Newton iterations a row"]["vs the scheme's solution"] < 0.05
