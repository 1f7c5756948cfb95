"""The error-structure diagnostics of eval.json: the low-mode share and the cosine with the coarse imprint."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.fft import idctn

from deepfusion.analysis.diagnostics import LOW_MODES, cosine, error_structure, low_mode_share


def _mode(ky: int, kx: int, shape=(33, 40)) -> np.ndarray:
    c = np.zeros(shape)
    c[ky, kx] = 1.0
    return idctn(c, type=1, norm="ortho")


def test_low_mode_share_splits_smooth_from_rough():
    smooth, rough = _mode(2, 3), _mode(20, 30)
    np.testing.assert_allclose(low_mode_share(np.stack([smooth, rough])), [1.0, 0.0], atol=1e-12)
    # Orthonormal modes: the share of a sum is the share of the squared amplitudes.
    mix = 3 * _mode(LOW_MODES, 0) + 4 * _mode(LOW_MODES + 1, 0)
    assert low_mode_share(mix[None])[0] == pytest.approx(9 / 25)
    # sin(pi x) sin(pi y), the smoothest Dirichlet mode, is almost all low cosine modes.
    y, x = np.mgrid[0:1:33j, 0:1:40j]
    assert low_mode_share((np.sin(np.pi * x) * np.sin(np.pi * y))[None])[0] > 0.97


def test_cosine_and_error_structure():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(2, 9, 9))
    np.testing.assert_allclose(cosine(a, 2 * a), 1.0)
    np.testing.assert_allclose(cosine(a, -a), -1.0)
    assert cosine(a, np.zeros_like(a)).tolist() == [0.0, 0.0]
    truth = rng.normal(size=(2, 9, 9))
    optimum = truth + 0.01 * rng.normal(size=truth.shape)
    coarse = optimum + 0.1 * rng.normal(size=truth.shape)
    pred = optimum + 0.5 * (coarse - optimum)  # half the imprint left
    out = error_structure(pred, truth, optimum, coarse)
    np.testing.assert_allclose(out["imprint_cosine"], 1.0)
    assert 0 < out["mean_low_mode_share"] < 1 and len(out["coarse_imprint_rel_l2"]) == 2
    assert "imprint_cosine" not in error_structure(pred, truth, optimum, None)
