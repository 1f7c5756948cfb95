"""What an engineer reads, for every family: each built-in family whose loss is an energy derives the fields its user
reads (stress, flux, shear stress), each checked against a closed form or its linear limit, and the energy-norm error
is the loss's own (1 at the floor, above it off it, with as many instances as unknowns)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from deepfusion.analysis.derived import energy_errors
from deepfusion.configuration.registry import builtin_families, family_class
from diffnet.grid.material import stress_components
from diffnet.grid.recovery import at_gauss, gauss_gradients, to_nodes


def _capabilities(name: str) -> frozenset:
    cls = family_class(name)
    return cls.capabilities if isinstance(cls.capabilities, frozenset) else cls(resolution=(16, 16)).capabilities


def _energy_families() -> list[str]:
    from diffnet.protocol.loss import Energy

    def loss(name):
        cls = family_class(name)
        return cls.from_options(cls.Options(), (9,) * cls.dims).loss()

    return sorted(n for n in builtin_families() if isinstance(loss(n), Energy))


def test_every_energy_family_derives_what_its_user_reads():
    names = _energy_families()
    assert len(names) >= 10, names  # the loss's kind read, not a flag: the Q1, elastic and Neo-Hookean families
    missing = [n for n in names if "derived" not in _capabilities(n)]
    assert not missing, f"no derived fields (stress, flux): {missing}"


def test_neo_hookean_cauchy_stress_is_linear_elasticity_at_a_small_load():
    family = family_class("hyperelasticity")(resolution=(9, 9))
    p = family.sample(2, "random", 1)
    y, x = np.meshgrid(*(np.linspace(0.0, 1.0, 9),) * 2, indexing="ij")
    u = 1e-6 * np.stack([np.stack([np.sin(3 * x + y), x * y ** 2])] * 2)  # a small displacement: σ is linear in it
    stress = family.derived(p, u)["stress"]
    grad = gauss_gradients(u, family.spacing)
    mu = at_gauss(family.shear_modulus(torch.as_tensor(p)).numpy(), 2)
    linear = to_nodes(np.stack(stress_components([[grad[:, i, j] for j in range(2)] for i in range(2)],
                                                 2 * mu * (1 + family.nu), family.nu, "strain"), axis=1), 2)
    assert np.abs(stress - linear).max() < 1e-3 * np.abs(linear).max()


def test_torsion_of_a_disc_has_the_shear_stress_r_over_two():
    family = family_class("torsion")(resolution=(33, 33))
    p = np.zeros((1, 2 * family.modes))  # the disc of radius r0
    out = family.derived(p, family.reference(p))
    y, x = np.meshgrid(*(np.linspace(0.0, 1.0, 33),) * 2, indexing="ij")
    inside = family.domain(p)[0] < -0.05
    np.testing.assert_allclose(out["tau"][0][inside], 0.5 * np.hypot(x - 0.5, y - 0.5)[inside], atol=2e-3 * 0.15)
    # u = (R² - r²)/4: τ_xz = ∂u/∂y = -(y - ½)/2, τ_yz = -∂u/∂x = (x - ½)/2
    np.testing.assert_allclose(out["tau_xz"][0][inside], -0.5 * (y - 0.5)[inside], atol=2e-3 * 0.15)
    np.testing.assert_allclose(out["tau_yz"][0][inside], 0.5 * (x - 0.5)[inside], atol=2e-3 * 0.15)


@pytest.mark.parametrize("name", ["elasticity", "poisson"])
def test_the_energy_norm_is_one_at_the_floor_and_more_off_it(name):
    family = family_class(name)(resolution=(9, 9))
    p = family.sample(2, "random", 4)  # elasticity: two instances, two unknowns (S = C)
    truth, floor = family.truth(p), family.reference(p)
    at_floor = energy_errors(family, p, floor, truth, floor)
    assert at_floor["ratio_to_floor"] == pytest.approx(1.0)
    y, x = np.meshgrid(*(np.linspace(0.0, 1.0, 9),) * 2, indexing="ij")
    rough = np.sin(np.pi * x) * (-1.0) ** np.add.outer(np.arange(9), np.arange(9))  # zero on x = 0, 1: held there
    off = floor.copy()
    off[1] += 1e-2 * np.abs(floor[1]).max() * rough
    errors = energy_errors(family, p, off, truth, floor)
    assert errors["rel_l2"][0] == pytest.approx(at_floor["rel_l2"][0]) and errors["rel_l2"][1] > at_floor["rel_l2"][1]
