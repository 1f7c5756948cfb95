"""Fields of several unknowns on a family with a domain: every place a per-instance mask meets (S, C, *grid) fields
(inference, the evaluation's error, the field files, the plots, uq's per-node counts, compare's classical fields)
pairs instance k's domain with every unknown of instance k, for C = 1, 2, 3 and S = C (the case numpy's trailing-
axis broadcasting turns into silent corruption), on one and two ranks; and the plate with a hole of issue 64.

The families are plugins in tests/data/plugins: ``hole_fields`` (C uncoupled fields around a soft hole) and
``plate_hole`` (the engineer's plane-stress plate with a hole, two unknowns).
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from helpers import ROOT, run_cli, run_cli_jobs

PLUGINS = ROOT / "tests" / "data" / "plugins"
QUICK = ["--set", "problem.resolution=[17,17]", "--set", "multigrid.levels=[]", "--set", "model.channels=[4,8]",
         "--set", "data.n_train=8", "--set", "data.sampling=sobol", "--set", "train.batch_size=4",
         "--set", "train.epochs=3", "--set", "train.lr=3e-3", "--set", "parallel.threads_per_rank=1"]
# Two distinct holes per row set, inside the training ranges: hole_fields (cx, r), plate_hole (cx, cy, r, nu).
HOLES = {"hole_fields": np.array([[0.4, 0.12], [0.6, 0.18], [0.5, 0.1]]),
         "plate_hole": np.array([[0.45, 0.55, 0.12, 0.25], [0.55, 0.45, 0.16, 0.3]])}


def _config(tmp_path: Path, family: str, tests: int, plots: bool = False) -> Path:
    path = tmp_path / "case.toml"
    path.write_text(f'[problem]\nfamily = "{family}"\n\n[data]\nn_test = {tests}\n\n[output]\nplots = {str(plots).lower()}\n')
    return path


def _unmasked(run_dir: Path, params: np.ndarray) -> np.ndarray:
    """The run's fields of ``params`` without any mask: its generator's field of its network's output."""
    import sys

    sys.path.insert(0, str(PLUGINS))
    try:
        from deepfusion.training.rundir import trained_model

        run, model, _ = trained_model(run_dir)
        p = torch.as_tensor(params, dtype=torch.float32)
        with torch.no_grad():
            return run.product(model).finished.field(model.eval()(run.family.inputs(p)), p).double().numpy()
    finally:
        sys.path.remove(str(PLUGINS))


def _check_masked(fields: np.ndarray, raw: np.ndarray, sdf: np.ndarray) -> None:
    """``fields`` (S, [C,] *grid) are ``raw`` at the nodes inside each instance's own domain and zero outside it."""
    assert fields.shape == raw.shape and sdf.shape == (len(raw), *raw.shape[-2:])
    scale = float(np.abs(raw).max())
    assert scale > 0
    for k in range(len(raw)):
        outside = sdf[k] > 0
        assert outside.any() and (~outside).any()
        for u, r in zip(fields[k].reshape(-1, *sdf.shape[1:]), raw[k].reshape(-1, *sdf.shape[1:])):
            np.testing.assert_array_equal(u[outside], 0.0)
            np.testing.assert_allclose(u[~outside], r[~outside], rtol=0, atol=1e-5 * scale)
            # not merely zero in some other instance's hole: the field is the network's outside its own
            assert np.abs(r[outside]).max() > 0


def _per_unknown(path: Path, unknowns: tuple[str, ...]) -> np.ndarray:
    with h5py.File(path) as f:
        u = np.stack([f[k][()] for k in unknowns], axis=1) if len(unknowns) > 1 else f["u"][()]
        sdf, inside = f["sdf"][()], f["inside"][()]
    np.testing.assert_array_equal(inside, (sdf <= 0).astype(np.uint8))
    return u, sdf


