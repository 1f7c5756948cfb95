"""Domain parallelism: one sample's grid split over ranks (diffnet.tiling, deepfusion.halo)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from conftest import ROOT, child_env
from deepfusion.halo import tile_bounds
from deepfusion.runtime import find_mpiexec
from diffnet.networks import UNet
from diffnet.problems.poisson3d import Poisson3D
from diffnet.tiling import Whole, halo_pad, tiled_upsample2

MPIEXEC = find_mpiexec()


@pytest.mark.parametrize("dims, output", [(2, "nodal"), (2, "multilevel"), (3, "multilevel")])
def test_one_tile_is_the_whole_grid(dims, output):
    # The tiled layers with the one-tile tiling are the plain layers (halo = zero padding,
    # statistics over the tile, upsampling with clamped ends).
    torch.manual_seed(0)
    net = UNet(3, 1, (4, 8, 8), output=output, dims=dims).double()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(2, 3, *(16,) * dims, dtype=torch.float64)
    assert torch.allclose(net(x, Whole(x.shape[2:])), net(x), rtol=0, atol=1e-12)


def test_upsampling_and_halo_modes_on_one_tile():
    x = torch.randn(2, 3, 6, 10, dtype=torch.float64)
    whole = Whole(x.shape[2:])
    up = torch.nn.functional.interpolate(x, size=(12, 20), mode="bilinear", align_corners=False)
    assert torch.allclose(tiled_upsample2(x, whole), up, rtol=0, atol=1e-15)
    assert torch.equal(halo_pad(x, whole, 1, "zeros"), torch.nn.functional.pad(x, (1, 1, 1, 1)))
    assert torch.equal(halo_pad(x, whole, 2, "replicate"), torch.nn.functional.pad(x, (2, 2, 2, 2), mode="replicate"))
    assert torch.equal(halo_pad(x, whole, [(0, 1), (0, 1)], "none"), x)
    with pytest.raises(ValueError, match="unknown halo mode"):
        halo_pad(x, whole, 1, "reflect")


def test_tile_bounds_split_evenly_or_say_why():
    assert tile_bounds(64, 4, 8) == [(0, 16), (16, 32), (32, 48), (48, 64)]
    with pytest.raises(ValueError, match="do not split into 3 tiles"):
        tile_bounds(64, 3)
    with pytest.raises(ValueError, match="multiple of 8"):
        tile_bounds(48, 4, 8)


def test_tiled_loss_on_one_tile_is_the_loss():
    problem = Poisson3D((9, 9, 9))
    params = torch.rand(2, 6, dtype=torch.float64) * 6 - 3
    raw = torch.randn(2, 1, 9, 9, 9, dtype=torch.float64)
    tiled = problem.tile_loss_terms(raw, params, Whole(problem.resolution))["energy"]
    whole = problem.loss_terms(problem.field(raw, params), params)["energy"]
    assert torch.allclose(tiled, whole, rtol=1e-14, atol=0)


@pytest.mark.mpi
@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec (install the mpich extra)")
@pytest.mark.timeout(180)
@pytest.mark.parametrize("n, cases", [(2, 10), (4, 21)])
def test_split_sample_equals_the_whole_grid(n, cases):
    # Every family (the Q1 energies tile by tile, Burgers through the gathered default), the
    # nodal and multilevel U-Net, 2-D [1,2] [2,1] [2,2] [1,4] and 3-D slabs and pencils:
    # output, loss and summed gradients equal the unsplit run (float64 1e-10, float32 1e-5).
    proc = subprocess.run([MPIEXEC, "-n", str(n), sys.executable, str(ROOT / "tests" / "mpi_scripts" / "tiles.py")],
                          env=child_env(), capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("OK ") == cases, proc.stdout
