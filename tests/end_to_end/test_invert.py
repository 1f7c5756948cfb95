"""``deepfusion invert`` (deepfusion/commands/invert.py): observations of the field in, the instance behind them out (MAP, Laplace, MCMC), through
the surrogate's exact gradients and, with --classical, the classical solve's adjoint; bad observations refused in one
line with nothing written."""

from __future__ import annotations

import json
import re

import h5py
import numpy as np
import pytest
import torch

from helpers import ROOT, run_cli
from deepfusion import Surrogate
from deepfusion.analysis.inverse import classical_forward, jacobian, parameter_names, prior_of
from deepfusion.analysis.mcmc import effective_sample_size, metropolis
from deepfusion.analysis.observations import Observations, read_observations

POINTS = [(x, y) for y in (0.2, 0.5, 0.8) for x in (0.15, 0.4, 0.65, 0.9)]


@pytest.fixture(scope="module")
def wells(tiny_runs, tmp_path_factory):
    """Heads at 12 wells of one instance, from the classical solve (the surrogate's own grid), 1 % noise."""
    surrogate = Surrogate.load(tiny_runs["poisson"])
    truth = np.array([[0.8, -0.6, 0.4, 0.0, 0.3, -0.2]])
    heads = surrogate.family.reference(truth)[0]
    from diffnet.grid.points import point_weights, read_at

    values = read_at(heads[None], tuple(surrogate.family.resolution), point_weights((16, 16), POINTS))[0]
    noisy = values + 0.01 * np.random.default_rng(0).standard_normal(len(values))
    path = tmp_path_factory.mktemp("wells") / "wells.csv"
    path.write_text("x,y,output,value,sigma\n" + "".join(f"{x},{y},u,{v},0.01\n" for (x, y), v in zip(POINTS, noisy)))
    return path, truth


@pytest.mark.slow  # 5 s: both sides' MAP, Laplace and chains through the command (the parts have fast tests below)
def test_invert_writes_the_map_its_posterior_and_the_classical_route(tiny_runs, wells, tmp_path):
    path, truth = wells
    family = Surrogate.load(tiny_runs["poisson"]).family
    flux = family.derived(truth, family.reference(truth))["flux_x"]  # and the flux at three of the wells
    from diffnet.grid.points import values_at

    mixed = tmp_path / "wells_and_flux.csv"
    mixed.write_text(path.read_text() + "".join(f"{x},{y},flux_x,{v},0.05\n" for (x, y), v in
                                                zip(POINTS[:3], values_at(flux, (16, 16), POINTS[:3])[0])))
    out = tmp_path / "inverse"
    proc = run_cli("invert", str(tiny_runs["poisson"]), "--observations", str(mixed), "--out", str(out),
                   "--starts", "2", "--max-iterations", "10", "--samples", "40", "--chains", "4", "--classical",
                   "--classical-samples", "20")  # the classical chains are the costly ones: fewer of them
    assert proc.returncode == 0, proc.stderr
    assert "MCMC" in proc.stdout and "acceptance" in proc.stdout and "effective sample size" in proc.stdout
    report = json.loads((out / "map.json").read_text())
    names = parameter_names(Surrogate.load(tiny_runs["poisson"]).family)
    assert names == [f"a[{i}]" for i in range(6)] and list(report["map"]) == names == list(report["classical"]["map"])
    for side, samples in ((report, 40), (report["classical"], 20)):
        assert {"objective", "misfit_rms", "seconds", "laplace_std", "mcmc"} <= set(side)
        assert side["mcmc"]["samples"] == samples and 0 <= side["mcmc"]["acceptance"] < 1, proc.stdout
    # The two-epoch network may leave its chains where they start; the classical posterior is a real one.
    assert report["classical"]["mcmc"]["acceptance"] > 0.05, proc.stdout
    assert report["map_difference"]["classical_objective_at_surrogate_map"] > 0
    assert report["surrogate_calls"] > 0 and report["classical"]["solves"] > 0 and report["classical"]["adjoint_solves"] > 0
    # Each side's MAP explains the data better than every start did (ten iterations: not yet to the noise).
    for side in (report, report["classical"]):
        assert side["objective"] == min(side["end_objectives"]) < min(side["start_objectives"])
    with h5py.File(out / "posterior.h5") as f:
        assert json.loads(f.attrs["parameters"]) == names
        assert f["surrogate/samples"].shape == (4, 10 + 2, 6) and f["surrogate"].attrs["burn_in"] == 2 and f["classical/laplace_covariance"].shape == (6, 6)
        assert f["classical/samples"].shape == (4, 5 + 1, 6) and f["classical"].attrs["burn_in"] == 1
        np.testing.assert_array_equal(f["observed"][()].shape, (15,))
    assert (out / "posterior.png").stat().st_size > 0


