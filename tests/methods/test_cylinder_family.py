"""The cylinder family (the DFG 2D-1 channel, the cylinder's centre and radius the instance, diffnet/families/cylinder.py):
its field, loss and floor, its refusals, its classical solve from the nearest solved cylinder, its quantities read
off a reported (masked) field, and its derived fields zero outside the fluid; three instances of three unknowns."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from deepfusion.configuration.config import load_config
from deepfusion.configuration.family_checks import checked_family
from diffnet.families.cylinder import CylinderFamily
from diffnet.solvers.cylinder import BENCHMARK, channel_boundary, discretised

GRID = (17, 89)
CYLINDERS = np.array([BENCHMARK, (0.17, 0.23, 0.045), (0.235, 0.175, 0.057)])  # S = C = 3


@pytest.fixture(scope="module")
def family():
    return CylinderFamily(resolution=GRID, truth_refine=2)


@pytest.fixture(scope="module")
def floor(family):
    return family.reference(CYLINDERS)


def test_the_field_holds_the_walls_the_inflow_and_the_inactive_nodes_and_the_floor_is_the_residuals_root(family, floor):
    p = torch.as_tensor(CYLINDERS)
    fields = family.field(torch.randn(3, 3, *GRID, dtype=torch.float64), p)
    for k, row in enumerate(CYLINDERS):
        fixed, values = channel_boundary(GRID, discretised(row, GRID).active)
        assert np.array_equal(fields[k].numpy()[fixed], values[fixed])
        assert (~discretised(row, GRID).active).sum() > 0  # the cylinder's core: held at 0
    r = family.residual(fields, p)
    assert float(r.abs().max()) > 1e-2
    assert float(family.residual(torch.as_tensor(floor), p).abs().max()) < 1e-9
    # Each instance its own cylinder: the floor of one is not the root of another's residual.
    assert float(family.residual(torch.as_tensor(floor[[1, 2, 0]]), p).abs().max()) > 1e-3


def test_the_inputs_and_domain_are_each_instances_own(family):
    x = family.inputs(torch.as_tensor(CYLINDERS))
    sdf = family.domain(CYLINDERS)
    assert x.shape == (3, 3, *GRID) and sdf.shape == (3, *GRID)
    assert np.allclose(x[:, 0].numpy() * 0.41, sdf) and not np.allclose(sdf[0], sdf[1])
    assert family.coordinates()["x"][-1] == pytest.approx(2.2) and family.coordinates()["y"][-1] == pytest.approx(0.41)


@pytest.mark.parametrize("row, match", [
    ((0.2, 0.05, 0.05), r"instance 0: the cylinder \(x 0.2, y 0.05, r 0.05\) touches or comes within a cell"),
    ((0.2, 0.2, 0.01), "instance 0: the cylinder's radius 0.01 is under a cell"),
    ((0.2, 0.2, -0.05), r"instance 0: cylinder\[2\] \(r\) = -0.05; the physics needs 0 < r < 0.205"),
])
def test_a_cylinder_touching_a_wall_or_thinner_than_a_cell_is_refused_in_one_line(family, row, match):
    with pytest.raises(ValueError, match=match):
        family.check_instances(np.array([row]))


@pytest.mark.parametrize("override, match", [
    ({"problem": {"resolution": [33, 33]}}, r"problem.resolution: the channel's cells are 0.06875 x 0.01281"),
    ({"cylinder": {"cylinder_r": [0.04, 0.2]}}, "cylinder ranges: the cylinder .* touches or comes within a cell"),
    ({"cylinder": {"test_cylinders": [0.2, 0.2, 0.09]}}, r"test_cylinders: cylinder 0 \(x 0.2, y 0.2, r 0.09\) lies outside"),
    ({"cylinder": {"test_cylinders": [0.2, 0.2]}}, "need x, y, r for each cylinder"),
])
def test_the_configuration_refuses_a_bad_channel(tmp_path, override, match):
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    raw = tomllib.loads((root / "configs" / "cylinder.toml").read_text())
    for section, values in override.items():
        raw[section] |= values
    path = tmp_path / "c.toml"
    path.write_text("\n".join(f"[{s}]\n" + "\n".join(f"{k} = {v!r}".replace("'", '"').replace("True", "true")
                                                       .replace("(", "[").replace(")", "]") for k, v in body.items())
                              for s, body in raw.items()))
    with pytest.raises(ValueError, match=match):
        checked_family(load_config(path))


def test_the_quantities_of_a_reported_field_are_the_floors_own(family, floor):
    fluid = (family.domain(CYLINDERS) <= 0)[:, None]
    reported = family.quantities(CYLINDERS, floor * fluid)  # zero in the cylinder, as inference reports it
    for name, values in reported.items():
        assert values.shape == (3,)
    # The benchmark's drag on 17 x 89 (6.324, measured 2026-12-07) and the other two: each cylinder its own.
    assert reported["drag"][0] == pytest.approx(6.3239, abs=1e-3) and len(set(np.round(reported["drag"], 3))) == 3
    vort = family.derived(CYLINDERS, floor * fluid)["vorticity"]
    assert vort.shape == (3, *GRID) and np.abs(vort[~fluid[:, 0]]).max() == 0.0 and np.abs(vort).max() > 1.0


def test_one_newton_step_polishes_and_the_classical_solve_is_newton_from_the_inflow(family, floor):
    start = floor * 0.9
    polished = family.polish(CYLINDERS, start, 1)
    assert np.abs(polished - floor).max() < 0.2 * np.abs(start - floor).max()
    solver = family.classical_solver("newton-lu", GRID[0])
    np.testing.assert_allclose(solver(CYLINDERS[1]), floor[1], rtol=0, atol=1e-8)
    assert solver.last.newton_steps == 5  # quadratic from the inflow profile (5 measured on every grid, 2026-12-07)
    with pytest.raises(ValueError, match="unknown method 'picard'"):
        family.classical_solver("picard", GRID[0])


def test_the_channels_streamlines_are_drawn_in_wide_panels_one_above_the_other(family, floor, tmp_path):
    import matplotlib.image

    from deepfusion.files.plots import plot_streamlines

    fluid = (family.domain(CYLINDERS[:1]) <= 0)[:, None]
    w = family.derived(CYLINDERS[:1], floor[:1] * fluid)["vorticity"]
    out = plot_streamlines(floor[:1, :2], floor[:1, :2], (w, w), "vorticity", family.coordinates(), ["benchmark"],
                           tmp_path / "streamlines.png")
    height, width = matplotlib.image.imread(out).shape[:2]
    assert width > height  # a 2.2 x 0.41 channel: two wide panels stacked, not two slivers side by side
