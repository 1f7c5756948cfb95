"""A residual loss's coarse correction through the engine: a Burgers run's product is the least-squares
correction with its pull, and a plugin whose residual's squares are not its loss is refused before training."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from helpers import ROOT

from deepfusion.analysis.selfcheck import FamilyMismatch, check_family
from deepfusion.configuration.config import load_config
from deepfusion.configuration.run import Run
from diffnet.families.burgers import BurgersFamily
from diffnet.product.corrected import CoarseCorrected


def test_a_burgers_run_takes_the_least_squares_correction_and_the_pull():
    cfg = load_config(ROOT / "configs" / "burgers.toml", ["problem.resolution=[17,17]", "multigrid.levels=[]",
                                                           "model.coarse_correction=5",
                                                           "data.n_train=4", "train.batch_size=2"])
    run = Run.from_config(cfg)
    product = run.product(run.build_model())
    corrected = product.finished  # the family the product's fields come from
    assert isinstance(corrected, CoarseCorrected) and corrected.kind == "residual" and not corrected.quadratic
    assert product.steps()[1] == "coarse correction on 5x5 (Gauss-Newton)" and not product.exact_parameter_gradients
    assert "a residual's least-squares correction" in product.why_no_exact_gradients()
    c = torch.tensor([3.5, 5.0], dtype=torch.float64)
    raw = (0.1 * torch.randn(2, 1, 17, 17, dtype=torch.float64)).requires_grad_(True)
    u = corrected.field(raw, c)
    bare = corrected.inner.field(raw, c)
    assert torch.equal(u[:, 0], bare[:, 0]) and torch.equal(u[:, :, 0], bare[:, :, 0])  # the IC and inflow kept
    terms = corrected.output_loss_terms(raw, c)  # the training step's terms: the residual's squares and the pull
    assert set(terms) == {"residual", "coarse"} and (terms["residual"] < corrected.inner.loss_terms(bare, c)["residual"]).all()
    sum(t.sum() for t in terms.values()).backward()
    assert torch.isfinite(raw.grad).all() and raw.grad.abs().sum() > 0
    with pytest.raises(AttributeError, match="withheld"):
        corrected.residual(u, c)


def test_a_residual_whose_squares_are_not_the_loss_is_refused_before_training():
    @dataclass(frozen=True)
    class Doubled(BurgersFamily):
        def residual(self, u, c):
            return 2.0 * super().residual(u, c)

    keys = dict(resolution=(7, 7), viscosity=0.01, stencil="conservative")
    c = np.array([4.0])
    assert "residual" in check_family(BurgersFamily(**keys), c).members
    with pytest.raises(FamilyMismatch, match=r"residual squares sum to .* where its loss is .*scale the residual"):
        check_family(Doubled(**keys), c)