@pytest.mark.parametrize("observed", ["heads", "heads and fluxes"])
def test_the_classical_adjoint_is_the_central_differences(tiny_runs, wells, observed):
    path, truth = wells
    family = Surrogate.load(tiny_runs["poisson"]).family
    observations = read_observations(path, family)
    if observed == "heads and fluxes":  # a derived field depends on the instance beside the field: -ν(p) ∇u_h(p)
        observations = Observations(observations.points, tuple(("u", "flux_x", "flux_y")[i % 3] for i in
                                                                range(len(observations))), observations.values,
                                    observations.sigma)
    counter = [0, 0]
    forward = classical_forward(family, observations, counter)
    J = jacobian(forward, truth[0], copies=False)
    h = 1e-6
    for j in (0, 3):
        e = np.zeros(6)
        e[j] = h
        with torch.no_grad():
            plus, minus = (forward(torch.as_tensor((truth[0] + s * e)[None]))[0].numpy() for s in (1, -1))
        np.testing.assert_allclose(J[:, j], (plus - minus) / (2 * h), rtol=1e-5, atol=1e-9)
    assert counter[1] == len(observations)  # one adjoint solve per observation's row


def test_central_differences_are_the_exact_gradient_and_stay_in_the_box(tiny_runs, wells):
    """A family not differentiable in its instances (the plate) gets its gradients by central differences of its
    values: on the Poisson surrogate, whose exact gradients exist, the two agree; at the prior's bound the stencil is
    one-sided and asks for no instance outside the training range."""
    from deepfusion.analysis.inverse import differenced_forward, surrogate_forward
    from deepfusion.analysis.observations import predict

    path, truth = wells
    surrogate = Surrogate.load(tiny_runs["poisson"])
    family = surrogate.family
    observations = read_observations(path, family)
    prior = prior_of(family, "uniform")
    asked = []

    def values(p: np.ndarray) -> np.ndarray:
        asked.append(p.copy())
        return predict(family, observations, p, surrogate.fields(surrogate.instances(p)))

    at = np.vstack([truth, np.r_[prior.high[:1], truth[0, 1:]][None]])  # S = 2: inside, and on the upper bound of a_1
    exact = jacobian(surrogate_forward(surrogate, observations), at[0])
    for k, p in enumerate(at):
        differenced = jacobian(differenced_forward(values, prior), p, copies=False)
        reference = exact if k == 0 else jacobian(surrogate_forward(surrogate, observations), p)
        np.testing.assert_allclose(differenced, reference, rtol=2e-3, atol=2e-3 * np.abs(reference).max())
    everything = np.concatenate(asked)
    assert len(everything) == 2 * (2 * 6 + 1) and ((everything >= prior.low) & (everything <= prior.high)).all()
    with torch.no_grad():  # no gradient wanted: one evaluation, no stencil
        differenced_forward(values, prior)(torch.as_tensor(at))
    assert len(asked) == 3 and len(asked[-1]) == 2


