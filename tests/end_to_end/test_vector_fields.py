"""Families with several unknown fields (issue 55): the protocol's ``unknowns`` and ``vectors``, the network's
output channels, the evaluation per field, field files with one dataset per field and a ParaView vector, the
vector Hessian's preconditioned loss, coarse correction and second stage, and the refusals of what is not
built for them yet. The family is the built-in elasticity (configs/elasticity.toml)."""

import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import torch

from helpers import PLAIN, ROOT, run_cli, run_cli_jobs

CONFIG = str(ROOT / "configs" / "elasticity.toml")
QUICK = ["--set", "problem.resolution=[17,17]", "--set", "multigrid.levels=[9,17]", "--set", "multigrid.epochs=[3,3]",
         "--set", "model.channels=[4,8]", "--set", "multigrid.top_channels=4", "--set", "data.n_train=16",
         "--set", "data.n_test=2", "--set", "train.batch_size=8", "--set", "train.log_every=1",
         "--set", "train.checkpoint_every=3", "--set", "parallel.threads_per_rank=1", *PLAIN]


@pytest.fixture(scope="module")
def vector_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("elasticity") / "run"
    proc = run_cli("train", CONFIG, "--out", str(run_dir), *QUICK)
    assert proc.returncode == 0, proc.stderr
    return run_dir, proc.stdout


def test_a_vector_family_trains_and_is_evaluated_per_field(vector_run):
    run_dir, stdout = vector_run
    report = json.loads((run_dir / "eval.json").read_text())
    assert set(report["fields"]) == {"u_x", "u_y"}
    for row in report["fields"].values():
        assert row["ratio_to_floor"] == pytest.approx(row["mean_rel_l2"] / row["mean_floor"])
        assert 0 < row["mean_floor"] < row["mean_rel_l2"]
    assert "u_x" in stdout and "(each field alone, mean over the instances)" in stdout
    assert (run_dir / "plots" / "fields.png").stat().st_size > 0 and (run_dir / "plots" / "deformed.png").stat().st_size > 0


def test_the_evaluation_is_a_pure_report_and_a_printer(vector_run, capsys):
    # deepfusion.analysis.evaluate: assess computes (prints and writes nothing), print_assessment prints the table
    # the run printed, and the report is eval.json's content.
    from deepfusion.analysis.evaluate import assess, print_assessment
    from deepfusion.surrogate import Surrogate

    run_dir, stdout = vector_run
    s = Surrogate.load(run_dir)
    test = s.run.heldout
    pred = s.product.fields(test)
    before = set(run_dir.rglob("*"))
    found = assess(s.run, s.product, test, pred, {"seconds": 0.0})
    assert capsys.readouterr().out == "" and set(run_dir.rglob("*")) == before
    saved = json.loads((run_dir / "eval.json").read_text())
    report = found.report(saved["train_seconds"])
    assert report["mean_rel_l2"] == pytest.approx(saved["mean_rel_l2"], rel=1e-9)
    assert report["fields"].keys() == {"u_x", "u_y"}
    print_assessment(found, ["a", "b"])
    table = capsys.readouterr().out
    assert "(each field alone, mean over the instances)" in table
    mean = [line.split() for text in (table, stdout) for line in text.splitlines() if line.split()[:1] == ["mean"]]
    assert len(mean) == 2 and mean[0] == mean[1]  # the run's own table row, to the printed digits


def test_the_field_files_hold_one_dataset_per_field_and_a_paraview_vector(vector_run):
    import h5py

    from deepfusion.files.fields import read_fields
    from deepfusion.surrogate import Surrogate

    run_dir, _ = vector_run
    path = run_dir / "test_prediction.h5"
    with h5py.File(path) as f:
        assert f.attrs["unknowns"] == "u_x,u_y" and f["u_x"].shape == f["u_y"].shape == (2, 17, 17)
        assert "u" not in f
        params = f["a"][()]
    read = read_fields(path)
    assert read["u"].shape == (2, 2, 17, 17) and np.array_equal(read["u"][:, 1], read["u_y"])
    # The XDMF: u_x and u_y as scalars, u as a vector joined from them with a zero z (ParaView's vectors are 3-D).
    grid = ET.parse(path.with_suffix(".xdmf")).getroot().find("Domain/Grid/Grid")
    kinds = {a.get("Name"): a.get("AttributeType") for a in grid.findall("Attribute")}
    derived = ("strain", "stress", "von_mises")  # the family's derived fields (tests/methods/test_elastic_plate.py)
    solution = {k: v for k, v in kinds.items() if not k.startswith(derived)}
    assert solution == {"u_x": "Scalar", "u_y": "Scalar", "u": "Vector"}
    assert kinds["stress"] == "Tensor6" and kinds["stress_xy"] == kinds["von_mises"] == "Scalar"
    joined = next(a for a in grid.findall("Attribute") if a.get("Name") == "u").find("DataItem")
    assert joined.get("Function") == "JOIN($0, $1, 0 * $0)" and joined.get("Dimensions") == "17 17 3"
    assert [d.findall("DataItem")[1].text.split(":/")[1] for d in joined.findall("DataItem")] == ["u_x", "u_y"]
    # The Python API gives (S, C, *grid), the fields of the file.
    surrogate = Surrogate.load(run_dir)
    fields = surrogate.fields(params)
    assert fields.shape == (2, 2, 17, 17) and np.allclose(fields, read["u"], rtol=0, atol=1e-6 * np.abs(fields).max())
    named = surrogate.by_name(fields)
    assert list(named) == ["u_x", "u_y"] and np.array_equal(named["u_y"], fields[:, 1])