def test_inference_and_the_error_pair_each_instance_with_its_own_domain():
    # In-process, an untrained network: the product's fields and against_floor on S = C = 2 (the broadcasting case).
    import sys

    sys.path.insert(0, str(PLUGINS))
    try:
        from hole_fields import HoleFields2

        from deepfusion.analysis.inference import against_floor, domain_of
        from diffnet.product.product import Product
        from deepfusion.analysis.uq import Moments
        from diffnet.generators.networks import build_network

        family = HoleFields2((17, 17))
        params = HOLES["hole_fields"][:2]
        torch.manual_seed(0)
        model = build_network("unet", family.in_channels, (4, 8), out_channels=2).double()
        with torch.no_grad():  # a network's output, not the zero of a fresh last layer
            for weight in model.parameters():
                weight.normal_(0.0, 0.3)
        sdf = domain_of(family, params)
        p = torch.as_tensor(params)
        with torch.no_grad():
            raw = family.field(model(family.inputs(p)), p).numpy()
        pred = Product(family, model).fields(params)
        _check_masked(pred, raw, sdf)
        report = against_floor(family, params, raw)  # unmasked fields are measured inside the domain too
        truth = family.truth(params) * (sdf <= 0)[:, None]
        expected = np.linalg.norm((pred - truth).reshape(2, -1), axis=1) / np.linalg.norm(truth.reshape(2, -1), axis=1)
        np.testing.assert_allclose(report.error, expected, rtol=1e-12)
        stats = Moments()
        stats.add(raw, sdf <= 0)  # uq's per-node statistics over the instances whose domain holds the node
        for j in range(2):
            held = (sdf <= 0).sum(axis=0)
            mean = np.where(held > 0, (raw[:, j] * (sdf <= 0)).sum(axis=0) / np.maximum(held, 1), np.nan)
            np.testing.assert_allclose(stats.mean_inside[j], mean, rtol=1e-12, equal_nan=True)
    finally:
        sys.path.remove(str(PLUGINS))


@pytest.mark.parametrize("c", [1, 2, 3])
def test_c_unknowns_with_s_equal_c_through_every_command(tmp_path, c):
    family, unknowns = f"hole_fields:HoleFields{c}", (("u",), ("u1", "u2"), ("u1", "u2", "u3"))[c - 1]
    run = tmp_path / "run"
    proc = run_cli("train", str(_config(tmp_path, family, c, plots=c == 2)), "--out", str(run), *QUICK, path=[PLUGINS])
    assert proc.returncode == 0, proc.stderr
    report = json.loads((run / "eval.json").read_text())
    assert len(report["hole"]) == c and np.isfinite(report["rel_l2"]).all() and np.isfinite(report["ratio_to_floor"])
    test = np.asarray(report["hole"])
    fields, sdf = _per_unknown(run / "test_prediction.h5", unknowns)
    _check_masked(fields, _unmasked(run, test), sdf)
    truth, _ = _per_unknown(run / "test_reference.h5", unknowns)
    for k in range(c):
        assert (truth[k].reshape(-1, *sdf.shape[1:])[:, sdf[k] > 0] == 0).all()
    if c == 2:
        assert (run / "plots" / "fields.png").is_file()

    rows = HOLES["hole_fields"][:c]
    np.save(tmp_path / "holes.npy", rows)
    proc = run_cli("infer", str(run), "--param", f"hole={tmp_path / 'holes.npy'}", "--out", str(tmp_path / "new.h5"),
                   path=[PLUGINS])
    assert proc.returncode == 0, proc.stderr
    inferred, sdf = _per_unknown(tmp_path / "new.h5", unknowns)
    raw = _unmasked(run, rows)
    _check_masked(inferred, raw, sdf)

    import sys

    sys.path.insert(0, str(PLUGINS))
    try:
        from deepfusion import Surrogate

        surrogate = Surrogate.load(run)
        assert surrogate.parameter_name == "hole"
        np.testing.assert_allclose(surrogate(hole=rows), inferred, rtol=0, atol=1e-12)
        drawn = surrogate.family.draw(6, "uniform", 3)
        solved, inside = surrogate.fields(drawn), surrogate.family.domain(drawn) <= 0
    finally:
        sys.path.remove(str(PLUGINS))

    proc = run_cli("uq", str(run), "--samples", "6", "--seed", "3", "--batch", "4", "--out", str(tmp_path / "uq.h5"),
                   path=[PLUGINS])
    assert proc.returncode == 0, proc.stderr
    with h5py.File(tmp_path / "uq.h5") as f:
        np.testing.assert_allclose(f["inside_fraction"][()], inside.mean(axis=0), rtol=1e-12)
        held = inside.sum(axis=0)
        for j, name in enumerate(unknowns):
            values = solved if c == 1 else solved[:, j]
            mean = np.where(held > 0, (values * inside).sum(axis=0) / np.maximum(held, 1), np.nan)
            stored = f["mean" if c == 1 else f"mean_{name}"][()]
            np.testing.assert_allclose(stored, mean, rtol=1e-9, atol=1e-12, equal_nan=True)

    (run / "eval.json").unlink()  # an evaluation that never ran (a crash): the training time is metrics.jsonl's
    proc = run_cli("compare", str(run), "--samples", str(c), "--threads", "1", "--polish", "--out",
                   str(tmp_path / "compare.json"), path=[PLUGINS])
    assert proc.returncode == 0, proc.stderr
    compared = json.loads((tmp_path / "compare.json").read_text())
    logged = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["elapsed_s"]
    assert f"training took {logged:.0f} s on 1 rank(s)" in proc.stdout
    assert compared["rows"][0]["train_seconds"] == pytest.approx(logged)
    assert compared["rows"][0]["diffnet_error"] == pytest.approx(np.mean(report["rel_l2"][:c]), rel=1e-6)
    assert all(np.isfinite(p["error"]) for p in compared["search"])

    proc = run_cli("reference", family, "--param", f"hole={tmp_path / 'holes.npy'}", "--resolution", "17",
                   "--out", str(tmp_path / "ref.h5"), path=[PLUGINS])
    assert proc.returncode == 0, proc.stderr
    reference, sdf = _per_unknown(tmp_path / "ref.h5", unknowns)
    for k in range(c):
        assert (reference[k].reshape(-1, *sdf.shape[1:])[:, sdf[k] > 0] == 0).all()
        assert (reference[k].reshape(-1, *sdf.shape[1:])[:, sdf[k] < 0] != 0).all()