def test_central_differences_and_laplace_keep_a_scalar_instances_shape():
    """A family whose instance is one number (the cavity's Reynolds number: shape ()) gets its central-difference
    gradient in the instances' own shape (S,), and its Laplace approximation at a MAP of shape ()."""
    from deepfusion.analysis.inverse import Prior, differenced_forward, laplace

    prior = Prior("uniform", np.asarray(1.0), np.asarray(3.0))
    values = lambda p: np.stack([p**2, np.sin(p)], axis=1)  # noqa: E731  (S,) -> (S, 2)
    forward = differenced_forward(values, prior)
    p = torch.tensor([1.5, 2.0], dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(forward(p).sum(), p)
    np.testing.assert_allclose(grad.numpy(), 2 * p.detach().numpy() + np.cos(p.detach().numpy()), rtol=1e-5)

    class Observed:
        sigma = np.array([0.1, 0.1])

    post = laplace(forward, Observed(), prior, np.asarray(2.0), copies=False)
    assert post["jacobian"].shape == (2, 1) and post["std"].shape == (1,)


def test_a_quantity_is_observed_with_no_coordinates(tmp_path):
    """The plate's K_t: a row with x, y empty, predicted as the family's quantity of the fields (one per instance,
    however many rows observe it), beside a strain at a gauge; coordinates on a quantity, or none on a field, refused."""
    from deepfusion import load_family
    from deepfusion.analysis.observations import predict, quantity_names

    plate = load_family(str(ROOT / "configs" / "kirsch.toml"), ["problem.resolution=[33, 33]", "multigrid.levels=[]"])
    assert quantity_names(plate) == ("K_t",)
    path = tmp_path / "plate.csv"
    path.write_text("x,y,output,value,sigma\n,,K_t,3.1,0.05\n0.2,0.2,strain_xx,1.0,0.01\n, ,K_t,3.0,0.05\n")
    observations = read_observations(path, plate)
    assert observations.names == ("K_t", "strain_xx", "K_t") and np.isnan(observations.points[[0, 2]]).all()
    rows = np.array([[0.5, 0.5, 0.1, 0.3], [0.45, 0.55, 0.12, 0.25]])  # S = C = 2
    fields = plate.discrete_optimum(rows)[0]
    predicted = predict(plate, observations, rows, fields)
    k_t = plate.quantities(rows, fields)["K_t"]
    from diffnet.grid.points import values_at

    np.testing.assert_allclose(predicted[:, [0, 2]], np.stack([k_t, k_t], 1), rtol=0, atol=0)
    strain = plate.derived(rows, fields)["strain"][:, 0]
    np.testing.assert_allclose(predicted[:, 1], values_at(strain, (33, 33), [(0.2, 0.2)])[:, 0], rtol=1e-12)
    for text, message in (("0.5,0.5,K_t,3.0,0.05", "K_t is a quantity of the whole field: leave x, y empty"),
                          (",,strain_xx,1.0,0.01", "x, y, value and sigma must be numbers"),
                          (",,sigma_max,1.0,0.01", "nor its quantities (K_t)")):
        path.write_text("x,y,output,value,sigma\n" + text + "\n")
        with pytest.raises(ValueError, match=re.escape(message)):
            read_observations(path, plate)


def test_warm_starts_change_the_cost_not_the_answer():
    """The classical side's Newton solves start from the nearest instance already solved (a chain's proposal lies near
    its state): the same fields as from the family's own start; a family whose optimum depends on its start keeps none."""
    from deepfusion import load_family
    from deepfusion.analysis.inverse import WarmStarts

    solid = load_family(str(ROOT / "configs" / "hyperelasticity.toml"),
                        ["problem.resolution=[17, 17]", "multigrid.levels=[]", "model.coarse_correction=9"])
    rows = np.array([[0.2, -0.3, 0.1, 0.4, 0.15], [0.9, 0.9, -0.9, -0.9, 0.11]])  # S = C = 2
    warm = WarmStarts(np.array([2.0, 2.0, 2.0, 2.0, 0.1]))
    solved = warm.solve(solid, rows)
    starts = []

    class Spy:  # the family, with the starts it is given recorded
        def discrete_optimum(self, params, initial=None):
            starts.append(initial)
            return solid.discrete_optimum(params, initial)

    near = (rows + np.array([0.02, -0.02, 0.01, 0.0, 0.002]))[::-1]  # each near the other's row: reversed
    fields = warm.solve(Spy(), near)
    np.testing.assert_array_equal(starts[0], solved[::-1])
    cold = solid.discrete_optimum(near)[0]
    np.testing.assert_allclose(fields, cold, rtol=0, atol=1e-9 * np.abs(cold).max())
    assert solid.unique_optimum and not load_family(str(ROOT / "configs" / "burgers.toml")).unique_optimum


def test_warm_starts_keep_each_chains_state_while_it_is_used():
    """The window keeps the fields used or solved last: a state used as a start moves to its newest end, so a chain
    that stays put keeps its start while other solves pass through (a window of the last solves alone lost it)."""
    from deepfusion import load_family
    from deepfusion.analysis.inverse import WarmStarts

    solid = load_family(str(ROOT / "configs" / "hyperelasticity.toml"),
                        ["problem.resolution=[9, 9]", "multigrid.levels=[]", "model.coarse_correction=5"])
    state, other, third = (np.array([[a, -0.3, 0.1, 0.4, 0.15]]) for a in (-0.8, 0.0, 0.8))
    warm = WarmStarts(np.array([2.0, 2.0, 2.0, 2.0, 0.1]), size=2)
    warm.solve(solid, state)
    warm.solve(solid, other)
    warm.solve(solid, state + 0.01)   # the chain's proposal starts from its state: the state is used, kept
    warm.solve(solid, third)          # a third instance passes: the oldest unused one goes, not the state
    assert any(np.array_equal(row, state[0]) for row in warm.instances)
    assert not any(np.array_equal(row, other[0]) for row in warm.instances) and len(warm.instances) == 2


def test_the_classical_adjoint_of_a_nonlinear_solid_is_the_central_differences():
    """The Neo-Hookean solid's classical route: Newton inside the autograd Function's forward (where grad is off), the
    adjoint with the tangent at the solution; its gradient of displacements and a stress at gauges is the central
    differences' of the same solves."""
    from deepfusion import load_family
    from deepfusion.analysis.inverse import classical_forward

    solid = load_family(str(ROOT / "configs" / "hyperelasticity.toml"),
                        ["problem.resolution=[17, 17]", "multigrid.levels=[]", "model.coarse_correction=9"])
    points = np.array([(0.3, 0.5), (0.7, 0.5), (0.7, 0.2)])
    observations = Observations(np.vstack([points, points[:1]]), ("u_x", "u_y", "u_x", "stress_xy"), np.zeros(4),
                                np.full(4, 0.01))
    forward = classical_forward(solid, observations)
    at = np.array([0.2, -0.3, 0.1, 0.4, 0.15])
    J = jacobian(forward, at, copies=False)
    for j, h in ((0, 1e-5), (4, 1e-6)):
        e = np.zeros(5)
        e[j] = h
        with torch.no_grad():
            plus, minus = (forward(torch.as_tensor((at + s * e)[None]))[0].numpy() for s in (1, -1))
        np.testing.assert_allclose(J[:, j], (plus - minus) / (2 * h), rtol=1e-4, atol=1e-7 * np.abs(J).max())


def test_sweeps_on_a_nonlinear_energy_are_differenced_not_differentiated():
    """The Neo-Hookean product's sweeps use the tangent at the coarse minimiser, which moves with the instance: no
    exact gradient in the instances through them (a third derivative), so invert takes central differences there;
    a quadratic energy's sweeps, or no sweeps, keep their exact gradients."""
    from deepfusion import load_family
    from diffnet.product.corrected import CoarseCorrected

    solid = load_family(str(ROOT / "configs" / "hyperelasticity.toml"),
                        ["problem.resolution=[17, 17]", "multigrid.levels=[]", "model.coarse_correction=9"])
    assert not CoarseCorrected(solid, solid, 9, quadratic=False, sweeps=8).exact_parameter_gradients
    assert CoarseCorrected(solid, solid, 9, quadratic=False, sweeps=0).exact_parameter_gradients
    assert CoarseCorrected(solid, solid, 9, quadratic=True, sweeps=8).exact_parameter_gradients


def test_metropolis_samples_a_gaussian_and_counts_its_effective_samples():
    mean, std = np.array([1.0, -2.0]), np.array([0.5, 2.0])
    chains = metropolis(lambda x: -0.5 * (((x - mean) / std) ** 2).sum(1), np.tile(mean, (8, 1)), np.diag(std**2),
                        1500, lambda x: np.ones(len(x), bool), seed=3)
    kept = chains.kept(300)
    np.testing.assert_allclose(kept.mean(0), mean, atol=0.25 * std.max())
    np.testing.assert_allclose(kept.std(0), std, rtol=0.15)
    assert 0.2 < chains.accepted.mean() < 0.6
    ess = effective_sample_size(chains.samples[:, 300:])
    assert np.isnan(effective_sample_size(np.ones((2, 50, 1))))[0]  # chains that never moved: nothing to estimate
    assert (ess > 100).all() and (ess < kept.shape[0]).all()
    # Independent draws have an effective sample size of about their number.
    independent = np.random.default_rng(0).standard_normal((4, 2000, 1))
    assert 0.8 * 8000 < effective_sample_size(independent)[0] < 1.2 * 8000


@pytest.mark.parametrize("text, message", [
    ("x,y,output,value,sigma\n1.5,0.5,u,0.3,0.01\n", "line 2: the point (1.5, 0.5) lies outside the unit square"),
    ("x,y,output,value,sigma\n0.5,0.5,head,0.3,0.01\n",
     "line 2: output 'head' is not one of the field's unknowns (u) nor its derived fields (flux_x, flux_y)"),
    ("x,y,output,value,sigma\n0.5,0.5,u,0.3,0\n", "line 2: sigma must be > 0"),
    ("x,y,output,value,sigma\n0.5,0.5,u,nan,0.1\n", "line 2: NaN or Inf"),
    ("x,y,output,value,sigma\n0.5,0.5,u,abc,0.1\n", "line 2: x, y, value and sigma must be numbers"),
    ("x,y,value,sigma\n0.5,0.5,0.3,0.1\n", "the columns must be x,y,output,value,sigma"),
    ("x,y,output,value,sigma\n", "no rows"),
], ids=["outside", "unknown-output", "sigma", "nan", "text", "columns", "empty"])
def test_bad_observations_are_one_line_and_nothing_is_written(tiny_runs, tmp_path, text, message):
    bad = tmp_path / "obs.csv"
    bad.write_text(text)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_observations(bad, Surrogate.load(tiny_runs["poisson"]).family)
    if message == "no rows":  # and through the command: status 2, one line, no directory
        proc = run_cli("invert", str(tiny_runs["poisson"]), "--observations", str(bad), "--out", str(tmp_path / "o"))
        assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "o").exists()


