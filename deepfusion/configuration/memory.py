"""What one sample costs in memory, from the configuration alone: an inference pass's activations (the
Python API's chunks) and a training step's (``deepfusion jobs --memory-per-node``)."""

from __future__ import annotations

import numpy as np

from deepfusion.configuration.schema import Config

__all__ = ["inference_bytes_per_sample", "training_bytes_per_sample"]


def inference_bytes_per_sample(cfg: Config) -> int:
    """Activation bytes one sample keeps alive in a float32 inference pass of ``[model]``'s network."""
    from diffnet.generators.networks import NETWORKS

    return 4 * NETWORKS[cfg.model.name].live_widths * cfg.model.channels[0] * int(np.prod(cfg.problem.resolution))


# Bytes a training step keeps per grid node and per channel of the generator's finest width (float32),
# measured with benchmarks/memory.py and benchmarks/domain_parallel.py: the U-Net at 512^2
# [16, 32, 64] 121 B, at 129^3 [8, 16, 32] 105 B, recomputed 60 B; a deepened stack's top block (one
# block of top_channels beside the coarse levels, which hold 2^-d of the grid) about a third of that.
_TRAIN_BYTES = {"plain": 128, "checkpointed": 64}


def training_bytes_per_sample(cfg: Config) -> int:
    """An estimate of the memory one sample takes in a training step on the finest grid (float32 x2 for float64)."""
    per = _TRAIN_BYTES["checkpointed" if cfg.model.checkpoint_activations else "plain"]
    nodes = int(np.prod(cfg.problem.resolution))
    deepened = len(cfg.multigrid.levels) > 1 and cfg.multigrid.transfer == "deepen"
    width = cfg.multigrid.top_channels / 3 + cfg.model.channels[0] / 2 ** len(cfg.problem.resolution) if deepened \
        else cfg.model.channels[0]
    return int(per * width * nodes * (2 if cfg.train.dtype == "float64" else 1))
