"""The two families under examples/families/, installed as packages (pip, into a temporary target) and
found through the ``deepfusion.families`` entry points: each trains on 1 and 2 ranks to the same
model, resumes bitwise, evaluates against its floor, infers, runs ``uq``, and ``compare`` or
``--polish`` where it declares them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest

from helpers import ROOT, run_cli, run_cli_jobs
from deepfusion.files.checkpoint import load_checkpoint

PLUGINS = ("advection_diffusion", "cubic_reaction")
QUICK = ["--set", "problem.resolution=[17,17]", "--set", "multigrid.levels=[9,17]", "--set", "multigrid.epochs=[2,1]",
         "--set", "model.channels=[8,16]", "--set", "data.n_train=16", "--set", "data.sampling=random",
         "--set", "data.n_test=2", "--set", "train.batch_size=8", "--set", "multigrid.batch_size=[]",
         "--set", "train.log_every=2", "--set", "train.checkpoint_every=4", "--set", "train.dtype=float64",
         "--set", "parallel.threads_per_rank=1", "--set", "output.plots=false"]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """Both example projects built and installed with pip into a temporary target (the checkout stays clean)."""
    root = tmp_path_factory.mktemp("plugins")
    for name in PLUGINS:
        shutil.copytree(ROOT / "examples" / "families" / name, root / name)
    target = root / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                           "--no-index", "--target", str(target), *(str(root / name) for name in PLUGINS)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return target


@pytest.fixture(scope="module")
def runs(site, tmp_path_factory):
    """Each example family trained on one process (float64; checkpoints at steps 4 and 6)."""
    out = {}
    for name in PLUGINS:
        out[name] = tmp_path_factory.mktemp("run") / name
        proc = _train(site, name, out[name])
        assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def two_ranks(site, tmp_path_factory):
    """Each example family trained on 2 ranks, both in one MPI job (conftest.run_cli_jobs): {name: (proc, dir)}."""
    work = tmp_path_factory.mktemp("p2")
    procs = run_cli_jobs(2, *(["train", _config(name), "--out", str(work / name), *QUICK] for name in PLUGINS),
                         path=[site], timeout=500)
    return {name: (proc, work / name) for name, proc in zip(PLUGINS, procs)}


def _config(name: str) -> str:
    return str(ROOT / "examples" / "families" / name / f"{name}.toml")


def _train(site, name: str, out, ranks: int | None = None, *extra: str):
    return run_cli("train", _config(name), "--out", str(out), *QUICK, *extra, path=[site], ranks=ranks, timeout=500)


def test_entry_points_register_the_families(site, monkeypatch):
    monkeypatch.syspath_prepend(str(site))
    from deepfusion.configuration.registry import family_class, known_families

    assert {"advection_diffusion", "cubic_reaction"} <= set(known_families())
    assert family_class("cubic_reaction").__module__ == "cubic_reaction"
    proc = run_cli("train", _config("cubic_reaction"), "--set", "problem.family=cubic_reactions", path=[site])
    assert proc.returncode == 2 and "known: advection_diffusion, burgers, cubic_reaction, cylinder, elastic_plate, elasticity, elasticity3d, groundwater, hyperelasticity, hyperelasticity3d, navier_stokes, plate, poisson" in proc.stderr


@pytest.mark.needs_mpiexec
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", PLUGINS)
@pytest.mark.slow
def test_plugin_trains_on_one_and_two_ranks_to_the_same_model(site, runs, two_ranks, tmp_path, name):
    proc, two = two_ranks[name]
    assert proc.returncode == 0, proc.stderr
    assert "ranks 2 x 1 threads" in proc.stdout
    a = load_checkpoint(runs[name] / "checkpoints" / "step-00000006.h5").model
    b = load_checkpoint(two / "checkpoints" / "step-00000006.h5").model
    for key in a:
        assert np.abs(a[key] - b[key]).max() <= 1e-9 * max(np.abs(a[key]).max(), 1.0), key
    report = json.loads((two / "eval.json").read_text())
    assert len(report["rel_l2"]) == 2 and report["mean_floor"] > 0 and report["ratio_to_floor"] >= 1
    with h5py.File(two / "test_reference.h5") as f:
        assert f.attrs["problem"] == name and f.attrs["source"] == "reference"
    # Resume from the step-4 checkpoint: bitwise the same step-6 model.
    copy = tmp_path / "resumed"
    shutil.copytree(runs[name], copy)
    (copy / "checkpoints" / "step-00000006.h5").unlink()
    proc = _train(site, name, copy)
    assert proc.returncode == 0 and "resuming from" in proc.stdout and "(step 4)" in proc.stdout, proc.stderr
    c = load_checkpoint(copy / "checkpoints" / "step-00000006.h5").model
    for key in a:
        np.testing.assert_array_equal(a[key], c[key], err_msg=key)


@pytest.mark.timeout(900)
def test_plugin_runs_infer_uq_compare_and_polish(site, runs, tmp_path):    # infer: the families' own names, a number or rows
    out = tmp_path / "v.h5"
    proc = run_cli("infer", str(runs["advection_diffusion"]), "--param", "v=0.7", "--param", "v=1.2", "--out", str(out),
                   path=[site])
    assert proc.returncode == 0, proc.stderr
    with h5py.File(out) as f:
        assert f["u"].shape == (2, 17, 17) and list(f["v"][()]) == [0.7, 1.2] and list(f["t"][()])[-1] == 0.25
    np.save(tmp_path / "a.npy", np.array([[0.5, -0.5]]))
    proc = run_cli("infer", str(runs["cubic_reaction"]), "--param", "a=" + str(tmp_path / "a.npy"), "--polish", "8",
                   "--out", str(out), path=[site])
    assert proc.returncode == 0 and "+ 8 polish iterations" in proc.stdout, proc.stderr
    with h5py.File(out) as f:
        polished = f["u"][()]
    sys.path.insert(0, str(site))
    try:
        from cubic_reaction import CubicReaction

        from deepfusion import Surrogate

        exact = CubicReaction((17, 17)).reference(np.array([[0.5, -0.5]]))
        surrogate = Surrogate.load(runs["cubic_reaction"])  # the Python API on a plugin's run
        assert surrogate.parameter_name == "a" and surrogate.parameter_range == (-1.0, 1.0)
        np.testing.assert_allclose(surrogate(a=[0.5, -0.5], polish=8), exact, rtol=0, atol=1e-8 * np.abs(exact).max())
    finally:
        sys.path.remove(str(site))
    assert np.abs(polished - exact).max() < 1e-8 * np.abs(exact).max()  # Newton steps from the network's field
    # uq on a plugin: uniform draws of its parameter
    proc = run_cli("uq", str(runs["cubic_reaction"]), "--samples", "6", "--out", str(tmp_path / "s.h5"), path=[site])
    assert proc.returncode == 0, proc.stderr
    with h5py.File(tmp_path / "s.h5") as f:
        assert f["a"].shape == (6, 2) and f["mean"].shape == (17, 17)
    # compare: the transport family declares its scheme as the classical solver; cubic_reaction does not.
    proc = run_cli("compare", str(runs["advection_diffusion"]), "--samples", "2", "--threads", "1",
                   "--out", str(tmp_path / "c.json"), path=[site])
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "c.json").read_text())
    assert report["problem"] == "advection_diffusion" and report["methods"] == {
        "bdf2-upwind2": "implicit BDF2 + second-order upwind, marched row by row"}
    assert report["rows"][0]["classical_method"] in (None, "bdf2-upwind2")
    proc = run_cli("compare", str(runs["cubic_reaction"]), "--out", str(tmp_path / "d.json"), path=[site])
    assert proc.returncode == 2 and "does not declare the 'classical' capability" in proc.stderr


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_plugin_stops_on_sigterm_resumes_and_guards_against_nan(site, tmp_path):
    import os
    import signal
    import time

    from helpers import child_env
    from deepfusion.files.checkpoint import latest_checkpoint

    long = ["--set", "multigrid.epochs=[40,20]", "--set", "train.checkpoint_every=1000"]
    straight = tmp_path / "straight"
    assert _train(site, "cubic_reaction", straight, None, *long).returncode == 0
    run_dir = tmp_path / "stopped"
    env = child_env()
    env["PYTHONPATH"] = f"{site}{os.pathsep}{env['PYTHONPATH']}"
    cmd = [sys.executable, "-m", "deepfusion", "train", _config("cubic_reaction"), "--out", str(run_dir), *QUICK, *long]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not ((run_dir / "metrics.jsonl").exists() and len((run_dir / "metrics.jsonl").read_text().splitlines()) >= 5):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "stopped by" in out, err
    stopped_at = load_checkpoint(latest_checkpoint(run_dir / "checkpoints")).step
    assert 10 <= stopped_at < 120
    proc = _train(site, "cubic_reaction", run_dir, None, *long)
    assert proc.returncode == 0 and f"(step {stopped_at})" in proc.stdout, proc.stderr
    a = load_checkpoint(latest_checkpoint(straight / "checkpoints")).model
    b = load_checkpoint(latest_checkpoint(run_dir / "checkpoints")).model
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    # An absurd learning rate: the u^4 energy overflows, the NaN guard ends the run with status 3.
    proc = _train(site, "cubic_reaction", tmp_path / "nan", None, "--set", "multigrid.lr=[1e10,1e10]",
                  "--set", "train.lr_schedule=constant", "--set", "train.checkpoint_every=1",
                  "--set", "train.dtype=float32")
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 3 and ("NaN or Inf" in last or "loss is inf" in last or "loss is nan" in last), last


def test_a_plugin_trains_on_the_preconditioned_loss_through_the_default_hessian(site, tmp_path):
    # cubic_reaction declares "precondition" and no hessian of its own: the engine reads the
    # linearisation of its nonlinear energy off 9 probes of the loss, on every level's grid.
    proc = _train(site, "cubic_reaction", tmp_path / "pre", None, "--set", "train.loss=preconditioned")
    assert proc.returncode == 0, proc.stderr
    assert "estimated by |B g| / |u - B g|" in proc.stdout

    report = json.loads((tmp_path / "pre" / "eval.json").read_text())
    measured, estimated = np.array(report["grid_rel_l2"]), np.array(report["estimated_grid_rel_l2"])
    assert (estimated > 0.3 * measured).all() and (estimated < 3 * measured).all(), (measured, estimated)
    # A family that does not declare it is refused in one line.
    proc = _train(site, "advection_diffusion", tmp_path / "no", None, "--set", "train.loss=preconditioned")
    assert proc.returncode == 2 and "and the preconditioned loss needs an energy (diffnet.Energy" in proc.stderr


def test_a_nonlinear_plugin_trains_with_its_coarse_minimiser_and_one_without_a_hessian_is_refused(site, tmp_path):
    # The cubic plugin's config ships the coarse correction: its field is the energy's minimiser over u~ + range(P),
    # by damped Newton on the coarse space (1.15x its floor where one Newton step of the linearisation gave 563x).
    proc = _train(site, "cubic_reaction", tmp_path / "coarse", None, "--set", "model.coarse_correction=5")
    assert proc.returncode == 0, proc.stderr
    assert "coarse Newton" in proc.stdout and "-> coarse correction on 5x5 (damped Newton)" in proc.stdout
    proc = _train(site, "advection_diffusion", tmp_path / "no", None, "--set", "model.coarse_correction=5")
    assert proc.returncode == 2 and ("model.coarse_correction: the advection_diffusion family (as configured): its loss "
                                     "is a loss of no declared kind") in proc.stderr


def test_one_polish_step_of_the_plugin_reduces_the_error_on_every_instance(site, monkeypatch):
    # The cubic-reaction plugin's Newton step, as tests/methods/test_polish.py checks every built-in family's first step.
    from helpers import network_like

    monkeypatch.syspath_prepend(str(site))
    from cubic_reaction import CubicReaction

    problem = CubicReaction((33, 33))
    params = problem.sample(6, "random", 3)
    exact, start, _ = network_like(problem, params, np.random.default_rng(1))
    errors = [np.linalg.norm((f - exact).reshape(6, -1), axis=1) for f in (start, problem.polish(params, start, 1))]
    assert np.all(errors[1] < 0.5 * errors[0]), errors
