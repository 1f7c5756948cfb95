"""How tests/data/q1_golden.npz was made: the Q1 stack's outputs at commit 224584a, before the 2-D and
3-D stacks became one (issue 45). It runs against that commit's modules, not today's:

    git worktree add /tmp/q1-before 224584a
    cd /tmp/q1-before && PYTHONPATH=. python /path/to/tests/data/q1_golden.py q1_golden.npz

tests/science/test_q1_stack.py makes the same calls through today's API and compares.
"""
import sys
import numpy as np
import torch

from diffnet.discretisation.energy import dirichlet_energy, dirichlet_stencil, reaction_diffusion_energy, reaction_diffusion_stencil
from diffnet.energy3d import dirichlet_energy_3d, dirichlet_stencil_3d
from diffnet.families.poisson import PoissonFamily
from diffnet.families.reaction_diffusion import ReactionDiffusionFamily
from diffnet.families.poisson3d import Poisson3DFamily
from diffnet.solvers.poisson import dirichlet_system, poisson_system
from diffnet.solvers.q1 import q1_matrix_stencil, coarse_q1_stencil
from diffnet.solvers.poisson3d import poisson3d_system
from diffnet.solvers.classical import q1_solver

out = {}
rng = np.random.default_rng(7)
A = np.array([1.5, -2.0, 0.7, 2.5, -1.0, 0.3])

# energies 2-D
u = torch.tensor(rng.standard_normal((2, 9, 11)), requires_grad=True)
nu = torch.tensor(np.exp(rng.standard_normal((2, 9, 11))))
f = torch.tensor(rng.standard_normal((2, 9, 11)))
e = dirichlet_energy(u, nu, 0.1, 0.125)
g, = torch.autograd.grad(e.sum(), u)
out["e2_in_u"], out["e2_in_nu"], out["e2_in_f"] = u.detach().numpy(), nu.numpy(), f.numpy()
out["e2_dirichlet"], out["e2_dirichlet_grad"] = e.detach().numpy(), g.numpy()
e = reaction_diffusion_energy(u, nu, 1.3, f, 0.1, 0.125)
g, = torch.autograd.grad(e.sum(), u)
out["e2_rd"], out["e2_rd_grad"] = e.detach().numpy(), g.numpy()
out["e2_rd_const"] = reaction_diffusion_energy(u, nu, 1.3, 2.0, 0.1, 0.125).detach().numpy()
out["e2_stencil"] = dirichlet_stencil(nu, 0.1, 0.125).numpy()
out["e2_rd_stencil"] = reaction_diffusion_stencil(nu, 1.3, 0.1, 0.125).numpy()
# energies 3-D
u3 = torch.tensor(rng.standard_normal((2, 5, 6, 7)), requires_grad=True)
nu3 = torch.tensor(np.exp(rng.standard_normal((2, 5, 6, 7))))
e = dirichlet_energy_3d(u3, nu3, 1 / 6, 1 / 5, 1 / 4)
g, = torch.autograd.grad(e.sum(), u3)
out["e3_in_u"], out["e3_in_nu"] = u3.detach().numpy(), nu3.numpy()
out["e3_dirichlet"], out["e3_dirichlet_grad"] = e.detach().numpy(), g.numpy()
out["e3_stencil"] = dirichlet_stencil_3d(nu3, 1 / 6, 1 / 5, 1 / 4).numpy()[:1]

# assembled matrices 2-D
nu2 = np.exp(rng.standard_normal((17, 21)))
out["m2_nu"] = nu2
out["m2_stencil"] = q1_matrix_stencil(nu2, 1 / 20, 1 / 16, 0.7)
fixed_c = np.zeros((9, 11), dtype=bool); fixed_c[:, 0] = fixed_c[:, -1] = True
out["m2_coarse"] = coarse_q1_stencil(nu2, 1 / 20, 1 / 16, 0.7, fixed_c)

