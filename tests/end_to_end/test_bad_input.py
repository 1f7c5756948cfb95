"""Bad input of every kind (config, command line, instance files, checkpoints): one line, status 2, nothing written
(deepfusion/cli.py, and deepfusion/__main__.py where a fresh process runs the real script)."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from helpers import ROOT, TINY, run_cli
from deepfusion.files.checkpoint import latest_checkpoint

BURGERS = str(ROOT / "configs" / "burgers.toml")
POISSON = str(ROOT / "configs" / "poisson.toml")


@pytest.fixture(scope="module")
def inputs(tiny_runs, tmp_path_factory):
    """Two tiny trained runs (Burgers, Poisson at 16^2, the session's) and the hostile files the cases use."""
    burgers, poisson = tiny_runs["burgers"], tiny_runs["poisson"]
    d = tmp_path_factory.mktemp("inputs")
    (d / "bad.toml").write_text("[train\nlr =\n")
    np.save(d / "a5.npy", np.zeros((2, 5)))
    np.save(d / "anan.npy", np.array([[0, 0, 0, np.nan, 0, 0]]))
    np.save(d / "nuneg.npy", -np.ones((1, 16, 16)))
    np.save(d / "nu8.npy", np.ones((1, 8, 8)))
    np.save(d / "nu4d.npy", np.ones((1, 1, 16, 16)))
    (d / "text.npy").write_text("1 2 3 4 5 6\n")
    # A pickled object array: np.load(allow_pickle=True) on it would run arbitrary code.
    with open(d / "obj.npy", "wb") as fh:
        np.lib.format.write_array(fh, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    ckpt = latest_checkpoint(burgers / "checkpoints")
    shutil.copy(ckpt, d / "extra.h5")
    with h5py.File(d / "extra.h5", "r+") as f:
        f.create_dataset("payload", data=np.zeros(4))
    data = ckpt.read_bytes()
    (d / "truncated.h5").write_bytes(data[: len(data) // 3])
    return {"burgers": burgers, "poisson": poisson, "in": d,
            "poisson_ckpt": latest_checkpoint(poisson / "checkpoints")}


CASES = [
    # configuration files and --set values
    (["train", "missing.toml"], "cannot read config"),
    (["train", "{in}/bad.toml"], "invalid TOML"),
    (["train", BURGERS, "--set", "burgers.viscosity=-1"], "burgers.viscosity: must be >= 0"),
    (["train", BURGERS, "--set", "train.epochs=many"], "train.epochs: expected an integer"),
    (["train", BURGERS, "--set", "nonsense"], "expected section.key=value"),
    (["train", BURGERS, "--set", "train.nosuchkey=1"], "train.nosuchkey: unknown key"),
    (["train", BURGERS, "--set", "problem.resolution=[2,64]"], "problem.resolution"),
    (["train", BURGERS, "--set", "train.optimizer=rmsprop"], "train.optimizer: must be one of"),
    (["train", BURGERS, "--set", "problem.family=heat"], "problem.family: unknown family 'heat' (known: "),
    (["train", BURGERS, "--set", "train.batch_size=0"], "train.batch_size: must be > 0"),
    (["train", BURGERS, "--set", "train.keep_checkpoints=-1"], "train.keep_checkpoints"),
    (["train", BURGERS, "--set", "burgers.c_range=[6,3]"], "burgers.c_range"),
    # another family's keys, in [problem] or in its table
    (["train", POISSON, "--set", "problem.t_final=5.0"], "problem.t_final: not a key of [problem] (family, resolution) "
                                                        "nor of the poisson family"),
    (["train", POISSON, "--set", "burgers.residual=scharr"], "burgers: the table of another family"),
    (["train", str(ROOT / "configs" / "kirsch.toml"), "--set", "elastic_plate.hole_r=[0.05,0.45]"],
     "hole_x: a hole of radius up to 0.45 centred in [0.4, 0.6] leaves the plate"),
    (["train", str(ROOT / "configs" / "plate.toml"), "--set", "plate.hole_y=[0.1,0.6]"],
     "hole_y: a hole of radius up to"),
    (["train", str(ROOT / "configs" / "kirsch.toml"), "--set", "elastic_plate.nu_range=[0.2,0.5]"],
     "nu_range: need"),
    (["train", BURGERS, "--set", "problem.viscosity=0.1"], "problem.viscosity: a key of the burgers family; set it in "
                                                         "its table [burgers]"),
    (["reference", "poisson", "--param", "a={in}/a5.npy", "--set", "burgers.viscosity=0", "--out", "x.h5"],
     "burgers: the table of another family"),
    (["reference", "heat", "--c", "1", "--out", "x.h5"], "problem.family: unknown family 'heat' (known: "),
    # command-line arguments
    (["frobnicate"], "invalid choice"),
    (["train", BURGERS, "--out", "fresh", "--resume"], "--resume: no checkpoint"),
    (["reference", "navier_stokes", "--param", "re=1500", "--resolution", "17", "17", "--out", "x.h5"],
     "--param re: instance 0: Re = 1500 lies outside the family's range [100, 1000] (navier_stokes.re_range)"),
    (["train", str(ROOT / "configs" / "cavity.toml"), "--set", "navier_stokes.test_re=[2000.0]"],
     "navier_stokes.test_re: 2000 lies outside re_range [100, 1000]"),
    (["reference", "cylinder", "--param", "x=0.2", "--param", "y=0.05", "--param", "r=0.05", "--resolution", "17", "89",
      "--out", "x.h5"], "x, y, r: instance 0: the cylinder (x 0.2, y 0.05, r 0.05) touches or comes within a cell"),
    (["train", str(ROOT / "configs" / "cylinder.toml"), "--set", "cylinder.cylinder_y=[0.05,0.25]"],
     "cylinder ranges: the cylinder (x 0.15, y 0.05, r 0.06) touches or comes within a cell"),
    (["reference", "burgers", "--c", "-3", "--out", "x.h5"], "--c: instance 0: c = -3; every entry must be finite and > 0"),
    (["reference", "burgers", "--c", "3", "--resolution", "2", "9", "--out", "x.h5"], "--resolution"),
    (["reference", "poisson", "--param", "a={in}/a5.npy", "--out", "x.txt"], "--out"),
    (["infer", "no_such_run", "--c", "3", "--out", "x.h5"], "not a run directory"),
    (["infer", "{burgers}", "--param", "a={in}/a5.npy", "--out", "x.h5"], "a: this run's family (burgers) takes its instances as c"),
    (["infer", "{poisson}", "--c", "3", "--out", "x.h5"], "--c: not a name of this run's family (poisson), which takes its "
                                                        "instances as a (rows of 6) or nu (nodal fields)"),
    (["infer", "{poisson}", "--coeffs", "{in}/a5.npy", "--out", "x.h5"], "--coeffs: retired; give the instances under the "
                                                                       "poisson family's own names, --param NAME=VALUE"),
    (["infer", "{poisson}", "--param", "a={in}/a5.npy", "--nu", "{in}/nu8.npy", "--out", "x.h5"], "one way at a time"),
    (["compare", "{poisson}", "--out", "r.txt"], "the report is JSON"),
    (["compare", "{poisson}", "--out", "r.json", "--samples", "0"], "--samples: must be in 1..1000"),
    (["compare", "{poisson}", "--out", "r.json", "--threads", "1", "0"], "--threads: must be in 1..4096, got 0"),
    (["compare", "{poisson}", "--out", "r.json", "--batch", "0"], "--batch: must be in 1..1024"),
    (["compare", "{poisson}", "--out", "r.json", "--resolution", "64"], "unrecognized arguments: --resolution"),
    (["compare", "{burgers}", "--out", "r.json", "--samples", "9"], "this run holds out 1 instance"),
    (["compare", "no_such_run", "--out", "r.json"], "not a run directory"),
    (["invert", "{poisson}", "--observations", "o.csv", "--out", "inv", "--classical-samples", "20"],
     "--classical-samples: only with --classical"),
    (["invert", "{poisson}", "--observations", "o.csv", "--out", "inv", "--classical", "--classical-samples", "5"],
     "--classical-samples: must be 0 (no MCMC) or in 10..10000000, got 5"),
    # instance files
    (["infer", "{poisson}", "--param", "a={in}/a5.npy", "--out", "x.h5"], "each instance must have shape (6,)"),
    (["infer", "{poisson}", "--param", "a={in}/anan.npy", "--out", "x.h5"], "NaN or Inf"),
    (["infer", "{poisson}", "--param", "a={in}/obj.npy", "--out", "x.h5"], "must be a numeric array"),
    (["infer", "{poisson}", "--param", "a={in}/text.npy", "--out", "x.h5"], "not a .npy file"),
    (["infer", "{poisson}", "--nu", "{in}/nuneg.npy", "--out", "x.h5"], "nu must be > 0 everywhere"),
    (["infer", "{poisson}", "--nu", "{in}/nu8.npy", "--out", "x.h5"], "the run's resolution"),
    (["infer", "{poisson}", "--nu", "{in}/nu4d.npy", "--out", "x.h5"], "array of 2 or 3 dimensions"),
    (["reference", "poisson", "--param", "a={in}/missing.npy", "--out", "x.h5"], "cannot read instance rows"),
    # checkpoints from elsewhere, damaged or crafted
    (["infer", "{burgers}", "--checkpoint", "{poisson_ckpt}", "--c", "4", "--out", "x.h5"], "does not belong to this run"),
    (["infer", "{burgers}", "--checkpoint", "{in}/extra.h5", "--c", "4", "--out", "x.h5"], "unexpected object /payload"),
    (["infer", "{burgers}", "--checkpoint", "{in}/truncated.h5", "--c", "4", "--out", "x.h5"], "unreadable checkpoint"),
    (["train", BURGERS, "--out", "{burgers}", *TINY, "--set", "train.epochs=2", "--set", "output.plots=false",
      "--set", "problem.resolution=[16,24]"], "holds a run with a different config"),
]


def _snapshot(directory: Path) -> dict[str, int]:
    return {str(p.relative_to(directory)): p.stat().st_mtime_ns for p in directory.rglob("*")}


def test_table_has_at_least_twenty_cases():
    assert len(CASES) >= 20


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args, fragment", CASES, ids=[f"{i:02d}-{c[1][:28]}" for i, c in enumerate(CASES)])
def test_bad_input_one_line_status_2_nothing_written(inputs, tmp_path, args, fragment):
    paths = {k: str(v) for k, v in inputs.items()}
    args = [a.format(**paths) for a in args]
    before = {k: _snapshot(inputs[k]) for k in ("burgers", "poisson", "in")}
    proc = run_cli(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], proc.stderr
    assert lines[0].startswith("deepfusion: error: ")
    assert list(tmp_path.iterdir()) == []  # nothing half-written where the user ran it
    assert {k: _snapshot(inputs[k]) for k in before} == before  # nor in the runs and files it read



@pytest.mark.timeout(120)
@pytest.mark.parametrize("index", [0, next(i for i, c in enumerate(CASES) if c[1] == "NaN or Inf")])
def test_a_fresh_process_reports_bad_input_the_same_way(inputs, tmp_path, index):
    # The cases above call the command line's main in this interpreter; here two of them run as
    # `python -m deepfusion` would for a user: the same line, status 2 as the process's exit status.
    args, fragment = CASES[index]
    paths = {k: str(v) for k, v in inputs.items()}
    proc = run_cli(*[a.format(**paths) for a in args], cwd=tmp_path, process=True)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("deepfusion: error: ") and fragment in lines[0], proc.stderr
    assert list(tmp_path.iterdir()) == []
