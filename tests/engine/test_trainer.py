"""The training loop in-process: both boundary treatments train, metrics carry every term."""

import json

import numpy as np
import pytest
import torch

from deepfusion.configuration.schema import TrainConfig
from deepfusion.parallel.comm import SerialCommunicator
from deepfusion.training.context import TrainingContext
from deepfusion.training.recorder import TrainingDiverged
from deepfusion.configuration.run import Run
from deepfusion.training.trainer import learning_rate, train
from diffnet.generators.networks import UNet
from diffnet.families.burgers import BurgersFamily


def _run(tmp_path, boundary, lr=5e-3, epochs=12, stencil="sobel", viscosity=0.01):
    torch.manual_seed(0)
    problem = BurgersFamily((12, 12), viscosity=viscosity, boundary=boundary, penalty=10.0, stencil=stencil)
    model = UNet(problem.in_channels, 1, (8, 16))
    cfg = TrainConfig(lr=lr, batch_size=4, epochs=epochs, log_every=3)
    params = np.linspace(3, 6, 8)
    result = train(Run.of(problem, params, cfg), model, TrainingContext(SerialCommunicator(), run_dir=tmp_path, log=lambda s: None))
    return result, [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "boundary, terms, stencil, viscosity",
    [
        ("exact", {"residual"}, "sobel", 0.01),
        ("penalty", {"residual", "boundary"}, "sobel", 0.01),
        ("exact", {"residual"}, "conservative", 0.0),
    ],
)
def test_training_lowers_loss(tmp_path, boundary, terms, stencil, viscosity):
    result, records = _run(tmp_path, boundary, stencil=stencil, viscosity=viscosity)
    assert result.steps == 24 and result.checkpoint.is_file()
    assert terms <= set(records[0])
    for r in records:
        assert r["loss"] == pytest.approx(sum(r[t] for t in terms), rel=1e-6)
    assert np.mean([r["loss"] for r in records[-2:]]) < 0.7 * records[0]["loss"]


def test_nan_loss_stops_training(tmp_path):
    with pytest.raises(TrainingDiverged, match="loss is (nan|inf)"):
        _run(tmp_path, "exact", lr=1e12, epochs=50)


def test_learning_rate_schedules():
    cfg = TrainConfig(lr=1.0, lr_schedule="onecycle", warmup=0.1)
    lrs = [learning_rate(s, 100, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(1 / 25) and max(lrs) == pytest.approx(1.0)
    assert lrs[-1] == pytest.approx(1e-4) and all(b <= a for a, b in zip(lrs[10:], lrs[11:]))
    assert learning_rate(37, 100, TrainConfig(lr=0.3, lr_schedule="constant")) == 0.3
    cos = TrainConfig(lr=1.0, lr_schedule="cosine")
    assert learning_rate(0, 100, cos) == pytest.approx(1.0) and learning_rate(99, 100, cos) == pytest.approx(1e-3)
