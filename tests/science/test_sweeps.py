"""The Gauss-Seidel sweeps after the coarse correction (diffnet/multigrid/smoother.py): symmetric multicolour block
sweeps on the free nodes keep the grid's own solution (their fixed point), lower the energy every sweep, leave the
fixed nodes alone, and their backward pass is the exact transpose (finite differences), with as many instances as unknowns;
repeated with the correction (``cycles``) they are a convergent two-grid iteration."""

from __future__ import annotations

import torch

import pytest

from diffnet.multigrid.coarse import CoarseSpace, coarse_correction
from diffnet.product.corrected import CoarseCorrected
from diffnet.multigrid.hessian import energy_norms
from diffnet.multigrid.stencil import as_blocks, as_fields
from diffnet.multigrid.sweeps import sweeps
from diffnet.families.elasticity import ElasticityFamily
from diffnet.families.poisson import PoissonFamily


def _setup(family, s=2, seed=0, noise=1e-2):
    p = torch.as_tensor(family.sample(s, "random", seed))
    exact = torch.as_tensor(family.reference(p.numpy()))
    g = torch.Generator().manual_seed(seed)
    shape = (s, len(family.unknowns), *family.resolution)
    lift = family.field(torch.zeros(shape, dtype=torch.float64), p)  # the held values' lift
    u = family.field((exact - lift).reshape(shape) + noise * torch.randn(shape, dtype=torch.float64, generator=g), p)
    return p, exact, u


def test_sweeps_keep_the_grids_solution_and_lower_the_energy():
    family = ElasticityFamily(resolution=(17, 17))  # two unknowns and two instances: S = C
    p, exact, u = _setup(family)
    space = CoarseSpace.build(family, u, p, 5)
    x = as_blocks(u, True)
    energy = lambda v: sum(family.loss_terms(as_fields(v, True), p).values())  # noqa: E731
    before = energy(x)
    for _ in range(3):
        after = energy(x := sweeps(space.hessian, space.free, space.load, x, 1))
        assert (after < before).all()
        before = after
    assert torch.equal(x[~space.free], as_blocks(u, True)[~space.free])  # held nodes untouched
    kept = sweeps(space.hessian, space.free, space.load, as_blocks(exact, True), 3)
    assert float((kept - exact).abs().max() / exact.abs().max()) < 1e-12


def test_smoothing_backward_is_the_transpose_of_the_forward():
    family = ElasticityFamily(resolution=(17, 17))
    p, exact, u = _setup(family)
    v = u.clone().requires_grad_(True)
    w = torch.randn_like(u, generator=torch.Generator().manual_seed(5))
    (coarse_correction(family, v, p, 5, sweeps=2) * w).sum().backward()
    d = torch.randn_like(u, generator=torch.Generator().manual_seed(6))
    eps = 1e-6
    numeric = ((coarse_correction(family, u + eps * d, p, 5, sweeps=2)
                - coarse_correction(family, u - eps * d, p, 5, sweeps=2)) * w).sum() / (2 * eps)
    assert abs(float((v.grad * d).sum()) - float(numeric)) < 1e-6 * abs(float(numeric))


def test_smoothing_removes_the_high_frequency_error_the_correction_leaves():
    """A field with white noise: the correction leaves it high-frequency, in the energy norm (the gradient's), and
    one sweep takes out most of it, two more (measured: 0.70 -> 0.070 -> 0.036 on the scalar family)."""
    for family in (PoissonFamily(resolution=(33, 33)), ElasticityFamily(resolution=(33, 33))):
        p, exact, u = _setup(family, s=2, noise=1e-2)
        error = [energy_norms(family, p, exact, coarse_correction(family, u, p, 9, sweeps=k) - exact)[0]
                 for k in (0, 1, 2)]
        assert (error[1] < 0.2 * error[0]).all() and (error[2] < 0.6 * error[1]).all(), family.name


def test_the_gpus_batched_sweeps_and_the_cpus_compiled_ones_agree():
    """Two implementations of one sweep (batched tensor updates per colour on a GPU, a compiled node loop on the CPU)
    visit the same colours in the same order: the same field to rounding, in 2-D and 3-D, one unknown and several."""
    from diffnet.multigrid.sweeps import _by_colour, _inverse_diagonal, prepared
    from diffnet.families.elasticity import Elasticity3DFamily

    for family in (ElasticityFamily(resolution=(9, 9)), PoissonFamily(resolution=(9, 9)), Elasticity3DFamily(resolution=(5, 5, 5))):
        p, exact, u = _setup(family, s=3, noise=1e-2)
        space = CoarseSpace.build(family, u, p, 3)
        x = as_blocks(u, len(family.unknowns) > 1)
        batched = {"rows": _by_colour(space.hessian, _inverse_diagonal(space.hessian, space.free), space.free)}
        compiled = prepared(space.hessian, space.free)
        one, two = (sweeps(space.hessian, space.free, space.load, x, 2, op) for op in (batched, compiled))
        assert float((one - two).abs().max()) <= 1e-12 * float(x.abs().max()), family.name


def test_cycles_repeat_the_correction_and_its_sweeps_and_converge_to_the_grids_solution():
    """CoarseCorrected(cycles=k): the correction then the sweeps, k times, a two-grid iteration from the network's
    field: each cycle cuts the energy norm's error to the grid's solution (measured on white noise, 33^2 from 9^2 with 2
    sweeps: 0.28-0.52x a cycle for Poisson, 0.31-0.54x for elasticity; asserted 0.6x), and three cycles of 2 sweeps
    beat one correction with the same 6 sweeps (measured 4.4x and 2.6x; asserted 2x), where sweeps alone stall; with
    S = C = 2 for the two-unknown family."""
    for family in (PoissonFamily(resolution=(33, 33)), ElasticityFamily(resolution=(33, 33))):
        p, exact, u = _setup(family, s=2, noise=1e-2)
        lift = family.field(torch.zeros(u.shape[0], len(family.unknowns), *family.resolution, dtype=torch.float64), p)
        raw = (u - lift).reshape(u.shape[0], len(family.unknowns), *family.resolution)
        product = lambda k, sweeps=2: CoarseCorrected(family, family, 9, sweeps=sweeps, cycles=k).field(raw, p)  # noqa: E731
        composed = u
        for _ in range(2):
            composed = coarse_correction(family, composed, p, 9, quadratic=True, sweeps=2)
        assert float((product(2) - composed).abs().max()) <= 1e-12 * float(exact.abs().max()), family.name
        errors = [energy_norms(family, p, exact, product(k) - exact)[0] for k in (1, 2, 3)]
        assert (errors[1] < 0.6 * errors[0]).all() and (errors[2] < 0.6 * errors[1]).all(), (family.name, errors)
        one_long = energy_norms(family, p, exact, product(1, sweeps=6) - exact)[0]  # the same 6 sweeps, one correction
        assert (errors[2] < 0.5 * one_long).all(), (family.name, errors[2], one_long)


def test_cycles_without_sweeps_between_are_refused():
    family = PoissonFamily(resolution=(9, 9))
    with pytest.raises(ValueError, match="cycles must be 1, or more with sweeps"):
        CoarseCorrected(family, family, 3, sweeps=0, cycles=2)
