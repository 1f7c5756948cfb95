"""One Q1 stack for 2-D and 3-D gives the figures the two stacks gave: energies, stencils, assembled
systems, multigrid cycles, references, floors and polish, against the values the separate 2-D and 3-D
modules produced before they became one (tests/data/q1_golden.npz, made by tests/data/q1_golden.py at
commit 224584a).

Tolerances: the compiled passes on stored inputs must agree bit for bit (the same arithmetic in the
same order, whatever the CPU); everything else to 1e-12 of the field's size, because a torch
convolution, a BLAS product or torch's exp may round the last bit differently on another CPU (on the
machine that made the file all but the direct solves and the 3-D multigrid agree bitwise). The sparse
LU's ordering changed (one minimum-degree ordering for both dimensions), and the 3-D multigrid's
operators are now formed element by element or by the stencil product instead of CSR triple products:
both agree to rounding. pyamg's default solve stops at a relative residual of 1e-8 from a random start
vector, so its rows agree to that tolerance only.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import ROOT

from diffnet.solvers.classical import q1_solver
from diffnet.discretisation.energy import dirichlet_energy, dirichlet_stencil, reaction_diffusion_energy, reaction_diffusion_stencil
from diffnet.families.poisson import PoissonFamily
from diffnet.families.poisson3d import Poisson3DFamily
from diffnet.families.reaction_diffusion import ReactionDiffusionFamily
from diffnet.solvers.fem import dirichlet_system, poisson_system
from diffnet.solvers.q1 import coarse_q1_stencil, q1_matrix_stencil

GOLDEN = np.load(ROOT / "tests" / "data" / "q1_golden.npz", allow_pickle=False)
A = np.array([1.5, -2.0, 0.7, 2.5, -1.0, 0.3])


def _same(key: str, value, tol: float = 1e-12) -> None:
    ref = GOLDEN[key]
    value = np.asarray(value)
    assert value.shape == ref.shape, key
    if tol == 0.0:
        assert np.array_equal(value, ref), key
    else:
        assert np.abs(value - ref).max() <= tol * max(np.abs(ref).max(), 1.0), key


def test_energies_and_their_stencils_in_2d_and_3d():
    u = torch.tensor(GOLDEN["e2_in_u"], requires_grad=True)
    nu, f = torch.tensor(GOLDEN["e2_in_nu"]), torch.tensor(GOLDEN["e2_in_f"])
    e = dirichlet_energy(u, nu, 0.1, 0.125)
    _same("e2_dirichlet", e.detach())
    _same("e2_dirichlet_grad", torch.autograd.grad(e.sum(), u)[0])
    e = reaction_diffusion_energy(u, nu, 1.3, f, 0.1, 0.125)
    _same("e2_rd", e.detach())
    _same("e2_rd_grad", torch.autograd.grad(e.sum(), u)[0])
    _same("e2_rd_const", reaction_diffusion_energy(u, nu, 1.3, 2.0, 0.1, 0.125).detach())
    _same("e2_stencil", dirichlet_stencil(nu, 0.1, 0.125))
    _same("e2_rd_stencil", reaction_diffusion_stencil(nu, 1.3, 0.1, 0.125))
    u3 = torch.tensor(GOLDEN["e3_in_u"], requires_grad=True)
    nu3 = torch.tensor(GOLDEN["e3_in_nu"])
    e = dirichlet_energy(u3, nu3, 1 / 6, 1 / 5, 1 / 4)
    _same("e3_dirichlet", e.detach())
    _same("e3_dirichlet_grad", torch.autograd.grad(e.sum(), u3)[0])
    _same("e3_stencil", dirichlet_stencil(nu3, 1 / 6, 1 / 5, 1 / 4)[:1])
    with pytest.raises(ValueError, match="one spacing per axis"):
        dirichlet_energy(u3, nu3, 0.1, 0.1)


def test_compiled_assembly_is_bitwise_the_2d_stacks():
    nu = GOLDEN["m2_nu"]
    _same("m2_stencil", q1_matrix_stencil(nu, (1 / 20, 1 / 16), 0.7), 0.0)
    fixed = np.zeros((9, 11), dtype=bool)
    fixed[:, [0, -1]] = True
    _same("m2_coarse", coarse_q1_stencil(nu, (1 / 20, 1 / 16), 0.7, fixed), 0.0)
    system = dirichlet_system(GOLDEN["ds_nu"], GOLDEN["ds_fixed"], GOLDEN["ds_vals"], kappa=0.5, f=GOLDEN["ds_f"])
    _same("ds_stencil", system.stencil, 0.0)
    _same("ds_rhs", system.rhs)
    _same("ds_direct", system.solve("direct"))
    _same("ds_fmg1", system.multigrid().fmg(1))


@pytest.mark.parametrize("shape", [(33, 33), (30, 41)])  # nested grids, and ceil(N / 2) coarsening
def test_2d_solves_and_cycles(shape):
    key = f"s2_{shape[0]}x{shape[1]}"
    system = PoissonFamily(shape).fem_system(A)
    mg = system.multigrid()
    _same(f"{key}_direct", system.solve("direct"))
    _same(f"{key}_amg", system.solve("amg"))
    _same(f"{key}_fmg1", mg.fmg(1))
    _same(f"{key}_fmgd", mg.fmg(1, to_discretisation=True))
    _same(f"{key}_v2", mg.vcycles(np.random.default_rng(1).standard_normal(shape), 2))
    r = np.random.default_rng(2).standard_normal(shape)
    r.ravel()[system.fixed] = 0
    _same(f"{key}_prec", mg.precondition(r))
    _same(f"{key}_pcg", mg.solve(1e-10))
    rd = ReactionDiffusionFamily((33, 33), kappa=1.5, source=2.0).fem_system(A)
    _same("rd_direct", rd.solve("direct"))
    _same("rd_fmg1", rd.multigrid().fmg(1))
    _same("rd_rhs", rd.rhs)


def test_3d_system_and_multigrid_on_the_one_stack():
    """The 3-D system now keeps every node (identity rows at the Dirichlet planes) where it eliminated
    them; solutions and cycles are the same."""
    shape = (17, 13, 19)  # unequal sides, two levels
    key = "s3_" + "x".join(map(str, shape))
    system = poisson_system(Poisson3DFamily(shape).diffusivity_numpy(A[None])[0])
    mg = system.multigrid()
    assert len(mg.levels) == 2
    _same(f"{key}_direct", system.solve("direct"))
    _same(f"{key}_gmg", system.solve("gmg"))
    _same(f"{key}_fmg1", mg.fmg(1))
    _same(f"{key}_v2", mg.vcycles(np.random.default_rng(4).standard_normal(shape), 2))


def test_families_references_truths_losses_and_polish():
    x = np.random.default_rng(3).standard_normal((3, 17, 17))
    for family, prefix in ((PoissonFamily((17, 17)), "f2"), (ReactionDiffusionFamily((17, 17)), "rd")):
        a = family.sample(3, "random", 5)
        _same("f2_a", a, 0.0)
        _same(f"{prefix}_reference", family.reference(a))
        _same(f"{prefix}_loss", family.loss_terms(torch.as_tensor(x), torch.as_tensor(a))["energy"])
        _same(f"{prefix}_hessian", family.hessian(torch.as_tensor(x), torch.as_tensor(a))[:1])
    p = PoissonFamily((17, 17))
    a = GOLDEN["f2_a"]
    _same("f2_inputs", p.inputs(torch.as_tensor(a))[:1])
    _same("f2_truth", p.truth(a))
    _same("f2_polish", p.polish(a, x, 2))
    _same("f2_fmg1_9", q1_solver(p, "fmg1", 9)(a[0]))
    _same("f2_sacg_9", q1_solver(p, "sa-cg", 9)(a[0]), 1e-7)
    p3 = Poisson3DFamily((9, 9, 9))
    a3 = p3.sample(2, "random", 6)
    _same("f3_a", a3, 0.0)
    x3 = np.random.default_rng(8).standard_normal((2, 9, 9, 9))
    _same("f3_inputs", p3.inputs(torch.as_tensor(a3))[:1])
    _same("f3_reference", p3.reference(a3))
    _same("f3_truth", p3.truth(a3))
    _same("f3_polish", p3.polish(a3, x3, 2))
    _same("f3_loss", p3.loss_terms(torch.as_tensor(x3), torch.as_tensor(a3))["energy"])
    _same("f3_fmg1_5", q1_solver(p3, "fmg1", 5)(a3[0]))
    _same("f3_sacg_5", q1_solver(p3, "sa-cg", 5)(a3[0]), 1e-7)