def test_infer_and_reference_write_each_field(vector_run, tmp_path):
    import h5py

    run_dir, _ = vector_run
    a = np.array([[0.5, -0.5, 1.0, 0.0, 0.3]])
    np.save(tmp_path / "a.npy", a)
    proc = run_cli("infer", str(run_dir), "--param", "a=" + str(tmp_path / "a.npy"), "--out", str(tmp_path / "u.h5"))
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("reference", "elasticity", "--set", "elasticity.plane=strain", "--resolution", "17",
                   "--param", "a=" + str(tmp_path / "a.npy"), "--out", str(tmp_path / "ref.h5"))
    assert proc.returncode == 0, proc.stderr
    with h5py.File(tmp_path / "u.h5") as f, h5py.File(tmp_path / "ref.h5") as g:
        assert f["u_x"].shape == g["u_y"].shape == (1, 17, 17) and g.attrs["unknowns"] == "u_x,u_y"
        assert g["u_y"][0, :, -1].max() < 0 and np.all(g["u_x"][0, :, 0] == 0)  # clamped at x = 0, pushed down at x = 1


@pytest.mark.parametrize("sets, message", [
    (["elasticity.x0=free"], "elasticity.x0: the supports leave the body free to move and rotate"),
    (["elasticity.x0=u=0,free"], "elasticity.x0: the supports leave the body free to move along y"),
    (["elasticity.x1=traction=1"], "give 2 components (x first)"),
])
def test_what_a_vector_family_cannot_take_is_refused_in_one_line(tmp_path, sets, message):
    proc = run_cli("train", CONFIG, "--out", str(tmp_path / "r"), *QUICK, *[a for s in sets for a in ("--set", s)])
    assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "r").exists()


def test_the_winning_setting_trains_a_vector_family_and_the_second_stage_improves_it(tmp_path):
    # Issue 53's best setting on two unknowns: the block Hessian's coarse correction inside the generator, the
    # preconditioned loss and a second stage, each taking (S, 2, *grid) fields.
    run_dir = tmp_path / "r"
    proc = run_cli("train", CONFIG, "--out", str(run_dir), *QUICK, "--set", "train.loss=preconditioned",
                   "--set", "model.coarse_correction=5", "--set", "train.second_stage_epochs=2",
                   "--set", "output.plots=false")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((run_dir / "eval.json").read_text())
    assert set(report["fields"]) == {"u_x", "u_y"} and report["mean_rel_l2"] > report["mean_floor"] > 0
    assert "-> coarse correction on 5x5 (one kept solve)" in proc.stdout and "the second stage takes it to" in proc.stdout
    assert "estimated by |B g| / |u - B g|" in proc.stdout


def test_uq_gives_each_fields_statistics(vector_run, tmp_path):
    import h5py

    from deepfusion.surrogate import Surrogate

    run_dir, _ = vector_run
    proc = run_cli("uq", str(run_dir), "--samples", "6", "--batch", "4", "--out", str(tmp_path / "uq.h5"))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "uq.json").read_text())
    assert {"mean_u_x", "mean_u_y", "std_u_x", "std_u_y", "von_mises_mean", "stress_xy_std"} <= set(summary["fields"])
    with h5py.File(tmp_path / "uq.h5") as f:
        mean_y, params = f["mean_u_y"][()], f["a"][()]
    fields = Surrogate.load(run_dir).fields(params)
    np.testing.assert_allclose(mean_y, fields[:, 1].mean(axis=0), rtol=0, atol=1e-6 * np.abs(fields).max())


def test_a_family_that_packs_two_fields_into_one_grid_is_refused(tmp_path):
    # The work-around of a user before the protocol had unknowns: (u_x, u_y) side by side in one field.
    (tmp_path / "packed.py").write_text(
        "import torch\n"
        "from diffnet.families.elasticity import ElasticityFamily\n\n\n"
        "class Packed(ElasticityFamily):\n"
        "    unknowns = ('u',)\n"
        "    vectors = {}\n\n"
        "    def field(self, raw, params):\n"
        "        return torch.cat([raw[:, 0], raw[:, 0]], dim=-1)\n")
    proc = run_cli("train", CONFIG, "--out", str(tmp_path / "r"), *QUICK, "--set", 'problem.family="packed:Packed"',
                   path=[tmp_path])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "field returned shape [1, 17, 34] for unknowns ['u'] on [17, 17]" in proc.stderr


