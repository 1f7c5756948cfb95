"""The peers' race (benchmarks/peers.py, issue 90): the PINN's strong forms read the family's own coefficient and
material law, are solved by the family's FEM solution, and the whole race runs end to end at a tiny budget."""

import json
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from helpers import ROOT, TINY_POISSON, run_cli, tiny

BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))


def _deepxde(monkeypatch):
    """DeepXDE on its pytorch backend (as benchmarks/peer_arms/pinn.py runs it), or the test skips without it."""
    monkeypatch.setenv("DDE_BACKEND", "pytorch")
    return pytest.importorskip("deepxde")


def _family(name: str, **keys):
    from deepfusion.configuration.config import load_config
    from deepfusion.configuration.run import Run

    cfg = load_config(ROOT / "configs" / f"{name}.toml", ["problem.resolution=[17,17]", "multigrid.levels=[]",
                                                          *(f"{name}.{k}={v}" for k, v in keys.items())])
    return Run.from_config(cfg).family


@pytest.mark.parametrize("name", ["poisson", "elasticity"])
def test_the_pinn_coefficient_is_the_familys_own(name):
    """log nu (Poisson) and log E (elasticity) of the strong form at the grid's nodes equal the family's grid field,
    for the parametric inputs and for one fixed instance (S = 3 instances)."""
    from diffnet.families.kl_family import kl_log_field
    from peer_arms.forms import form_of

    family = _family(name)
    instances = family.sample(3, "random", 7)
    grid = kl_log_field(torch.as_tensor(instances[:, : family.kl_terms]), family.eta, family.kl_terms,
                        family.resolution).numpy()
    form = form_of(family)
    log, _, _ = form.log_coefficient(torch.as_tensor(form.grid_points(instances)))
    fields = form.to_fields(np.repeat(log.numpy(), form.channels, 1), 3)
    assert np.abs((fields if form.channels == 1 else fields[:, 1]) - grid).max() < 1e-5
    one = form_of(family, fixed=instances[1])
    log1, _, _ = one.log_coefficient(torch.as_tensor(one.grid_points(instances[1:2])))
    assert np.abs(log1.numpy().reshape(grid.shape[1:]) - grid[1]).max() < 1e-5


def test_the_pinn_coefficient_gradient_is_the_derivative_of_its_value():
    from peer_arms.forms import form_of

    family = _family("poisson")
    form = form_of(family)
    X = torch.as_tensor(form.grid_points(family.sample(2, "random", 3)), dtype=torch.float64).requires_grad_()
    form.omega, form.weight = form.omega.double(), form.weight.double()
    log, lx, ly = form.log_coefficient(X)
    g = torch.autograd.grad(log.sum(), X)[0]
    assert torch.allclose(g[:, 0:1], lx, atol=1e-10) and torch.allclose(g[:, 1:2], ly, atol=1e-10)


def test_the_poisson_strong_form_vanishes_on_the_fem_solution():
    """The residual lap u + grad log nu . grad u of the Q1 FEM solution, by central differences at the interior
    nodes, is small beside its terms (the form's signs and coefficient are the family's equation)."""
    from peer_arms.forms import form_of

    family = _family("poisson", **{"kl_terms": 2}).at_resolution((65, 65))
    instance = np.array([[1.5, -1.0]])
    u = family.reference(instance)[0]
    h = 1.0 / 64
    lap = (u[1:-1, 2:] + u[1:-1, :-2] + u[2:, 1:-1] + u[:-2, 1:-1] - 4 * u[1:-1, 1:-1]) / h**2
    ux, uy = (u[1:-1, 2:] - u[1:-1, :-2]) / (2 * h), (u[2:, 1:-1] - u[:-2, 1:-1]) / (2 * h)
    form = form_of(family)
    _, lx, ly = form.log_coefficient(torch.as_tensor(form.grid_points(instance)))
    lx, ly = (v.numpy().reshape(65, 65)[1:-1, 1:-1] for v in (lx, ly))
    residual = lap + lx * ux + ly * uy
    assert np.abs(residual).mean() < 0.02 * np.abs(lx * ux).mean()


def test_the_elasticity_strong_form_vanishes_on_the_fem_solution():
    """div s + s grad log E of the Q1 solution (s its stress per unit E, central differences at the interior nodes
    away from the clamped side's corners) is small beside its terms, and the traction t / E holds at x = 1."""
    from diffnet.grid.material import lame
    from peer_arms.forms import form_of

    family = _family("elasticity", kl_terms=2).at_resolution((65, 65))
    instance = np.array([[1.0, -0.8, 0.3]])
    ux, uy = family.reference(instance)[0]
    h = 1.0 / 64
    dx = lambda f: np.gradient(f, h, axis=1)  # noqa: E731  (one-sided at the edges)
    dy = lambda f: np.gradient(f, h, axis=0)  # noqa: E731
    lam, mu = lame(0.3, family.plane)
    sxx, syy = (lam + 2 * mu) * dx(ux) + lam * dy(uy), lam * dx(ux) + (lam + 2 * mu) * dy(uy)
    sxy = mu * (dy(ux) + dx(uy))
    form = form_of(family)
    log_e, lx, ly = (v.numpy().reshape(65, 65) for v in form.log_coefficient(torch.as_tensor(form.grid_points(instance))))
    inner = (slice(8, -8), slice(8, -8))
    rx = dx(sxx) + dy(sxy) + sxx * lx + sxy * ly
    ry = dx(sxy) + dy(syy) + sxy * lx + syy * ly
    assert np.abs(rx[inner]).mean() < 0.05 * np.abs(dx(sxx)[inner]).mean()
    assert np.abs(ry[inner]).mean() < 0.05 * np.abs(dx(sxy)[inner]).mean()
    # At x = 1 the shear traction is t_y / E (the normal one zero), away from the corners.
    assert np.abs(sxy[8:-8, -1] * np.exp(log_e[8:-8, -1]) - form.traction[1]).mean() < 0.05


