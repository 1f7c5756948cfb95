"""Linear elasticity on the Q1 grid: the vector energy, its block Hessian stencil, its assembled system, the AMG
solve with the rigid-body modes, and the torch V-cycle of the vector Hessian (diffnet/discretisation/elasticity.py,
diffnet/solvers/elasticity.py, diffnet/multigrid/vcycle.py)."""

import re

import numpy as np
import pytest
import torch

from diffnet.discretisation.elasticity import elasticity_energy, elasticity_stencil
from diffnet.grid.material import lame
from diffnet.solvers.elasticity import (body_load, elasticity_matrix, elasticity_system, from_dofs, rigid_body_modes,
                                        solve_elasticity, to_dofs)
from diffnet.solvers.fem import grid_spacing


def _grid(shape):
    """The node coordinates x first, each of ``shape``."""
    return np.meshgrid(*[np.linspace(0.0, 1.0, n) for n in shape], indexing="ij")[::-1]


def _clamped(shape):
    """Node-major mask of every boundary dof."""
    edge = np.zeros(shape, bool)
    for axis in range(len(shape)):
        index = [slice(None)] * len(shape)
        index[axis] = [0, -1]
        edge[tuple(index)] = True
    return to_dofs(np.stack([edge] * len(shape)))


@pytest.mark.parametrize("shape, plane", [((9, 11), "strain"), ((9, 11), "stress"), ((5, 6, 7), "strain")])
def test_the_energy_is_the_assembled_quadratic_form_and_its_gradient_k_u(shape, plane):
    rng = np.random.default_rng(0)
    young = np.exp(rng.normal(size=shape))
    K = elasticity_matrix(young, 0.3, plane)
    u = rng.normal(size=(len(shape), *shape))
    x = to_dofs(u)
    field = torch.tensor(u[None], requires_grad=True)
    energy = elasticity_energy(field, torch.tensor(young[None]), 0.3, grid_spacing(shape), plane)
    (grad,) = torch.autograd.grad(energy.sum(), field)
    scale = np.abs(K @ x).max()
    assert energy.item() == pytest.approx(0.5 * x @ (K @ x), rel=1e-13)
    np.testing.assert_allclose(to_dofs(grad[0].numpy()), K @ x, rtol=0, atol=1e-13 * scale)
    assert abs(K - K.T).max() <= 1e-14 * abs(K).max()
    # The rigid-body motions cost nothing: K's null space, the near-null space the AMG is given.
    assert np.abs(K @ rigid_body_modes(shape)).max() <= 1e-12 * abs(K).max()
    np.testing.assert_array_equal(from_dofs(x, shape), u)


@pytest.mark.parametrize("shape, plane", [((6, 7), "strain"), ((6, 7), "stress"), ((4, 5, 3), "strain")])
def test_the_block_stencil_is_the_assembled_matrix_and_what_the_probes_read(shape, plane):
    from diffnet.families.elasticity import ElasticityFamily, Elasticity3DFamily
    from diffnet.multigrid.hessian import probe_stencil
    from diffnet.multigrid.stencil import apply_stencil

    rng = np.random.default_rng(1)
    d, n = len(shape), int(np.prod(shape))
    young = np.exp(rng.normal(size=(2, *shape)))
    nu = np.array([0.3, 0.15])
    stencil = elasticity_stencil(torch.as_tensor(young), torch.as_tensor(nu), grid_spacing(shape), plane)
    assert stencil.shape == (2, d, d, 3**d, *shape)
    # Column by column: the stencil applied to each unit field is K's column (K's dofs node-major).
    for s in range(2):
        K = elasticity_matrix(young[s], nu[s], plane).toarray()
        units = torch.eye(d * n, dtype=torch.float64).reshape(d * n, d, *shape)
        columns = apply_stencil(stencil[s : s + 1].expand(d * n, *stencil.shape[1:]), units)
        dense = np.stack([to_dofs(c) for c in columns.numpy()], axis=1)  # rows node-major, columns component-major
        order = np.array([to_dofs(e.reshape(d, *shape)).argmax() for e in np.eye(d * n)])
        assert np.abs(dense[:, np.argsort(order)] - K).max() <= 1e-12 * np.abs(K).max()
    # The family's hessian is this stencil, and the default's C 3^d probes of its loss read the same.
    family = ElasticityFamily((7, 6), plane=plane) if d == 2 else Elasticity3DFamily((5, 4, 4))
    low, high = family.parameters.bounds()
    p = torch.as_tensor(rng.uniform(low, high, (2, len(low))))
    u = family.field(torch.as_tensor(rng.normal(size=(2, d, *family.resolution))), p)
    analytic, probed = family.hessian(u, p), probe_stencil(family, u, p)
    assert (analytic - probed).abs().max() <= 1e-10 * analytic.abs().max()