def test_the_prior_is_one_of_the_familys_laws(tiny_runs):
    family = Surrogate.load(tiny_runs["poisson"]).family
    assert prior_of(family, "normal").kind == "normal"
    with pytest.raises(ValueError, match="--prior: the poisson family draws its instances from uniform, normal"):
        prior_of(family, "cauchy")


def test_each_start_is_minimised_on_its_own_inside_the_box():
    from deepfusion.analysis.minimise import minimise_batched

    def rosenbrock(x):  # two starts' objectives and gradients at once
        f = (1 - x[:, 0]) ** 2 + 100 * (x[:, 1] - x[:, 0] ** 2) ** 2
        g = np.stack([-2 * (1 - x[:, 0]) - 400 * x[:, 0] * (x[:, 1] - x[:, 0] ** 2), 200 * (x[:, 1] - x[:, 0] ** 2)], 1)
        return f, g

    free = minimise_batched(rosenbrock, np.array([[-1.2, 1.0], [2.0, 2.0]]), np.full(2, -3.0), np.full(2, 3.0), 500)
    np.testing.assert_allclose(free.x, [[1, 1], [1, 1]], atol=1e-4)
    assert (free.iterations < 100).all()
    # A box that excludes the minimum: the answer on its edge, where scipy's L-BFGS-B ends too.
    from scipy.optimize import minimize

    boxed = minimise_batched(rosenbrock, np.array([[-1.2, 0.5]]), np.array([-3.0, -3.0]), np.array([3.0, 0.5]), 500)
    expected = minimize(lambda x: rosenbrock(x[None])[0][0], [-1.2, 0.5], jac=lambda x: rosenbrock(x[None])[1][0],
                        method="L-BFGS-B", bounds=[(-3, 3), (-3, 0.5)]).x
    np.testing.assert_allclose(boxed.x[0], expected, atol=1e-4)