def test_the_elasticity_stress_is_the_familys_for_an_affine_field(monkeypatch):
    """The form's stress per unit E times E = exp(log E) is the family's derived stress, on an affine displacement
    (exact for Q1), the shipped plane stress and S = C = 2 instances."""
    _deepxde(monkeypatch)
    from peer_arms.forms import form_of

    family = _family("elasticity")
    instances = np.array([[0.0, 0.0, 0.0, 0.0, 0.25], [0.0, 0.0, 0.0, 0.0, 0.35]])
    form = form_of(family)
    X = torch.as_tensor(form.grid_points(instances)).requires_grad_()
    U = torch.stack([0.3 * X[:, 0] - 0.2 * X[:, 1], 0.1 * X[:, 0] + 0.4 * X[:, 1]], dim=1)
    s = torch.cat(form._stress(X, U), dim=1).detach().numpy()
    derived = family.derived(instances, form.to_fields(U.detach().numpy(), 2))["stress"]
    ours = np.moveaxis(s.reshape(2, 17, 17, 3), 3, 1)
    assert np.abs(ours - derived).max() < 1e-5 * np.abs(derived).max()


def test_no_pinn_form_for_another_family_says_so():
    from peer_arms.forms import form_of

    with pytest.raises(ValueError, match="no PINN form for the family 'burgers'"):
        form_of(type("F", (), {"name": "burgers", "dims": 2})())


def test_the_watch_stops_at_its_budget_with_the_evaluations_off_the_clock():
    """Evaluations that take 0.1 s each do not count: the training clock ends at the budget, the wall clock later."""
    from peer_arms.watch import Watch

    watch = Watch(0.3, lambda fields: (time.sleep(0.1), 0.5)[1], points=4)
    start = time.perf_counter()
    while not watch.over():
        if watch.due():
            watch.record(lambda: None)
    wall = time.perf_counter() - start
    assert len(watch.curve) >= 3 and wall >= 0.3 + 0.1 * len(watch.curve)
    assert [p["seconds"] for p in watch.curve] == sorted(p["seconds"] for p in watch.curve) and \
        watch.curve[-1]["seconds"] < 0.3 + 0.05  # the last mark is the budget itself


@pytest.mark.slow
def test_the_race_runs_every_arm_at_a_tiny_budget(tmp_path, monkeypatch):
    """A tiny Poisson run raced by every peer for 3 s each: every arm's row, curve and the tenfold reading, and the
    bad options refused in one line."""
    _deepxde(monkeypatch)
    pytest.importorskip("neuralop")
    run = tmp_path / "run"
    proc = run_cli("train", str(ROOT / "configs" / "poisson.toml"), "--out", str(run), *tiny("poisson.toml"),
                   "--set", "train.epochs=2", "--set", "output.plots=false", "--set", "data.n_test=2",
                   "--set", "train.checkpoint_every=2", "--set", "problem.resolution=[17,17]",
                   "--set", "model.coarse_correction=5", "--set", "model.sweeps=2")  # a finish to give the FNO
    assert proc.returncode == 0, proc.stderr
    out = subprocess.run([sys.executable, str(BENCH / "peers.py"), str(run), "--budget", "3", "--samples", "2",
                          "--threads", "1", "--out", str(tmp_path / "peers.json")],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "peers.json").read_text())
    bad = subprocess.run([sys.executable, str(BENCH / "peers.py"), str(run), "--pinn-adam-share", "1.5"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert bad.returncode == 2 and "--pinn-adam-share: a share of the budget in [0, 1], got 1.5" in bad.stderr
    assert set(report["versions"]) == {"deepxde", "neuraloperator", "torch"}
    arms = report["results"]["poisson"]["arms"]
    assert set(arms) == {"diffnet", "finish", "pinn", "pinn-one", "fno", "fno+finish"}
    for name, row in arms.items():
        assert np.isfinite(row["error"]) and row["ratio"] == pytest.approx(row["error"] / row["floor"])
        assert bool(row["curve"]) == (name != "finish") and row["inference_per_instance_s"] > 0
        if name not in ("diffnet", "finish"):
            assert 3 <= row["train_seconds"] < 10 and isinstance(row["tenfold"], bool)
    assert arms["pinn-one"]["instances"] == 1 and arms["fno"]["pairs"] >= 1
    # The operator given DiffNet's finish: the same training seconds, its own field finished.
    assert arms["fno+finish"]["train_seconds"] == arms["fno"]["train_seconds"]
    assert arms["fno+finish"]["error"] != arms["fno"]["error"]
    assert (tmp_path / "peers.png").stat().st_size > 10_000
