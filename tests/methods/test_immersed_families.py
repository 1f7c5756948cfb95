"""The families on domains beyond the rectangle, end to end: the torsion family over star-shaped shapes and
the KL Poisson plate with a hole. Their floors converge at the immersed method's order against the
body-fitted reference; the body-fitted reference converges to a closed form; the energies' minimisers
solve their systems; they train (P = 1 and 2 alike, a domain split alike), evaluate inside the domain,
write masked field files, infer, polish, compare and refuse bad shapes in one line."""

from __future__ import annotations

import json
import warnings

import h5py
import numpy as np
import pytest
import torch

from helpers import PLAIN, ROOT, run_cli, run_cli_jobs
from deepfusion.parallel.runtime import find_mpiexec
from diffnet.instances.geometry import Disc, grid_points
from diffnet.families.plate import PlateWithHoleFamily
from diffnet.families.torsion import StarTorsionFamily
from diffnet.solvers.bodyfitted import Loop, body_fitted_solve

MPIEXEC = find_mpiexec()
TORSION = str(ROOT / "configs" / "torsion.toml")
PLATE = str(ROOT / "configs" / "plate.toml")
# A run of a few seconds: 24^2 (two cells are then under the smallest radius the shapes reach), one level.
TINY = ["--set", "problem.resolution=[24,24]", "--set", "multigrid.levels=[]", "--set", "model.channels=[4,8]",
        "--set", "data.n_train=8", "--set", "data.n_test=2", "--set", "train.batch_size=4", "--set", "train.epochs=2",
        "--set", "train.log_every=1", "--set", "parallel.threads_per_rank=1", "--set", "train.dtype=float64", *PLAIN]


def test_body_fitted_reference_converges_to_the_torsion_of_a_disc():
    R, c = 0.31, np.array([0.5, 0.47])
    errors = []
    points = grid_points((33, 33))
    inside = Disc(tuple(c), R).sdf(points) <= 0
    exact = (R**2 - ((points[inside] - c) ** 2).sum(-1)) / 4
    for h in (1 / 16, 1 / 32, 1 / 64):
        n = int(np.ceil(2 * np.pi * R / (h / 2)))
        theta = np.linspace(0, 2 * np.pi, n, endpoint=False)
        loop = Loop(c + R * np.stack([np.cos(theta), np.sin(theta)], 1), np.zeros(n, dtype=int))
        u = body_fitted_solve([loop], {0: ("u", 0.0)}, h, f=1.0).at(points[inside])
        errors.append(np.linalg.norm(u - exact) / np.linalg.norm(exact))
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    assert orders.min() > 1.7 and errors[-1] < 1e-3, (errors, orders)


@pytest.mark.parametrize("family", [StarTorsionFamily((17, 17)), PlateWithHoleFamily((17, 17))], ids=["torsion", "plate"])
def test_floor_converges_at_second_order_against_the_body_fitted_reference(family):
    params = family.sample(2, "random", 3)
    floors = []
    for n in (17, 33, 65):
        fine = family.at_resolution((n, n))
        fine.check_instances(params)
        ref, truth = fine.reference(params), fine.truth(params)
        assert np.all(ref[fine.domain(params) > 0] == 0) and np.all(truth[fine.domain(params) > 0] == 0)
        floors.append(np.mean([np.linalg.norm(r - t) / np.linalg.norm(t) for r, t in zip(ref, truth)]))
    orders = np.log2(np.array(floors[:-1]) / np.array(floors[1:]))
    assert orders.mean() > 1.8, (floors, orders)


@pytest.mark.parametrize("family", [StarTorsionFamily((24, 24)), PlateWithHoleFamily((24, 24), hole="u=0.5")],
                         ids=["torsion", "plate-dirichlet-hole"])
def test_the_energys_minimiser_solves_the_assembled_system(family):
    params = family.sample(2, "random", 0)
    for p in params:
        system = family.fem_system(p)
        u = torch.tensor(system.solve("direct")[None], requires_grad=True)
        grad = torch.autograd.grad(family.loss_terms(u, torch.as_tensor(p[None]))["energy"].sum(), u)[0][0]
        free = ~system.fixed.reshape(family.resolution)
        assert np.abs(grad.detach().numpy()[free]).max() < 1e-10 * max(1.0, float(u.detach().abs().max()))
    # The field keeps the box's Dirichlet values and vanishes off the active nodes.
    raw = torch.randn(2, 1, *family.resolution, dtype=torch.float64)
    field = family.field(raw, torch.as_tensor(params))
    active = np.stack([family.discretised(p).active for p in params])
    assert torch.all(field[torch.as_tensor(~active)] == 0)