def _small_run(tmp_path, name: str, nodes: int, coarse: int, n_train: int):
    """A two-epoch run of ``configs/NAME.toml`` on nodes² (no levels, a small network), for a tutorial's lines."""
    run_dir = tmp_path / name
    proc = run_cli("train", str(ROOT / "configs" / f"{name}.toml"), "--out", str(run_dir),
                   "--set", f"problem.resolution=[{nodes},{nodes}]", "--set", "multigrid.levels=[]",
                   "--set", "train.epochs=2", "--set", f"data.n_train={n_train}", "--set", "data.n_test=2",
                   "--set", f"model.coarse_correction={coarse}", "--set", "model.channels=[8,16]",
                   "--set", "output.plots=false")
    assert proc.returncode == 0, proc.stderr
    return run_dir


def _tutorial(heading: str, fence: str = "python") -> str:
    """The first ``fence`` block of the user guide's section ``heading``."""
    guide = (ROOT / "docs" / "user-guide.md").read_text()
    return guide[guide.index(heading):].split(f"```{fence}\n", 1)[1].split("```")[0]


@pytest.mark.slow  # 30 s: a small groundwater run trained, then the tutorial's two MAPs
def test_the_pumping_test_tutorial_runs_as_written(tmp_path):
    run_dir = _small_run(tmp_path, "groundwater", 17, 5, 64)
    snippet = _tutorial("### Tutorial: a pumping test")
    assert '"runs/groundwater"' in snippet
    scope: dict = {}
    # The tutorial's lines as written, on the small run, with two starts and eight L-BFGS iterations each.
    assert snippet.count("observations, prior, starts)") == 2 and "prior.draw(4, seed=0)" in snippet
    small = snippet.replace('"runs/groundwater"', repr(str(run_dir))).replace("prior.draw(4, seed=0)", "prior.draw(2, seed=0)")
    exec(small.replace("observations, prior, starts)", "observations, prior, starts, max_iterations=8)"), scope)
    for result in (scope["through_network"], scope["by_solver"]):
        assert result.map.shape == (10,) and result.objective < result.initial.min()
    assert np.isfinite(scope["judged"]) and scope["judged"] > 0  # the surrogate's MAP in the classical objective