def test_the_network_has_one_output_channel_per_unknown_and_a_scalar_family_one():
    from diffnet.generators.networks import build_network

    vector = build_network("unet", 4, (4, 8), levels=(9, 17), top_channels=4, out_channels=2)
    scalar = build_network("unet", 3, (4, 8), levels=(9, 17), top_channels=4)
    x = torch.zeros(1, 4, 17, 17)
    assert vector(x).shape == (1, 2, 17, 17) and scalar(torch.zeros(1, 3, 17, 17)).shape == (1, 1, 17, 17)


@pytest.mark.needs_mpiexec
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("setting", ["energy", "vector_hessian"])
def test_one_and_two_ranks_and_a_domain_split_train_one_vector_model(tmp_path, setting):
    # Data parallel over 2 ranks gives the serial run's model: with the energy, also each sample's grid split over
    # 2 ranks (the tiles' halos and the gathered field carry both components); with the coarse correction, the
    # preconditioned loss and a second stage (each rank's V-cycles and coarse solves are its own samples').
    from deepfusion.files.checkpoint import checkpoint_files, load_checkpoint

    extra = {"energy": ["--set", "problem.resolution=[16,16]", "--set", "multigrid.levels=[]",
                        "--set", "train.epochs=2"],
             "vector_hessian": ["--set", "train.loss=preconditioned", "--set", "model.coarse_correction=5",
                                "--set", "train.second_stage_epochs=1", "--set", "train.checkpoint_every=100"]}[setting]
    args = ["train", CONFIG, *QUICK, "--set", "train.dtype=float64", "--set", "output.plots=false", *extra]
    runs = {"p1": run_cli(*args, "--out", str(tmp_path / "p1"))}
    jobs = [[*args, "--out", str(tmp_path / "p2")]]
    if setting == "energy":
        jobs.append([*args, "--set", "parallel.domain=[2]", "--out", str(tmp_path / "d2")])
    runs.update(zip(("p2", "d2"), run_cli_jobs(2, *jobs, timeout=250)))
    for proc in runs.values():
        assert proc.returncode == 0, proc.stdout + proc.stderr
    a, *others = (load_checkpoint(checkpoint_files(tmp_path / p / "checkpoints")[0]) for p in runs)
    assert all(o.step == a.step for o in others) and others[0].ranks == 2
    for other in others:
        assert max(float(np.abs(a.model[k] - other.model[k]).max()) for k in a.model) < 1e-9
    if setting == "energy":
        assert a.step == 4 and "u_y" in runs["d2"].stdout
    else:
        assert any(k.startswith("second.") for k in a.model)


def test_the_3d_body_trains_and_writes_a_three_component_vector(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli("train", str(ROOT / "configs" / "elasticity3d.toml"), "--out", str(run_dir),
                   "--set", "problem.resolution=[9,9,9]", "--set", "multigrid.levels=[]", "--set", "train.epochs=2",
                   "--set", "data.n_train=8", "--set", "data.n_test=1", "--set", "model.channels=[4,8]",
                   "--set", "parallel.threads_per_rank=1", "--set", "output.plots=false")
    assert proc.returncode == 0, proc.stderr
    assert set(json.loads((run_dir / "eval.json").read_text())["fields"]) == {"u_x", "u_y", "u_z"}
    grid = ET.parse(run_dir / "test_prediction.xdmf").getroot().find("Domain/Grid/Grid")
    vector = next(a for a in grid.findall("Attribute") if a.get("Name") == "u")
    assert vector.get("AttributeType") == "Vector" and vector.find("DataItem").get("Function") == "JOIN($0, $1, $2)"


def test_compare_and_the_polish_run_on_the_vector_family(vector_run, tmp_path):
    # The classical side is the same Q1 system on a sweep of grids by AMG-CG with the rigid-body modes; the polish
    # is V-cycles of the instance's smoothed-aggregation hierarchy from the network's displacement.
    from diffnet.families.elasticity import ElasticityFamily

    run_dir, _ = vector_run
    proc = run_cli("compare", str(run_dir), "--samples", "2", "--threads", "1", "--polish", "1",
                   "--out", str(tmp_path / "c.json"))
    assert proc.returncode == 0, proc.stderr
    rows = json.loads((tmp_path / "c.json").read_text())["rows"]
    assert len(rows) == 2 and rows[1]["diffnet_error"] < rows[0]["diffnet_error"]  # a V-cycle helps
    family = ElasticityFamily((17, 17))
    params = family.sample(2, "sobol", 3)
    solution = family.reference(params)
    start = solution + 0.01 * np.random.default_rng(0).normal(size=solution.shape) * np.abs(solution).max()
    errors = [np.linalg.norm(family.polish(params, start, k) - solution) for k in (0, 1, 3)]
    assert errors[1] < 0.2 * errors[0] and errors[2] < 0.2 * errors[1]