def test_shapes_the_grid_cannot_hold_are_refused_by_index():
    torsion = StarTorsionFamily((24, 24))
    with pytest.raises(ValueError, match=r"instance 1: a1 = 0.2 is outside the shapes' range \[-0.08, 0.08\]"):
        torsion.check_instances(np.array([[0.0] * 6, [0.2] + [0.0] * 5]))
    thin = StarTorsionFamily((24, 24), r0=0.05, amplitude=0.5)
    with pytest.raises(ValueError, match="instance 0: the shape's smallest radius .* thinner than it resolves"):
        thin.check_instances(np.zeros((1, 6)))
    plate = PlateWithHoleFamily((24, 24))
    row = np.concatenate([np.zeros(6), [0.5, 0.5, 0.3]])
    with pytest.raises(ValueError, match=r"instance 0: hole_r = 0.3 is outside the holes' range \[0.1, 0.2\]"):
        plate.check_instances(row[None])
    small = PlateWithHoleFamily((24, 24), hole_r=(0.01, 0.2))
    row[-1] = 0.02
    with pytest.raises(ValueError, match="under a cell .* thinner than it resolves"):
        small.check_instances(row[None])
    from diffnet.instances.cutcell import cut_cells

    with pytest.raises(ValueError, match="holds none of the 9x9 grid's nodes"):
        cut_cells(Disc((3.0, 3.0), 0.5), (9, 9))


@pytest.fixture(scope="module")
def torsion_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("torsion") / "run"
    proc = run_cli("train", TORSION, "--out", str(run), *TINY)
    assert proc.returncode == 0, proc.stderr
    return run


def test_torsion_trains_evaluates_inside_and_writes_the_mask(torsion_run, tmp_path):
    report = json.loads((torsion_run / "eval.json").read_text())
    assert report["truth"].startswith("body-fitted P1 FEM") and 0 < report["mean_floor"] < report["mean_rel_l2"]
    with h5py.File(torsion_run / "test_prediction.h5") as f:
        u, sdf, inside = f["u"][()], f["sdf"][()], f["inside"][()]
        assert u.shape == (2, 24, 24) and np.array_equal(inside, (sdf <= 0).astype(np.uint8))
        assert np.all(u[sdf > 0] == 0) and np.abs(u[sdf <= 0]).max() > 0
    xdmf = (torsion_run / "test_prediction.xdmf").read_text()
    assert 'Attribute Name="inside"' in xdmf and 'Attribute Name="sdf"' in xdmf
    assert (torsion_run / "plots" / "fields.png").stat().st_size > 10_000
    # Inference by the parameter's name, polished to the same-grid immersed solution (the floor's field).
    shapes = np.array([[0.05, -0.02, 0.01, 0.0, 0.03, -0.04]])
    np.save(tmp_path / "shapes.npy", shapes)
    out = tmp_path / "u.h5"
    proc = run_cli("infer", str(torsion_run), "--param", f"shape={tmp_path / 'shapes.npy'}", "--polish", "150",
                   "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    with h5py.File(out) as f:
        polished = f["u"][0]
    floor = StarTorsionFamily((24, 24)).reference(shapes)[0]
    np.testing.assert_allclose(polished, floor, atol=1e-8)
    # A shape outside the family, or thinner than the grid: one line, status 2, nothing written.
    np.save(tmp_path / "bad.npy", np.array([[0.5, 0, 0, 0, 0, 0]]))
    proc = run_cli("infer", str(torsion_run), "--param", f"shape={tmp_path / 'bad.npy'}", "--out", str(tmp_path / "b.h5"))
    assert proc.returncode == 2 and "outside the shapes' range" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "b.h5").exists()
    proc = run_cli("train", TORSION, "--out", str(tmp_path / "x"), "--set", "torsion.amplitude=0.3")
    assert proc.returncode == 2 and "inside the unit square" in proc.stderr and not (tmp_path / "x").exists()