@pytest.mark.needs_mpiexec
@pytest.mark.timeout(600)
def test_one_two_and_three_unknowns_with_a_domain_on_two_ranks(tmp_path):
    # S = C for the inferred rows; the evaluation's 3 held-out instances against C = 1, 2, 3 (S != C but for C = 3:
    # the crash of issue 64's item 1 and its silent corruption).
    commands, cases = [], []
    for c in (1, 2, 3):
        rows, run = HOLES["hole_fields"][:c], tmp_path / f"run{c}"
        np.save(tmp_path / f"holes{c}.npy", rows)
        folder = tmp_path / f"c{c}"
        folder.mkdir()
        config = _config(folder, f"hole_fields:HoleFields{c}", 3)
        commands += [["train", str(config), "--out", str(run), *QUICK],
                     ["infer", str(run), "--param", f"hole={tmp_path / f'holes{c}.npy'}", "--out",
                      str(tmp_path / f"new{c}.h5")]]
        cases.append((c, rows, run))
    done = run_cli_jobs(2, *commands, path=[PLUGINS], timeout=540)
    assert all(proc.returncode == 0 for proc in done), "".join(proc.stderr for proc in done)
    for c, rows, run in cases:
        unknowns = ("u",) if c == 1 else tuple(f"u{j + 1}" for j in range(c))
        test = np.asarray(json.loads((run / "eval.json").read_text())["hole"])
        fields, sdf = _per_unknown(run / "test_prediction.h5", unknowns)
        _check_masked(fields, _unmasked(run, test), sdf)
        fields, sdf = _per_unknown(tmp_path / f"new{c}.h5", unknowns)
        _check_masked(fields, _unmasked(run, rows), sdf)


@pytest.mark.slow  # 8-12.5 s by the day: a training, its evaluation, infer and compare
def test_the_plate_with_a_hole_trains_evaluates_infers_and_compares(tmp_path):
    run = tmp_path / "run"
    proc = run_cli("train", str(_config(tmp_path, "plate_hole:PlateHole", 2, plots=True)), "--out", str(run), *QUICK,
                   path=[PLUGINS])
    assert proc.returncode == 0, proc.stderr  # the evaluation of (S, 2, *grid) fields with a (S, *grid) domain
    report = json.loads((run / "eval.json").read_text())
    assert set(report["fields"]) == {"u_x", "u_y"} and np.isfinite(report["ratio_to_floor"])
    assert all((run / "plots" / name).is_file() for name in ("fields.png", "deformed.png"))
    test = np.asarray(report["hole"])
    fields, sdf = _per_unknown(run / "test_prediction.h5", ("u_x", "u_y"))
    _check_masked(fields, _unmasked(run, test), sdf)

    rows = HOLES["plate_hole"]
    np.save(tmp_path / "holes.npy", rows)
    proc = run_cli("infer", str(run), "--param", f"hole={tmp_path / 'holes.npy'}", "--out", str(tmp_path / "new.h5"),
                   path=[PLUGINS])
    assert proc.returncode == 0, proc.stderr
    fields, sdf = _per_unknown(tmp_path / "new.h5", ("u_x", "u_y"))
    _check_masked(fields, _unmasked(run, rows), sdf)
    proc = run_cli("compare", str(run), "--samples", "2", "--threads", "1", "--polish", "1", "--out",
                   str(tmp_path / "compare.json"), path=[PLUGINS])
    assert proc.returncode == 0, proc.stderr
    rows_out = json.loads((tmp_path / "compare.json").read_text())["rows"]
    assert len(rows_out) == 2 and all(np.isfinite(r["diffnet_error"]) for r in rows_out)