@pytest.mark.parametrize("dims", [2, 3])
def test_the_vcycle_of_the_vector_hessian_is_symmetric_and_contracts(dims):
    # B for two or three coupled components: symmetric (a CG preconditioner, and the preconditioned loss's
    # gradient B g), and an approximate inverse: each cycle of I - B A shrinks the error. At Jacobi's scalar
    # damping 2/3 the 3-D cycle diverged (the error grew 8x a cycle); the Gershgorin damping holds it.
    from diffnet.families.elasticity import ElasticityFamily, Elasticity3DFamily
    from diffnet.multigrid.vcycle import VCycle

    family = ElasticityFamily((33, 33)) if dims == 2 else Elasticity3DFamily((17, 17, 17))
    low, high = family.parameters.bounds()
    rng = np.random.default_rng(2)
    p = torch.as_tensor(rng.uniform(low, high, (2, len(low))))
    u = family.field(torch.as_tensor(rng.normal(size=(2, dims, *family.resolution))), p)
    B = VCycle.build(family, u, p)
    x, y = (torch.as_tensor(rng.normal(size=u.shape)) * B.free for _ in range(2))
    assert abs(float((B(x) * y).sum() - (x * B(y)).sum())) <= 1e-12 * float((B(x) * y).sum().abs())
    e = torch.as_tensor(rng.normal(size=u.shape)) * B.free
    for _ in range(5):
        left = e - B(B.operator(e))
        assert float(left.norm()) < 0.8 * float(e.norm())
        e = left


def test_a_batch_with_one_ratio_per_sample_is_each_sample_alone():
    rng = np.random.default_rng(1)
    u = torch.tensor(rng.normal(size=(2, 2, 6, 7)))
    young = torch.tensor(np.exp(rng.normal(size=(2, 6, 7))))
    both = elasticity_energy(u, young, torch.tensor([0.2, 0.4], dtype=torch.float64), grid_spacing((6, 7)), "stress")
    for s, nu in enumerate((0.2, 0.4)):
        alone = elasticity_energy(u[s:s + 1], young[s:s + 1], nu, grid_spacing((6, 7)), "stress")
        assert both[s].item() == pytest.approx(alone.item(), rel=1e-14)


def test_the_lame_maps_are_scikit_fems():
    from skfem.models.elasticity import lame_parameters, plane_stress

    assert lame(0.3, "strain") == pytest.approx(lame_parameters(1.0, 0.3))
    assert lame(0.3, "stress") == pytest.approx(plane_stress(1.0, 0.3))
    with pytest.raises(ValueError, match="plane must be one of strain, stress"):
        lame(0.3, "shell")


@pytest.mark.parametrize("dims", [2, 3])
def test_the_matrix_is_scikit_fems_on_one_instance(dims):
    # Constant E: both integrate exactly, so the energies of one nodal field agree to rounding.
    import skfem
    from skfem.models.elasticity import lame_parameters, linear_elasticity

    shape = (5, 7) if dims == 2 else (3, 4, 5)
    axes = [np.linspace(0.0, 1.0, n) for n in shape[::-1]]  # x first
    if dims == 2:
        mesh, element = skfem.MeshQuad.init_tensor(*axes), skfem.ElementQuad1()
    else:
        mesh, element = skfem.MeshHex.init_tensor(*axes), skfem.ElementHex1()
    basis = skfem.Basis(mesh, skfem.ElementVector(element))
    K_skfem = skfem.asm(linear_elasticity(*lame_parameters(2.5, 0.3)), basis)

    def field(*x):
        return [np.sin(2 * x[0] + x[1]), x[0] * x[1] ** 2 + np.cos(x[-1]), np.exp(x[0] * x[-1])][:dims]

    u_skfem = np.zeros(basis.N)
    for i, values in enumerate(field(*mesh.p)):
        u_skfem[basis.nodal_dofs[i]] = values
    x = to_dofs(np.stack(field(*_grid(shape))))
    K = elasticity_matrix(np.full(shape, 2.5), 0.3)
    assert 0.5 * x @ (K @ x) == pytest.approx(0.5 * u_skfem @ (K_skfem @ u_skfem), rel=1e-12)


@pytest.mark.parametrize("dims, sizes", [(2, (9, 17, 33, 65)), (3, (5, 9, 17))])
def test_a_manufactured_solution_converges_at_order_two(dims, sizes):
    # u_i = prod_j sin(pi x_j) for every component, clamped on the boundary, E = 1, plane strain:
    # f = -(mu lap u + (lambda + mu) grad div u).
    lam, mu = lame(0.3, "strain")

    def force(*x):
        s = [np.sin(np.pi * c) for c in x]
        c = [np.cos(np.pi * c) for c in x]
        prod = np.prod(s, axis=0)
        out = []
        for i in range(dims):  # d/dx_i div u = sum_j d2/dx_i dx_j prod_k sin(pi x_k)
            grad_div = sum(-np.pi**2 * prod if j == i else
                           np.pi**2 * c[i] * c[j] * np.prod([s[k] for k in range(dims) if k not in (i, j)], axis=0)
                           for j in range(dims))
            out.append(mu * dims * np.pi**2 * prod - (lam + mu) * grad_div)
        return out

    errors = []
    for n in sizes:
        shape = (n,) * dims
        exact = np.stack([np.prod([np.sin(np.pi * c) for c in _grid(shape)], axis=0)] * dims)
        fixed = _clamped(shape)
        stats = {}
        u = solve_elasticity(elasticity_matrix(np.ones(shape), 0.3), body_load(force, shape), fixed,
                             np.zeros(fixed.shape), shape, "amg", stats=stats)
        assert stats["relative_residual"] <= 1e-9 and stats["iterations"] <= 40
        errors.append(np.abs(u - exact).max())
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    assert (np.abs(orders - 2.0) < 0.1).all(), orders