# systems and multigrid 2-D
for n in (33, (30, 41)):
    shape = (n, n) if isinstance(n, int) else n
    key = f"{shape[0]}x{shape[1]}"
    p = PoissonFamily(shape)
    s = p.fem_system(A)
    mg = s.multigrid()
    out[f"s2_{key}_direct"] = s.solve("direct")
    out[f"s2_{key}_amg"] = s.solve("amg")
    out[f"s2_{key}_fmg1"] = mg.fmg(1)
    out[f"s2_{key}_fmgd"] = mg.fmg(1, to_discretisation=True)
    x0 = np.random.default_rng(1).standard_normal(shape)
    out[f"s2_{key}_v2"] = mg.vcycles(x0, 2)
    r = np.random.default_rng(2).standard_normal(shape); r.ravel()[s.fixed] = 0
    out[f"s2_{key}_prec"] = mg.precondition(r)
    out[f"s2_{key}_pcg"] = mg.solve(1e-10)
rd = ReactionDiffusionFamily((33, 33), kappa=1.5, source=2.0)
s = rd.fem_system(A)
out["rd_direct"] = s.solve("direct")
out["rd_fmg1"] = s.multigrid().fmg(1)
out["rd_rhs"] = s.rhs
nuv = np.exp(rng.standard_normal((17, 17)))
fixed = rng.random((17, 17)) < 0.1
vals = rng.standard_normal((17, 17))
fv = rng.standard_normal((17, 17))
out["ds_nu"], out["ds_fixed"], out["ds_vals"], out["ds_f"] = nuv, fixed, vals, fv
s = dirichlet_system(nuv, fixed, vals, kappa=0.5, f=fv)
out["ds_stencil"], out["ds_rhs"], out["ds_direct"] = s.stencil, s.rhs, s.solve("direct")
out["ds_fmg1"] = s.multigrid().fmg(1)

# families 2-D
p = PoissonFamily((17, 17))
a = p.sample(3, "random", 5)
out["f2_a"] = a
out["f2_inputs"] = p.inputs(torch.as_tensor(a)).numpy()[:1]
out["f2_reference"] = p.reference(a)
out["f2_truth"] = p.truth(a)
x = np.random.default_rng(3).standard_normal((3, 17, 17))
out["f2_polish"] = p.polish(a, x, 2)
out["f2_hessian"] = p.hessian(torch.as_tensor(x), torch.as_tensor(a)).numpy()[:1]
out["f2_loss"] = p.loss_terms(torch.as_tensor(x), torch.as_tensor(a))["energy"].numpy()
out["f2_fmg1_9"] = q1_solver(p, "fmg1", 9)(a[0])
out["f2_sacg_9"] = q1_solver(p, "sa-cg", 9)(a[0])
rd = ReactionDiffusionFamily((17, 17))
out["rd_reference"] = rd.reference(a)
out["rd_loss"] = rd.loss_terms(torch.as_tensor(x), torch.as_tensor(a))["energy"].numpy()
out["rd_hessian"] = rd.hessian(torch.as_tensor(x), torch.as_tensor(a)).numpy()[:1]

# 3-D systems and families
for shape in ((17, 13, 19),):
    key = "x".join(map(str, shape))
    nu3n = Poisson3DFamily(shape).diffusivity_numpy(A[None])[0]
    s = poisson3d_system(nu3n)
    mg = s.multigrid()
    out[f"s3_{key}_direct"] = s.solve("direct")
    out[f"s3_{key}_gmg"] = s.solve("gmg")
    out[f"s3_{key}_fmg1"] = mg.fmg(1)
    x0 = np.random.default_rng(4).standard_normal(shape)
    out[f"s3_{key}_v2"] = mg.vcycles(x0, 2)
p3 = Poisson3DFamily((9, 9, 9))
a3 = p3.sample(2, "random", 6)
out["f3_a"] = a3
out["f3_inputs"] = p3.inputs(torch.as_tensor(a3)).numpy()[:1]
out["f3_reference"] = p3.reference(a3)
out["f3_truth"] = p3.truth(a3)
x3 = np.random.default_rng(8).standard_normal((2, 9, 9, 9))
out["f3_polish"] = p3.polish(a3, x3, 2)
out["f3_loss"] = p3.loss_terms(torch.as_tensor(x3), torch.as_tensor(a3))["energy"].numpy()
out["f3_fmg1_5"] = q1_solver(p3, "fmg1", 5)(a3[0])
out["f3_sacg_5"] = q1_solver(p3, "sa-cg", 5)(a3[0])
np.savez_compressed(sys.argv[1], **out)
print(len(out), "arrays")
