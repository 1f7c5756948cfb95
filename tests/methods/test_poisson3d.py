"""The 3-D Poisson family: the trilinear Q1 energy, its FEM system, the 3-D multigrid and the 3-D U-Net."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from scipy.sparse.linalg import LinearOperator, cg, spsolve

from diffnet.discretisation.energy import dirichlet_energy
from diffnet.generators.networks import UNet, build_network
from diffnet.families.poisson3d import Poisson3DFamily
from diffnet.solvers.fem import poisson_system
from diffnet.solvers.gmg import GMGSolver


def _nu(shape, seed=0):
    """A smooth positive diffusivity spanning about two decades."""
    z, y, x = np.meshgrid(*(np.linspace(0, 1, n) for n in shape), indexing="ij")
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, 3)
    return np.exp(1.5 * np.sin(3 * x + a[0]) * np.cos(2 * y + a[1]) * np.cos(4 * z + a[2]))


def _independent_hex_solution(nu: np.ndarray) -> np.ndarray:
    """Q1 hexahedral FEM of -div(nu grad u) = 0, u = 1 at x = 0 and 0 at x = 1, assembled here from
    scratch: element matrices by a tensor-product Gauss rule on the reference cube [-1, 1]^3,
    global COO assembly, the Dirichlet nodes eliminated, a direct solve."""
    nz, ny, nx = nu.shape
    h = np.array([1.0 / (nx - 1), 1.0 / (ny - 1), 1.0 / (nz - 1)])  # x, y, z
    corners = [(i, j, k) for k in (0, 1) for j in (0, 1) for i in (0, 1)]  # (x, y, z) offsets
    g = np.array([-1.0, 1.0]) / np.sqrt(3.0)
    rows, cols, vals = [], [], []
    index = np.arange(nz * ny * nx).reshape(nz, ny, nx)
    for k in range(nz - 1):
        for j in range(ny - 1):
            for i in range(nx - 1):
                ke = np.zeros((8, 8))
                for gz in g:
                    for gy in g:
                        for gx in g:
                            p = np.array([gx, gy, gz])
                            n_val = np.array([np.prod([(1 + (2 * c - 1) * p[d]) / 2 for d, c in enumerate(cn)])
                                              for cn in corners])
                            grad = np.zeros((8, 3))
                            for a, cn in enumerate(corners):
                                for d in range(3):
                                    f = [(1 + (2 * c - 1) * p[e]) / 2 for e, c in enumerate(cn)]
                                    f[d] = (2 * cn[d] - 1) / 2 * 2 / h[d]  # d/dx of (1 +- xi)/2 with xi = 2 x / h - 1
                                    grad[a, d] = np.prod(f)
                            nu_p = sum(n_val[a] * nu[k + cn[2], j + cn[1], i + cn[0]] for a, cn in enumerate(corners))
                            ke += nu_p * grad @ grad.T * np.prod(h) / 8.0
                ids = [index[k + cn[2], j + cn[1], i + cn[0]] for cn in corners]
                rows += [a for a in ids for _ in ids]
                cols += ids * 8
                vals += list(ke.ravel())
    n = nz * ny * nx
    A = sp.csr_matrix((vals, (rows, cols)), shape=(n, n))
    u = np.zeros((nz, ny, nx))
    u[:, :, 0] = 1.0
    free = np.zeros((nz, ny, nx), dtype=bool)
    free[:, :, 1:-1] = True
    f, d = free.ravel(), ~free.ravel()
    b = -A[f][:, d] @ u.ravel()[d]
    u.ravel()[f] = spsolve(A[f][:, f].tocsc(), b)
    return u


def test_energy_minimiser_is_the_independent_q1_hex_solution():
    nu = _nu((6, 7, 9))  # unequal sides: every axis convention is exercised
    truth = _independent_hex_solution(nu)
    nz, ny, nx = nu.shape
    h = (1.0 / (nx - 1), 1.0 / (ny - 1), 1.0 / (nz - 1))
    nu_t = torch.as_tensor(nu)[None]

    def gradient(free: np.ndarray) -> np.ndarray:
        u = np.zeros(nu.shape)
        u[:, :, 0] = 1.0
        u[:, :, 1:-1] = free.reshape(nz, ny, nx - 2)
        ut = torch.tensor(u[None], requires_grad=True)
        dirichlet_energy(ut, nu_t, *h).sum().backward()
        return ut.grad[0, :, :, 1:-1].numpy().ravel()

    # The energy is quadratic in the free values: its gradient is A v - b, so CG on the
    # autograd gradient finds the energy's minimiser without any assembled matrix.
    n = nz * ny * (nx - 2)
    b = -gradient(np.zeros(n))
    v, info = cg(LinearOperator((n, n), lambda w: gradient(w.ravel()) + b), b, rtol=1e-13, atol=0.0, maxiter=2000)
    assert info == 0
    np.testing.assert_allclose(v.reshape(nz, ny, nx - 2), truth[:, :, 1:-1], rtol=0, atol=1e-8)
    # The compiled assembly is the same system.
    system = poisson_system(nu)
    np.testing.assert_allclose(system.solve("direct"), truth, rtol=0, atol=1e-10)


def test_energy_is_exact_on_trilinear_fields():
    """2x2x2 Gauss is exact for trilinear u and nu: the energy equals the integral computed by a global rule."""
    shape = (5, 4, 6)
    z, y, x = np.meshgrid(*(np.linspace(0, 1, n) for n in shape), indexing="ij")

    def u_of(x, y, z):
        return (1 + 2 * x) * (0.5 - y) * (2 + z) + 3 * x * z

    def nu_of(x, y, z):
        return 1 + 0.5 * x * y * z + 0.3 * y

    # The integrand is a polynomial of degree <= 3 in each variable: 2-point Gauss per axis on
    # [0, 1] is exact for the whole domain at once.
    gp, gw = np.polynomial.legendre.leggauss(3)
    gp, gw = (gp + 1) / 2, gw / 2
    X, Y, Z = np.meshgrid(gp, gp, gp, indexing="ij")
    W = gw[:, None, None] * gw[None, :, None] * gw[None, None, :]
    ux = (2 * (0.5 - Y) * (2 + Z) + 3 * Z)
    uy = -(1 + 2 * X) * (2 + Z)
    uz = (1 + 2 * X) * (0.5 - Y) + 3 * X
    exact = (0.5 * nu_of(X, Y, Z) * (ux**2 + uy**2 + uz**2) * W).sum()
    h = (1.0 / (shape[2] - 1), 1.0 / (shape[1] - 1), 1.0 / (shape[0] - 1))
    got = dirichlet_energy(torch.as_tensor(u_of(x, y, z))[None], torch.as_tensor(nu_of(x, y, z))[None], *h)
    assert got.item() == pytest.approx(exact, rel=1e-13)


@pytest.mark.parametrize("n", [17, pytest.param(33, marks=pytest.mark.slow)])  # 33^3: a 3-D sparse LU, 4 s
def test_3d_multigrid_equals_a_direct_solve(n):
    system = poisson_system(_nu((n, n, n), seed=n))
    direct = system.solve("direct")
    gmg = GMGSolver.build(system)
    assert len(gmg.levels) >= 2
    u = gmg.vcycles(np.zeros(system.shape), 30)
    np.testing.assert_allclose(u, direct, rtol=0, atol=1e-8)
    # FMG to discretisation accuracy: the algebraic error left is below the discretisation estimate.
    stats = {}
    fmg = gmg.fmg(to_discretisation=True, stats=stats)
    assert np.linalg.norm(fmg - direct) / np.linalg.norm(direct) <= stats["discretisation_estimate"]
    # One V-cycle contracts the error (the polish).
    start = direct + 0.01 * np.random.default_rng(0).standard_normal(direct.shape)
    start[:, :, [0, -1]] = direct[:, :, [0, -1]]
    one = gmg.vcycles(start, 1)
    assert np.linalg.norm(one - direct) < 0.2 * np.linalg.norm(start - direct)


def test_family_floor_falls_at_second_order_and_its_field_keeps_the_boundary_values():
    family = Poisson3DFamily(resolution=(9, 9, 9))
    a = family.sample(2, "random", 0)
    nu = family.diffusivity_numpy(a)
    assert nu.shape == (2, 9, 9, 9) and 1e-4 < nu.min() and nu.max() < 1e4  # lambda^{3/2}: decades, not 15
    x = family.inputs(torch.as_tensor(a))
    assert x.shape == (2, 4, 9, 9, 9)
    torch.testing.assert_close(x[:, 0], torch.log(torch.as_tensor(nu)))
    u = family.field(torch.randn(2, 1, 9, 9, 9, dtype=torch.float64), torch.as_tensor(a))
    assert torch.all(u[..., 0] == 1) and torch.all(u[..., -1] == 0)
    floors = []
    for n in (9, 17):  # 5^3 is pre-asymptotic: nu changes by a decade across a cell
        fam = family.at_resolution((n, n, n))
        ref, truth = fam.reference(a), fam.truth(a)
        floors.append(np.mean([np.linalg.norm(r - t) / np.linalg.norm(t) for r, t in zip(ref, truth)]))
    assert floors[1] < floors[0] / 2.5  # second order: about 4x per halving of h
    # The loss is smallest at the FEM solution.
    ref = torch.as_tensor(family.reference(a))
    at_ref = family.loss_terms(ref, torch.as_tensor(a))["energy"]
    bumped = ref.clone()
    bumped[:, 2:-2, 2:-2, 2:-2] += 0.01
    assert torch.all(family.loss_terms(bumped, torch.as_tensor(a))["energy"] > at_ref)


@pytest.mark.parametrize("output", ["nodal", "multilevel"])
def test_3d_unet_and_level_stack_map_grids_to_grids(output):
    torch.manual_seed(0)
    net = UNet(4, 1, (4, 8, 8), output=output, dims=3)
    x = torch.rand(2, 4, 9, 10, 7)  # sides not multiples of 4: padded and cropped
    out = net(x)
    assert out.shape == (2, 1, 9, 10, 7) and torch.all(out == 0)  # heads start at zero
    torch.nn.init.normal_(net.head.weight, std=0.3)
    out = net(x)
    out.square().sum().backward()
    assert all(p.grad is not None for p in net.parameters() if p.requires_grad)
    stack = build_network("unet", 4, (4, 8), levels=(5, 9), top_channels=4, output=output, dims=3)
    y = stack(torch.rand(1, 4, 9, 9, 9))
    assert y.shape == (1, 1, 9, 9, 9)
    # The checkpointed forward is the same function.
    ck = UNet(4, 1, (4, 8, 8), checkpoint_activations=True, output=output, dims=3)
    ck.load_state_dict(net.state_dict())
    ck.train()
    net.train()
    torch.testing.assert_close(ck(x), net(x))


# A few-second 3-D run: 9^3 nodes, levels 5^3 and 9^3, a two-level 3-D U-Net; float64, so that runs
# on 1 and 2 ranks (another summation order) agree to 1e-9.
TINY_3D = ["--set", "problem.resolution=[9,9,9]", "--set", "multigrid.levels=[5,9]", "--set", "multigrid.epochs=[1,1]",
           "--set", "model.channels=[4,8]", "--set", "multigrid.top_channels=4", "--set", "data.n_train=8",
           "--set", "data.n_test=2", "--set", "train.batch_size=4", "--set", "train.log_every=1",
           "--set", "parallel.threads_per_rank=1", "--set", "train.dtype=float64"]


@pytest.fixture(scope="module")
def run3d(tmp_path_factory):
    from helpers import ROOT, run_cli

    run = tmp_path_factory.mktemp("p3d") / "run"
    proc = run_cli("train", str(ROOT / "configs" / "poisson3d.toml"), "--out", str(run), *TINY_3D)
    assert proc.returncode == 0, proc.stderr
    return run, proc.stdout


def test_3d_run_evaluates_writes_volumes_and_infers(run3d, tmp_path):
    import h5py

    from helpers import run_cli

    run, stdout = run3d
    assert "level 2/2 9x9x9" in stdout and "Q1 FEM on 17x17x17 (2x finer)" in stdout
    report = __import__("json").loads((run / "eval.json").read_text())
    assert report["resolution"] == [9, 9, 9] and len(report["rel_l2"]) == 2 and report["mean_floor"] > 0
    assert 0 <= report["mean_low_mode_share"] <= 1 and -1 <= report["mean_imprint_cosine"] <= 1
    assert (run / "plots" / "fields.png").stat().st_size > 10_000
    with h5py.File(run / "test_prediction.h5") as f:
        assert f["u"].shape == (2, 9, 9, 9) and f.attrs["axes"] == "z,y,x"
    xdmf = (run / "test_prediction.xdmf").read_text()
    assert 'TopologyType="3DRectMesh" Dimensions="9 9 9"' in xdmf and 'GeometryType="VXVYVZ"' in xdmf
    np.save(tmp_path / "a.npy", np.zeros((1, 6)))
    out = tmp_path / "u.h5"
    proc = run_cli("infer", str(run), "--param", "a=" + str(tmp_path / "a.npy"), "--polish", "30", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    with h5py.File(out) as f:
        polished = f["u"][0]
    # 30 V-cycles from the network's output reach the same-grid FEM solution.
    fem = Poisson3DFamily(resolution=(9, 9, 9)).reference(np.zeros((1, 6)))[0]
    np.testing.assert_allclose(polished, fem, atol=1e-8)
    (run.parent / "x.toml").write_text('[problem]\nfamily = "poisson3d"\nresolution = [9, 9]\n')
    proc = run_cli("train", str(run.parent / "x.toml"), "--out", str(tmp_path / "bad"))
    assert proc.returncode == 2 and "the poisson3d family is 3-D and needs 3 node counts" in proc.stderr


@pytest.mark.needs_mpiexec
@pytest.mark.timeout(600)
@pytest.mark.slow
def test_3d_run_on_two_ranks_is_the_one_rank_model_and_resumes_bitwise(run3d, tmp_path):
    import shutil

    from helpers import ROOT, run_cli
    from deepfusion.files.checkpoint import load_checkpoint
    run, _ = run3d
    two = tmp_path / "p2"
    proc = run_cli("train", str(ROOT / "configs" / "poisson3d.toml"), "--out", str(two), *TINY_3D, ranks=2, timeout=500)
    assert proc.returncode == 0, proc.stderr
    a = load_checkpoint(run / "checkpoints" / "step-00000004.h5").model
    b = load_checkpoint(two / "checkpoints" / "step-00000004.h5").model
    for key in a:
        assert np.abs(a[key] - b[key]).max() <= 1e-9 * max(np.abs(a[key]).max(), 1.0), key
    # Resume from the end of the first level: bitwise the same final model.
    copy = tmp_path / "resumed"
    shutil.copytree(run, copy)
    (copy / "checkpoints" / "step-00000004.h5").unlink()
    proc = run_cli("train", str(ROOT / "configs" / "poisson3d.toml"), "--out", str(copy), *TINY_3D)
    assert proc.returncode == 0 and "(step 2)" in proc.stdout, proc.stderr
    c = load_checkpoint(copy / "checkpoints" / "step-00000004.h5").model
    for key in a:
        np.testing.assert_array_equal(a[key], c[key], err_msg=key)