@pytest.mark.slow  # 45-60 s: a small Kirsch run trained, then the tutorial's gauges and both sides' MAP by differences
def test_the_hole_from_strain_gauges_tutorial_runs_as_written(tmp_path, monkeypatch):
    run_dir = _small_run(tmp_path, "kirsch", 33, 9, 32)  # 33²: the smallest hole is more than a cell
    snippet = _tutorial("### Tutorial: where is the hole?")
    line = _tutorial("### Tutorial: where is the hole?", "bash").strip()
    assert '"runs/kirsch"' in snippet and "(127, 127)" in snippet
    monkeypatch.chdir(tmp_path)  # the snippet writes gauges.csv where it runs
    exec(snippet.replace('"runs/kirsch"', repr(str(run_dir))).replace("(127, 127)", "(65, 65)"), {})
    assert len((tmp_path / "gauges.csv").read_text().splitlines()) == 1 + 16
    words = line.replace("runs/kirsch", str(run_dir)).split()
    assert words[:2] == ["deepfusion", "invert"] and "--classical" in words
    proc = run_cli(*words[1:], "--starts", "2", "--max-iterations", "4", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "surrogate's by central differences" in proc.stdout and "classical's by central differences" in proc.stdout
    report = json.loads((run_dir / "hole" / "map.json").read_text())
    assert report["gradients"] == report["classical"]["gradients"] == "central differences" and list(report["map"]) == [
        "p[0] (hole_x)", "p[1] (hole_y)", "p[2] (hole_r)", "p[3] (nu)"]
    for side in (report, report["classical"]):  # each side's MAP explains the gauges better than its starts
        assert side["objective"] == min(side["end_objectives"]) < min(side["start_objectives"])
    assert report["classical"]["solves"] > 0 and report["classical"]["adjoint_solves"] == 0


def test_a_probe_outside_the_cylinders_channel_is_one_line_and_one_inside_is_read_on_its_box(tmp_path):
    from diffnet.families.cylinder import CylinderFamily

    family = CylinderFamily(resolution=(17, 89))
    bad = tmp_path / "obs.csv"
    bad.write_text("x,y,output,value,sigma\n1.0,0.2,u,0.3,0.01\n2.5,0.2,u,0.3,0.01\n")
    with pytest.raises(ValueError, match=r"line 3: the point \(2.5, 0.2\) lies outside the box \[0, 2.2\] x \[0, 0.41\]"):
        read_observations(bad, family)
    bad.write_text("x,y,output,value,sigma\n1.1,0.205,u,0.3,0.01\n")  # the channel's centre: outside the unit square
    (index, weight), = read_observations(bad, family).weights((17, 89)).values()
    # On the node (8, 44) itself: the point is mapped by the channel's sides, not the unit square's.
    assert index[0][np.argmax(weight[0])] == 8 * 89 + 44 and weight[0].max() == pytest.approx(1.0)
