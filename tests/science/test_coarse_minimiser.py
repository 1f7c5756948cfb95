"""The coarse correction of a nonlinear energy (diffnet/multigrid/minimiser.py): damped Newton on the coarse space
finds the loss's minimiser over u~ + range(P) (against a dense Newton oracle), its gradient is the implicit
function theorem's (gradcheck), the grid's own minimiser is left alone, and a failure is one line."""

from __future__ import annotations

import sys

import pytest
import torch

from helpers import ROOT
from oracles import dense_newton
from diffnet.backend.clock import MINIMISED, NEWTON_STEPS, PartClock
from diffnet.multigrid.minimiser import CoarseNewtonError, coarse_minimiser, minimise_on_coarse_space


def _cubic(resolution=(17, 17), **keys):
    sys.path.insert(0, str(ROOT / "examples" / "families" / "cubic_reaction"))
    try:
        from cubic_reaction import CubicReaction
    finally:
        sys.path.pop(0)
    return CubicReaction(resolution, **keys)


def test_newton_on_the_coarse_space_finds_the_minimiser_of_a_nonlinear_energy():
    family = _cubic()
    p = torch.as_tensor(family.sample(3, "random", 3))
    raw = 3.0 * torch.randn(3, 1, 17, 17, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    u_tilde = family.field(raw, p)
    clock = PartClock()
    corrected = coarse_minimiser(family, u_tilde, p, 5, clock)
    expected = dense_newton(family, u_tilde, p, 5)
    assert float((corrected - expected).abs().max()) <= 1e-9 * float(expected.abs().max())
    # Not the one Newton step of the linearisation at u~, which the quadratic correction takes.
    from diffnet.multigrid.coarse import coarse_correction
    one_step = coarse_correction(family, u_tilde, p, 5)
    assert float((one_step - expected).abs().max()) > 1e-3 * float(expected.abs().max())
    steps = clock.counts[NEWTON_STEPS] / clock.counts[MINIMISED]
    assert 2 <= steps <= 20


def test_the_grids_own_minimiser_is_left_alone():
    family = _cubic()
    p = torch.as_tensor(family.sample(2, "random", 4))
    floor = torch.as_tensor(family.reference(p.numpy()))
    w, _, iterations = minimise_on_coarse_space(family, floor, p, 5)
    assert float((w - floor).abs().max()) <= 1e-9 * float(floor.abs().max())
    assert int(iterations.max()) <= 1


def test_the_gradient_is_the_implicit_function_theorems():
    family = _cubic((9, 9))
    p = torch.as_tensor(family.sample(2, "random", 5))
    u = family.field(torch.randn(2, 1, 9, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(4)), p)
    u = u.requires_grad_(True)
    # A loss that is not the energy (the envelope theorem would hide a wrong Jacobian): a weighted sum of squares.
    weights = torch.randn(2, 9, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    assert torch.autograd.gradcheck(lambda v: (weights * coarse_minimiser(family, v, p, 5) ** 2).sum(), (u,),
                                    eps=1e-6, atol=1e-6, rtol=1e-5, fast_mode=True)


def test_for_the_energy_the_gradient_is_the_energys_at_the_corrected_field():
    family = _cubic((13, 13))
    p = torch.as_tensor(family.sample(2, "random", 6))
    u = family.field(torch.randn(2, 1, 13, 13, dtype=torch.float64, generator=torch.Generator().manual_seed(6)), p)
    u = u.requires_grad_(True)
    corrected = coarse_minimiser(family, u, p, 5)
    (grad,) = torch.autograd.grad(family.loss_terms(corrected, p)["energy"].sum(), u)
    v = corrected.detach().requires_grad_(True)
    (direct,) = torch.autograd.grad(family.loss_terms(v, p)["energy"].sum(), v)
    assert torch.allclose(grad, direct, atol=1e-9 * float(direct.abs().max()), rtol=0)


def test_a_field_whose_loss_is_not_finite_is_one_line():
    family = _cubic((9, 9))
    p = torch.as_tensor(family.sample(2, "random", 7))
    u = torch.zeros(2, 9, 9, dtype=torch.float64)
    u[1, 4, 4] = float("nan")
    with pytest.raises(CoarseNewtonError, match=r"not finite at the network's field for instance\(s\) \[1\]"):
        coarse_minimiser(family, u, p, 5)


def test_an_instance_that_does_not_converge_is_named_with_its_iterations(monkeypatch):
    import diffnet.multigrid.minimiser as minimiser

    monkeypatch.setattr(minimiser, "MAX_ITERATIONS", 1)  # one Newton step cannot reach 1e-10 from this far
    family = _cubic((17, 17))
    p = torch.as_tensor(family.sample(2, "random", 8))
    u = 5.0 * torch.ones(2, 17, 17, dtype=torch.float64)
    with pytest.raises(CoarseNewtonError, match=r"instance\(s\) \[0, 1\] in 1 iterations \(last steps"):
        coarse_minimiser(family, family.field(u[:, None], p), p, 5)


def test_smoothing_after_the_minimiser_lowers_the_nonlinear_energy_towards_the_floor():
    """model.sweeps on a nonlinear energy: Gauss-Seidel sweeps with the linearisation at the coarse minimiser move
    the field towards the grid's own minimiser, each sweep lowering the energy (the cubic plugin)."""
    family = _cubic()
    p = torch.as_tensor(family.sample(2, "random", 6))
    floor = torch.as_tensor(family.reference(p.numpy()))
    rough = floor + 1e-2 * torch.randn(floor.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    u = family.field((rough - family.field(torch.zeros_like(floor)[:, None], p))[:, None], p)
    fields = [coarse_minimiser(family, u, p, 5, sweeps=k) for k in (0, 1, 2)]
    energy = [sum(family.loss_terms(f, p).values()) for f in fields]
    distance = [float((f - floor).norm()) for f in fields]
    assert (energy[1] < energy[0]).all() and (energy[2] < energy[1]).all()
    assert distance[2] < distance[1] < distance[0]


def test_cycles_of_the_minimiser_and_its_sweeps_go_on_towards_the_floor():
    """model.cycles on a nonlinear energy: the coarse minimiser and its sweeps again from their own field, each cycle
    lowering the energy and moving the field towards the grid's own minimiser (the cubic plugin, through the
    product's wrapper)."""
    from diffnet.product.corrected import CoarseCorrected

    family = _cubic((9, 9))
    p = torch.as_tensor(family.sample(2, "random", 6))
    floor = torch.as_tensor(family.reference(p.numpy()))
    lift = family.field(torch.zeros_like(floor)[:, None], p)
    raw = (floor - lift + 1e-2 * torch.randn(floor.shape, dtype=torch.float64,
                                             generator=torch.Generator().manual_seed(7)))[:, None]
    fields = [CoarseCorrected(family, family, 5, quadratic=False, sweeps=2, cycles=k).field(raw, p) for k in (1, 2, 3)]
    energy = [sum(family.loss_terms(f, p).values()) for f in fields]
    distance = [float((f - floor).norm()) for f in fields]
    assert (energy[1] < energy[0]).all() and (energy[2] < energy[1]).all()
    assert distance[2] < distance[1] < distance[0]