def test_amg_with_the_rigid_body_modes_is_the_direct_solve_and_a_free_body_is_refused():
    rng = np.random.default_rng(2)
    shape = (17, 25)
    K = elasticity_matrix(np.exp(rng.uniform(-2, 2, size=shape)), 0.45, "stress")
    clamped = np.zeros(shape, bool)
    clamped[:, 0] = True  # held at x = 0 only: the rest of the body must be carried by the modes
    fixed = to_dofs(np.stack([clamped, clamped]))
    load = body_load(np.stack([np.zeros(shape), -np.ones(shape)]), shape)
    stats = {}
    amg = solve_elasticity(K, load, fixed, np.zeros(fixed.shape), shape, "amg", stats=stats)
    direct = solve_elasticity(K, load, fixed, np.zeros(fixed.shape), shape, "direct")
    np.testing.assert_allclose(amg, direct, rtol=0, atol=1e-8 * np.abs(direct).max())
    assert direct[1].min() < 0 and stats["iterations"] <= 60
    with pytest.raises(ValueError, match="a body held nowhere moves freely"):
        solve_elasticity(K, load, np.zeros(fixed.shape, bool), np.zeros(fixed.shape), shape)


def test_side_conditions_per_component_and_a_cantilever_under_a_tip_traction():
    # Clamped at x = 0, a downward traction on x = 1, the rest free: the tip moves down, the traction's
    # work is twice the stored energy at the minimiser (Clapeyron), and the system's solve is the minimiser.
    from diffnet.instances.boundary import component_boundaries

    shape = (9, 33)
    sides = {"x0": "u=0", "x1": "traction=0,-1", "y0": "free", "y1": "free"}
    boundaries = component_boundaries(sides, 2)
    assert [b.describe() for b in boundaries] == ["x0:u=0 x1:flux=0 y0:flux=0 y1:flux=0",
                                                  "x0:u=0 x1:flux=-1 y0:flux=0 y1:flux=0"]
    system = elasticity_system(np.ones(shape), 0.3, boundaries, "stress")
    u = system.solve("amg")
    assert np.all(u[:, :, 0] == 0) and u[1, :, -1].max() < 0
    x = to_dofs(u)
    assert system.load @ x == pytest.approx(x @ (system.K @ x), rel=1e-8)
    rng = np.random.default_rng(3)
    nudge = rng.normal(size=u.shape) * 1e-3
    nudge[:, :, 0] = 0  # stay admissible
    assert system.energy(u + nudge) > system.energy(u)
    # The traction load integrates to the side's length times t.
    assert system.load.reshape(*shape, 2)[..., 1].sum() == pytest.approx(-1.0)


@pytest.mark.parametrize("text, message", [
    ("u=1,2,3", "give 2 components (x first) or one value"), ("traction=1", "give 2 components (x first)"),
    ("clamped", "is not a side condition"), ("u=x", "'x' is not a number"), ("traction=0,inf", "must be finite")])
def test_a_bad_vector_side_is_refused_in_one_line(text, message):
    from diffnet.instances.boundary import parse_vector_side, vector_side_check

    with pytest.raises(ValueError, match=re.escape(message)):
        parse_vector_side(text, 2)
    assert message in vector_side_check(2)(text) and vector_side_check(2)("u=0,0.5") is None


@pytest.mark.parametrize("plane", ["strain", "stress"])
def test_the_poisson_ratio_limits_are_one_declaration_the_family_and_the_lame_maps_read(plane):
    # One fact, read three ways: the configuration's nu_range check, the instance check and lame() itself.
    from diffnet.grid.material import POISSON_RATIO, lame
    from diffnet.families.elasticity import ElasticityFamily

    family = ElasticityFamily((9, 9), plane=plane)
    lower, upper = family.parameters.physical()
    assert (lower[-1], upper[-1]) == POISSON_RATIO and np.isinf(lower[:-1]).all()
    for nu in (0.5, 1.0):  # 0.5 divided by zero under plane strain, 1 under plane stress
        with pytest.raises(ValueError, match=rf"^instance 0: a\[4\] \(nu\) = {nu:g}; the physics needs -1 < nu < 0\.5$"):
            family.check_instances(np.array([[0.0] * 4 + [nu]]))
        with pytest.raises(ValueError, match=rf"^Poisson ratio nu = {nu:g}: an isotropic material needs -1 < nu < 0.5$"):
            lame(nu, plane)
