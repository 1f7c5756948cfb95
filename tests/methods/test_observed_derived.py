"""What an engineer reads, observed: every differentiable family's derived fields (flux, strain, stress, von Mises)
take torch tensors and are differentiable in the field and the instances, equal to the numpy evaluation's; an
observation of one at a point (deepfusion/analysis/observations.py) is the recovered nodal field read there, and
its gradient in the instances through the product is the central differences'."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from deepfusion.analysis.observations import Observations, observable_names, predict
from diffnet.grid.points import values_at
from diffnet.product.corrected import CoarseCorrected
from diffnet.families.elasticity import ElasticityFamily, Elasticity3DFamily
from diffnet.families.groundwater import GroundwaterFamily
from diffnet.families.hyperelasticity import HyperelasticityFamily
from diffnet.families.poisson import PoissonFamily
from diffnet.families.poisson3d import Poisson3DFamily

FAMILIES = [(PoissonFamily((12, 13)), 4), (GroundwaterFamily((13, 13)), 4), (Poisson3DFamily((5, 5, 5)), 3), (ElasticityFamily((11, 10)), 4),
            (Elasticity3DFamily((5, 5, 5)), 3), (HyperelasticityFamily((9, 9)), 4)]
IDS = ["poisson", "groundwater", "poisson3d", "elasticity", "elasticity3d", "hyperelasticity"]


def _raw(family, scale):
    return scale * torch.randn(2, len(family.unknowns), *family.resolution, dtype=torch.float64,
                               generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("family, nodes", FAMILIES, ids=IDS)
def test_derived_fields_of_tensors_are_the_arrays_and_their_gradient_is_exact(family, nodes):
    assert family.has("differentiable") and family.has("derived")
    p = torch.as_tensor(family.sample(2, "random", 3), dtype=torch.float64)
    scale = 1e-3 if isinstance(family, HyperelasticityFamily) else 1.0  # a Neo-Hookean solid: a displacement it admits
    solid = isinstance(family, HyperelasticityFamily)  # its minimiser's gradient is exact without sweeps (test_sensitivity)
    corrected = CoarseCorrected(family, family, nodes, quadratic=not solid, sweeps=0 if solid else 1)
    raw = _raw(family, scale)
    u = corrected.field(raw, p).detach()
    as_arrays = family.derived(p.numpy(), u.numpy())
    as_tensors = family.derived(p, u)
    assert set(as_arrays) == set(as_tensors)
    for name, value in as_arrays.items():
        assert isinstance(value, np.ndarray) and isinstance(as_tensors[name], torch.Tensor)
        np.testing.assert_allclose(as_tensors[name].numpy(), value, rtol=1e-12, atol=1e-12 * np.abs(value).max())
    weights = {k: torch.randn(v.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
               for k, v in as_tensors.items()}
    f = lambda q: sum((v * weights[k]).sum() for k, v in family.derived(q, corrected.field(raw, q)).items())  # noqa: E731
    q = p.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(f(q), q)
    d = torch.randn(p.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    h = 1e-6
    expected = float((f(p + h * d) - f(p - h * d)) / (2 * h))
    assert abs(float((grad * d).sum()) - expected) <= (1e-4 if solid else 1e-6) * abs(expected)


def test_an_observation_of_a_derived_field_reads_its_recovered_nodal_values():
    family = ElasticityFamily((9, 11))
    names = observable_names(family)
    assert names == ("u_x", "u_y", "strain_xx", "strain_yy", "strain_xy", "stress_xx", "stress_yy", "stress_xy",
                     "von_mises")
    points = np.array([[0.3, 0.4], [0.9, 0.1], [0.5, 0.5], [0.05, 0.77]])
    rows = ("stress_xy", "u_y", "von_mises", "stress_xy")
    observations = Observations(points, rows, np.zeros(4), np.ones(4))
    p = family.sample(3, "random", 2)  # S = 3 instances, as many as the stress's components: no silent broadcast
    u = np.random.default_rng(0).standard_normal((3, 2, 9, 11))
    got = predict(family, observations, torch.as_tensor(p), torch.as_tensor(u)).numpy()
    derived = family.derived(p, u)
    fields = {"stress_xy": derived["stress"][:, 2], "u_y": u[:, 1], "von_mises": derived["von_mises"]}
    for j, name in enumerate(rows):
        np.testing.assert_allclose(got[:, j], values_at(fields[name], (9, 11), points[j:j + 1])[:, 0], rtol=1e-12)
    poisson = PoissonFamily((8, 8))
    assert observable_names(poisson) == ("u", "flux_x", "flux_y")
