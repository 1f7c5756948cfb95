"""HDF5 checkpoints and field files: round trips, corruption detection, layout checks."""

import xml.etree.ElementTree as ET

import h5py
import numpy as np
import pytest
import torch

from deepfusion.files.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint
from deepfusion.files.fields import FieldFileError, read_fields, write_fields
from diffnet.generators.networks import UNet


def _model_and_opt():
    torch.manual_seed(0)
    model = UNet(3, 1, (4, 8))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss = model(torch.randn(2, 3, 8, 8)).pow(2).sum() + sum(p.sum() for p in model.parameters())
    loss.backward()
    opt.step()
    return model, opt


def test_checkpoint_round_trip(tmp_path):
    model, opt = _model_and_opt()
    path = save_checkpoint(tmp_path / "step-00000007.h5", model, opt, epoch=1, step=7, config="x = 1\n", ranks=2)
    ckpt = load_checkpoint(path)
    assert (ckpt.epoch, ckpt.step, ckpt.ranks, ckpt.config) == (1, 7, 2, "x = 1\n")
    model2 = UNet(3, 1, (4, 8))
    opt2 = torch.optim.Adam(model2.parameters(), lr=1e-3)
    ckpt.restore(model2, opt2)
    for a, b in zip(model.state_dict().values(), model2.state_dict().values()):
        assert torch.equal(a, b)
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    for i in s1:
        for k in s1[i]:
            assert torch.equal(torch.as_tensor(s1[i][k]), torch.as_tensor(s2[i][k]))
    assert not list(tmp_path.glob(".*tmp*"))  # no temporary left behind
    assert latest_checkpoint(tmp_path) == path


def test_bit_flip_and_truncation_detected(tmp_path):
    model, opt = _model_and_opt()
    path = save_checkpoint(tmp_path / "c.h5", model, opt, epoch=0, step=1, config="", ranks=1)
    with h5py.File(path, "r+") as f:
        d = f["model/head.weight"]
        arr = d[()]
        arr.view(np.uint32)[0, 0, 0, 0] ^= 1  # one flipped bit in the stored data
        d[...] = arr
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        load_checkpoint(path)
    path2 = save_checkpoint(tmp_path / "d.h5", model, opt, epoch=0, step=1, config="", ranks=1)
    data = path2.read_bytes()
    path2.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError):
        load_checkpoint(path2)


def test_restore_refuses_other_architecture(tmp_path):
    model, opt = _model_and_opt()
    path = save_checkpoint(tmp_path / "c.h5", model, opt, epoch=0, step=1, config="", ranks=1)
    with pytest.raises(CheckpointError, match="shape|do not match"):
        load_checkpoint(path).restore(UNet(3, 1, (4, 16)))


def test_field_file_round_trip_and_xdmf(tmp_path):
    u = np.random.default_rng(0).random((3, 5, 7))
    coords = {"t": np.linspace(0, 1 / 3, 5), "x": np.linspace(0, 1, 7)}
    path = write_fields(tmp_path / "f.h5", u, coords, {"c": np.array([3.0, 4.0, 5.0])}, {"problem": "burgers"})
    data = read_fields(path)
    np.testing.assert_array_equal(data["u"], u)
    np.testing.assert_array_equal(data["c"], [3.0, 4.0, 5.0])
    assert data["attrs"]["problem"] == "burgers"
    root = ET.parse(path.with_suffix(".xdmf")).getroot()
    grids = root.findall(".//Grid[@GridType='Uniform']")
    assert len(grids) == 3
    assert grids[0].find("Topology").get("Dimensions") == "5 7"


def test_field_file_layout_checked_before_reading(tmp_path):
    bad = tmp_path / "bad.h5"
    with h5py.File(bad, "w") as f:
        f.create_dataset("u", shape=(10**6, 10**6, 10**6), dtype="f8")  # claims ~8e18 bytes, stores none
        f.attrs["axes"] = "t,x"
    with pytest.raises(FieldFileError, match="must be a float array"):
        read_fields(bad)
    with h5py.File(tmp_path / "nou.h5", "w") as f:
        f.create_dataset("v", data=[1.0])
    with pytest.raises(FieldFileError, match="no dataset 'u'"):
        read_fields(tmp_path / "nou.h5")
    (tmp_path / "junk.h5").write_bytes(b"not hdf5")
    with pytest.raises(FieldFileError, match="unreadable"):
        read_fields(tmp_path / "junk.h5")


def _crafted(tmp_path, name, edit):
    model, opt = _model_and_opt()
    path = save_checkpoint(tmp_path / f"{name}.h5", model, opt, epoch=0, step=1, config="", ranks=1)
    with h5py.File(path, "r+") as f:
        edit(f)
    return path


@pytest.mark.parametrize(
    "name, edit, message",
    [
        ("extra", lambda f: f.create_dataset("model/extra/evil", data=np.zeros(3)), "unexpected group /model/extra"),
        ("toplevel", lambda f: f.create_dataset("payload", data=np.zeros(3)), "unexpected object /payload"),
        ("softlink", lambda f: f.__setitem__("optimizer/0/alias", h5py.SoftLink("/model/head.weight")), "is a link"),
        ("string", lambda f: f.create_dataset("optimizer/0/note", data="hello"), "not plain numeric data"),
        ("gzip", lambda f: f.create_dataset("optimizer/0/packed", data=np.zeros(1000), compression="gzip"),
         "not plain numeric data"),
        # 2**40 float64 values (8 TiB) declared, chunked, never written: a few bytes on disk.
        ("huge", lambda f: f.create_dataset("optimizer/0/huge", shape=(2**40,), dtype="f8", chunks=(2**20,)),
         "claims shape"),
    ],
)
def test_crafted_checkpoint_refused_without_reading_it(tmp_path, name, edit, message):
    import resource

    path = _crafted(tmp_path, name, edit)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(path)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024  # nothing near 8 TiB


def test_non_finite_parameters_refused(tmp_path):
    model, opt = _model_and_opt()
    with torch.no_grad():
        next(model.parameters())[0] = float("nan")
    path = save_checkpoint(tmp_path / "nan.h5", model, opt, epoch=0, step=1, config="", ranks=1)
    with pytest.raises(CheckpointError, match="NaN or Inf"):
        load_checkpoint(path)