def test_uq_over_moving_shapes_averages_each_node_over_the_shapes_that_hold_it(torsion_run, tmp_path):
    out = tmp_path / "uq.h5"
    proc = run_cli("uq", str(torsion_run), "--samples", "23", "--batch", "5", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "statistics over the nodes inside each instance's domain" in proc.stdout
    with h5py.File(out) as f:
        params, mean, std, fraction = f["shape"][()], f["mean"][()], f["std"][()], f["inside_fraction"][()]
    from deepfusion import Surrogate

    surrogate = Surrogate.load(torsion_run)
    u = np.concatenate([surrogate.fields(params[i : i + 5]) for i in range(0, 23, 5)])
    inside = surrogate.family.domain(params) <= 0
    # Some nodes are inside some shapes only: the plain mean would mix in the zeros written outside.
    partly = (fraction > 0) & (fraction < 1)
    assert partly.sum() > 10
    np.testing.assert_allclose(fraction, inside.mean(axis=0), rtol=0, atol=1e-15)
    masked = np.where(inside, u, np.nan)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # nodes no shape holds: numpy's empty slices
        expected_mean, counts = np.nanmean(masked, axis=0), inside.sum(axis=0)
        expected_std = np.nanstd(masked, axis=0, ddof=1)
    known = counts > 0
    assert np.array_equal(np.isfinite(mean), known) and np.isnan(mean[~known]).all()
    np.testing.assert_allclose(mean[known], expected_mean[known], rtol=1e-10, atol=1e-13)
    two = counts > 1
    np.testing.assert_allclose(std[two], expected_std[two], rtol=1e-9, atol=1e-13)
    assert not np.allclose(mean[partly], u.mean(axis=0)[partly])  # the plain mean is not this one
    summary = json.loads(out.with_suffix(".json").read_text())["fields"]
    assert summary["mean"]["nodes"] == int(known.sum()) and summary["mean"]["max"] == pytest.approx(np.nanmax(mean))
    assert 0 < summary["inside_fraction"]["mean"] < 1 and set(summary["std"]["argmax"]) == {"y", "x"}
    assert out.with_suffix(".png").stat().st_size > 10_000


def test_torsion_compares_with_the_immersed_multigrid_and_the_body_fitted_fem(torsion_run, tmp_path):
    report = tmp_path / "compare.json"
    proc = run_cli("compare", str(torsion_run), "--samples", "2", "--threads", "1", "--polish", "--out", str(report))
    assert proc.returncode == 0, proc.stderr
    row = json.loads(report.read_text())["rows"][0]
    assert row["classical_method"] in {"fmg1", "fmg", "cholesky", "body-fitted"}
    assert row["classical_error"] <= row["diffnet_error"]


@pytest.mark.needs_mpiexec
@pytest.mark.timeout(300)
@pytest.mark.slow
def test_two_ranks_and_a_domain_split_train_the_one_rank_model(torsion_run, tmp_path):
    from deepfusion.files.checkpoint import load_checkpoint

    one = load_checkpoint(torsion_run / "checkpoints" / "step-00000004.h5").model
    cases = (("p2", []), ("split", ["--set", "parallel.domain=[1,2]"]))
    procs = run_cli_jobs(2, *(["train", TORSION, "--out", str(tmp_path / name), *TINY, *extra] for name, extra in cases),
                         timeout=280)  # one MPI job of both runs
    for (name, _), proc in zip(cases, procs):
        assert proc.returncode == 0, proc.stderr
        other = load_checkpoint(tmp_path / name / "checkpoints" / "step-00000004.h5").model
        for key in one:
            assert np.abs(one[key] - other[key]).max() <= 1e-9 * max(np.abs(one[key]).max(), 1.0), (name, key)


def test_plate_trains_infers_and_polishes_to_its_floor(tmp_path):
    run = tmp_path / "plate"
    proc = run_cli("train", PLATE, "--out", str(run), *TINY, "--set", "plate.x1=\"flux=-1\"")
    assert proc.returncode == 0, proc.stderr
    assert "x1:flux=-1" in proc.stdout  # the banner names non-default sides
    report = json.loads((run / "eval.json").read_text())
    assert report["truth"].startswith("body-fitted") and report["mean_floor"] > 0
    row = np.concatenate([np.full(6, 0.5), [0.45, 0.55, 0.15]])
    np.save(tmp_path / "p.npy", row[None])
    out = tmp_path / "u.h5"
    proc = run_cli("infer", str(run), "--param", f"p={tmp_path / 'p.npy'}", "--polish", "150", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    with h5py.File(out) as f:
        polished, inside = f["u"][0], f["inside"][0].astype(bool)
    family = PlateWithHoleFamily((24, 24), x0="u=1", x1="flux=-1", y0="flux=0", y1="flux=0")
    np.testing.assert_allclose(polished, family.reference(row[None])[0], atol=1e-8)
    assert np.all(polished[~inside] == 0) and np.all(polished[:, 0] == 1.0)


@pytest.mark.parametrize("name, bound", [("torsion", 0.15), ("plate", 0.4)])
def test_the_assembled_correction_estimates_a_smooth_error_inside(name, bound):
    """B g from the assembled multigrid (one preconditioned CG step) is about the error of a field near the
    grid's own solution, at the inside nodes (the torch V-cycle of the Nitsche Hessian diverges)."""
    from deepfusion.configuration.registry import family_class

    family = family_class(name)((33, 33))
    params = family.draw(3, "uniform", 1)
    exact = np.stack([family.fem_system(p).solve("direct").reshape(33, 33) for p in params])
    y, x = np.meshgrid(np.linspace(0, 1, 33), np.linspace(0, 1, 33), indexing="ij")
    inside = family.domain(params) <= 0
    error = 1e-3 * np.sin(np.pi * x) * np.sin(np.pi * y) * inside
    d = family.assembled_correction(torch.as_tensor(exact + error), torch.as_tensor(params), 1).numpy()
    assert np.all(d[~inside] == 0)
    for k in range(3):
        assert np.linalg.norm((d - error)[k][inside[k]]) < bound * np.linalg.norm(error[k][inside[k]])
    more = family.assembled_correction(torch.as_tensor(exact + error), torch.as_tensor(params), 3).numpy()
    assert np.linalg.norm(more - error) < np.linalg.norm(d - error)  # more iterations, closer


def test_the_preconditioned_loss_and_a_second_stage_train_on_cut_domains(tmp_path):
    """docs/results.md's settings (train.loss = "preconditioned", a second stage) on a tiny torsion run; the
    'loss' form, which needs the torch V-cycle, is refused in one line."""
    from deepfusion.configuration.config import load_config
    from deepfusion.configuration.run import Run
    from deepfusion.configuration.schema import ConfigError

    proc = run_cli("train", TORSION, "--out", str(tmp_path / "run"), *TINY, "--set", "train.loss=preconditioned",
                   "--set", "train.second_stage_epochs=2", "--set", "output.plots=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the first stage alone: error" in proc.stdout and "the second stage takes it to" in proc.stdout
    report = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert np.isfinite(report["mean_rel_l2"]) and report["mean_floor"] > 0
    with pytest.raises(ConfigError, match="precondition_form: the torsion family gives B g from its assembled"):
        Run.from_config(load_config(ROOT / "configs" / "torsion.toml", ["train.loss=preconditioned",
                                                                        "train.precondition_form=loss"]))


def test_each_instances_discretisation_is_built_once_until_the_caches_are_cleared(monkeypatch):
    import diffnet.families.immersed_family as immersed_family

    family = StarTorsionFamily((17, 17))
    built = []
    original = StarTorsionFamily.discretise
    monkeypatch.setattr(StarTorsionFamily, "discretise", lambda self, p: built.append(tuple(p)) or original(self, p))
    family.clear_caches()
    shapes = family.sample(3, "random", 4)
    for _ in range(3):  # three epochs over the instances, through every path that reads them
        family.inputs(torch.as_tensor(shapes))
        family.field(torch.zeros(3, 1, 17, 17, dtype=torch.float64), torch.as_tensor(shapes))
        family.loss_terms(torch.zeros(3, 17, 17, dtype=torch.float64), torch.as_tensor(shapes))
    assert len(built) == 3 and family.discretised(shapes[0]) is family.discretised(shapes[0])
    assert StarTorsionFamily((17, 17)).discretised(shapes[1]) is family.discretised(shapes[1])  # equal families share
    family.clear_caches()  # what compare and uq do before each timed solve
    family.discretised(shapes[0])
    assert len(built) == 4
    # Bounded in bytes: past the budget the least recently used instance goes first.
    one = immersed_family._nbytes(family.discretised(shapes[0]))
    from diffnet.backend import budget

    monkeypatch.setattr(budget, "_BUDGET", [int(2.5 * one / budget.SHARES["discretisations"])])
    family.clear_caches()
    for p in (shapes[0], shapes[1], shapes[0], shapes[2]):  # shapes[1] is the least recently used at the third
        family.discretised(p)
    assert len(built) == 7
    family.discretised(shapes[0])  # kept
    assert len(built) == 7
    family.discretised(shapes[1])  # evicted, built again
    assert len(built) == 8


def test_compare_times_each_solve_with_its_own_set_up(monkeypatch):
    from deepfusion.analysis.compare import measure_classical, time_inference

    calls = []
    family = StarTorsionFamily((17, 17))
    shapes = family.sample(2, "random", 4)
    time_inference(lambda p, b: calls.append("solve") or np.zeros((len(p), 17, 17)), shapes, 2, say=lambda *_: None,
                   fresh=lambda: calls.append("fresh"))
    # first call, each instance alone, then the batch: each timed call preceded by a fresh set-up (the batch after an
    # untimed pass at its shape: oneDNN's kernels for a shape are a process's one-off)
    assert calls == ["fresh", "solve"] * 3 + ["solve", "fresh", "solve"]
    cleared = []
    original = StarTorsionFamily.clear_caches
    monkeypatch.setattr(StarTorsionFamily, "clear_caches", lambda self: cleared.append(1) or original(self))
    measure_classical(family, shapes, "fmg", 17)  # the best of repeats, each repeat building its own
    assert len(cleared) >= len(shapes)


@pytest.mark.parametrize("name", ["torsion", "plate"])
def test_the_hessian_is_probed_once_per_instance_and_is_the_losss(name, monkeypatch):
    import diffnet.families.immersed_family as immersed_family

    family = StarTorsionFamily((17, 17)) if name == "torsion" else PlateWithHoleFamily((17, 17))
    family.clear_caches()
    params = torch.as_tensor(family.sample(3, "random", 2))
    fields = [family.field(torch.randn(3, 1, 17, 17, dtype=torch.float64, generator=torch.Generator().manual_seed(s)),
                           params).detach() for s in (0, 1)]
    probes = []
    original = immersed_family.probe_stencil
    monkeypatch.setattr(immersed_family, "probe_stencil", lambda self, u, p: probes.append(len(p)) or original(self, u, p))
    kept = family.hessian(fields[0], params)
    again = family.hessian(fields[1], params[[2, 0]])  # other fields, other order: the kept stencils
    assert probes == [3] and torch.equal(again, kept[[2, 0]])
    fresh = original(family, fields[1], params)  # probed at another field: the same (a quadratic energy)
    assert torch.allclose(kept, fresh, rtol=0, atol=1e-9 * float(fresh.abs().max()))


def test_each_instances_multigrid_is_kept_within_its_byte_budget(monkeypatch):
    # The preconditioned loss's B g and the polish build an assembled multigrid per instance; kept by count they
    # took a rank past 11 GB at 128^2. Bounded in bytes, least recently used first, like the discretisations.
    import diffnet.families.immersed_family as immersed_family

    family = StarTorsionFamily((17, 17))
    family.clear_caches()
    shapes = family.sample(3, "random", 4)
    rows = [tuple(map(float, p)) for p in shapes]
    first = immersed_family._multigrid(family, rows[0])
    assert immersed_family._multigrid(family, rows[0]) is first
    one = immersed_family._nbytes(first)
    assert one > 0 and immersed_family._MULTIGRIDS.nbytes == one
    from diffnet.backend import budget

    monkeypatch.setattr(budget, "_BUDGET", [int(1.5 * one / budget.SHARES["multigrids"])])
    immersed_family._multigrid(family, rows[1])  # the budget holds one: rows[0] goes
    assert list(immersed_family._MULTIGRIDS) == [(family, rows[1])] and immersed_family._MULTIGRIDS.nbytes <= 1.5 * one
    family.clear_caches()
    assert not immersed_family._MULTIGRIDS and immersed_family._MULTIGRIDS.nbytes == 0


@pytest.mark.parametrize("name", ["torsion", "elastic_plate"])
def test_a_batch_larger_than_the_kept_hessians_is_served_whole(name, monkeypatch):
    # With the budget a third of the node shared by two ranks, the torsion family at 128^2 kept fewer Hessians than a
    # rank's shard; keeping a batch's new ones evicted its own older ones before they were read (a KeyError at the
    # first 128^2 step). Each is read as it comes now: the stencils are those of a cache that keeps them all.
    import diffnet.families.immersed_family as immersed_family
    from deepfusion.configuration.registry import family_class
    from diffnet.backend import budget

    family = family_class(name)((17, 17))
    family.clear_caches()
    instances = torch.as_tensor(family.sample(4, "random", 7))
    u = family.field(torch.zeros(4, len(family.unknowns), 17, 17, dtype=torch.float64), instances)
    whole = family.hessian(u, instances)  # all four kept (the default budget)
    one = immersed_family._HESSIANS.nbytes // 4
    family.clear_caches()
    family.hessian(u[:2], instances[:2])  # two kept, the older first
    monkeypatch.setattr(budget, "_BUDGET", [int(2.5 * one / budget.SHARES["hessians"])])  # room for two
    served = family.hessian(u[[0, 2, 3, 1]], instances[[0, 2, 3, 1]])  # hits at the front, misses that evict them
    assert torch.equal(served, whole[[0, 2, 3, 1]]) and len(immersed_family._HESSIANS) <= 2
    family.clear_caches()
