"""The navier_stokes family (the lid-driven cavity over Re, diffnet/families/navier_stokes.py), its sparse LU
(diffnet/solvers/sparse_lu.py) and the forward mode of the loss convolutions its Gauss-Newton columns take."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
import torch.autograd.forward_ad as fwAD

from diffnet.backend.precision import conv
from diffnet.discretisation.navier_stokes import vorticity
from diffnet.families.navier_stokes import CavityFamily
from diffnet.multigrid.residual_sweeps import residual_sweeps
from diffnet.solvers.navier_stokes import cavity_boundary, nearest_rung, stream_function
from diffnet.solvers.sparse_lu import available, lu_solve

N = 17
RE = np.array([150.0, 400.0, 470.0])  # three instances of three unknowns: S = C (the ladder to 500: 1 s)


@pytest.fixture(scope="module")
def family():
    return CavityFamily(resolution=(N, N))


@pytest.fixture(scope="module")
def floor(family):
    return family.reference(RE)


def test_the_sparse_lus_agree_and_an_unknown_one_is_named():
    rng = np.random.default_rng(0)
    a = sp.random(60, 60, density=0.1, random_state=0) + sp.identity(60) * 4.0
    b = rng.standard_normal((60, 2))
    x = lu_solve(a, b, "superlu")
    np.testing.assert_allclose(a @ x, b, atol=1e-12)
    if available() == "pardiso":
        np.testing.assert_allclose(lu_solve(a, b, "pardiso"), x, atol=1e-12)
    with pytest.raises(ValueError, match="unknown LU 'umfpack'; choose from pardiso, superlu"):
        lu_solve(a, b, "umfpack")


def test_the_loss_convolution_has_a_forward_mode():
    x, t = torch.randn(2, 1, 5, 5, dtype=torch.float64), torch.randn(2, 1, 5, 5, dtype=torch.float64)
    w = torch.randn(3, 1, 2, 2, dtype=torch.float64)
    with fwAD.dual_level():
        out = fwAD.unpack_dual(conv(fwAD.make_dual(x, t), w))
    torch.testing.assert_close(out.tangent, torch.nn.functional.conv2d(t, w), rtol=0, atol=1e-14)


def test_the_field_holds_the_walls_and_the_pinned_pressure_and_the_floor_is_the_residuals_root(family, floor):
    re = torch.as_tensor(RE)
    fields = family.field(torch.randn(3, 3, N, N, dtype=torch.float64), re)
    fixed, values = cavity_boundary(N)
    assert np.array_equal(fields.numpy()[:, fixed], np.broadcast_to(values[fixed], (3, fixed.sum())))
    r = family.residual(fields, re)
    assert float(r[:, torch.as_tensor(fixed)].abs().max()) == 0.0 and float(r.abs().max()) > 1.0
    assert float(family.residual(torch.as_tensor(floor), re).abs().max()) < 1e-9
    # Per instance, not per unknown (S = C = 3): each sample's residual is its own Re's alone.
    alone = torch.cat([family.residual(fields[k:k + 1], re[k:k + 1]) for k in range(3)])
    torch.testing.assert_close(r, alone, rtol=0, atol=1e-12)


def test_sweeps_on_the_gauss_newton_operator_bring_a_perturbed_field_towards_the_floor(family, floor):
    re = torch.as_tensor(RE)
    start = family.field(torch.as_tensor(floor) + 0.02 * torch.randn(3, 3, N, N, dtype=torch.float64,
                                                                        generator=torch.Generator().manual_seed(0)), re)
    swept = residual_sweeps(family, start, re, 1)
    before, after = (family.loss_terms(u, re)["residual"] for u in (start, swept))
    assert bool((after < 0.3 * before).all())


def test_the_classical_solve_starts_from_the_nearest_rung_and_meets_the_reference(family, floor):
    # The solver solves its ladder to the range's top before any timing: a range to 500 keeps it short here.
    solver = CavityFamily(resolution=(N, N), re_range=(100.0, 500.0)).classical_solver("newton-lu", N)
    np.testing.assert_allclose(solver(np.array(RE[0])), floor[0], atol=1e-9)
    assert 1 <= solver.last.newton_steps <= 6  # from the rung Re = 200
    solver(np.array(RE[1]))
    assert solver.last.newton_steps >= 1  # Re = 400 is a rung, but a classical solve starts from another one
    assert family.classical_to_grid("newton-lu", floor[1], RE[1]).shape == (3, N, N)
    with pytest.raises(ValueError, match="instance 0: Re = 50 lies outside the family's range"):
        family.check_instances(np.array([50.0]))
    assert [nearest_rung(r) for r in (30.0, 149.0, 400.0, 1000.0)] == [100.0, 100.0, 400.0, 1000.0]
    assert [nearest_rung(r, other=True) for r in (100.0, 149.0, 400.0, 650.0)] == [200.0, 100.0, 300.0, 600.0]


def test_vorticity_and_stream_function_of_a_known_flow_converge_at_second_order():
    errors = []
    for n in (17, 33):
        y, x = np.meshgrid(*[np.linspace(0.0, 1.0, n)] * 2, indexing="ij")
        psi = np.sin(np.pi * x) ** 2 * np.sin(np.pi * y) ** 2
        u = 2 * np.pi * np.sin(np.pi * x) ** 2 * np.sin(np.pi * y) * np.cos(np.pi * y)
        v = -2 * np.pi * np.sin(np.pi * x) * np.cos(np.pi * x) * np.sin(np.pi * y) ** 2
        fields = np.stack([u, v, 0 * u])[None].repeat(3, 0) * np.array([1.0, 2.0, -1.0])[:, None, None, None]
        got = stream_function(fields)
        errors.append(max(np.abs(got[k] - s * psi).max() for k, s in enumerate((1.0, 2.0, -1.0))))
        omega = vorticity(fields[:1], (1.0 / (n - 1),) * 2)[0][4:-4, 4:-4]
        exact = -(np.gradient(np.gradient(psi, 1 / (n - 1), axis=1), 1 / (n - 1), axis=1)
                  + np.gradient(np.gradient(psi, 1 / (n - 1), axis=0), 1 / (n - 1), axis=0))[4:-4, 4:-4]
        assert np.abs(omega - exact).max() < 0.05 * np.abs(exact).max()
    assert errors[1] < errors[0] / 3.0


def test_derived_fields_and_ghias_quantities(family, floor):
    derived = family.derived(RE, floor)
    assert set(derived) == {"vorticity", "stream_function", "pressure"}
    h = 1.0 / (N - 1)
    weights = np.outer(*[np.r_[0.5, np.ones(N - 2), 0.5] * h] * 2)
    assert np.abs((derived["pressure"] * weights).sum(axis=(1, 2))).max() < 1e-12
    q = family.quantities(RE, floor)
    # The primary vortex turns clockwise: u < 0 below the lid's centre, psi < 0, v changes sign across y = 1/2.
    assert (q["u_min"] < -0.15).all() and (q["psi_min"] < -0.09).all() and (q["v_min"] < 0).all() and (q["v_max"] > 0).all()
    np.testing.assert_allclose(q["psi_min"], derived["stream_function"].min(axis=(1, 2)))


def test_the_polish_is_newtons_and_converges_quadratically_from_a_near_field(family, floor):
    near = floor + 1e-3 * np.sin(np.linspace(0.0, 3.0, N))[None, None, :, None] * np.ones((3, 3, N, N))
    near[:, :, [0, -1], :] = floor[:, :, [0, -1], :]
    errors = [np.abs(family.polish(RE, near, k) - floor).max() for k in (0, 1, 2)]
    # Measured: 1.0e-3 -> 1.2e-5 -> 4.4e-10 (each step squares the error, up to a constant near 12).
    assert errors[0] > 9e-4 and errors[1] < 2e-5 and errors[2] < 1e-8


def test_a_velocity_is_drawn_as_streamlines_over_the_vorticity(family, floor, tmp_path):
    from deepfusion.files.plots import plot_streamlines

    assert family.velocities == ("velocity",) and family.vectors["velocity"] == ("u", "v")
    w = family.derived(RE[:1], floor[:1])["vorticity"]
    out = plot_streamlines(floor[:1, :2], floor[:1, :2], (w, w), "vorticity", family.coordinates(), ["Re = 150"],
                           tmp_path / "streamlines.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
