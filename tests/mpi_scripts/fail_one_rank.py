"""Run under mpiexec: rank 1 raises in the middle of training while the others wait in
an Allreduce; the whole job must end with a non-zero status and rank 1's message."""

import numpy as np
import torch

from deepfusion.configuration.schema import TrainConfig
from deepfusion.parallel.comm import abort_on_error, world
from deepfusion.training.context import TrainingContext
from deepfusion.configuration.run import Run
from deepfusion.training.trainer import train
from diffnet.generators.networks import UNet
from diffnet.families.burgers import BurgersFamily


class FailingOnRank1(BurgersFamily):
    def loss_terms(self, u, c):
        self.calls = getattr(self, "calls", 0) + 1
        if self.rank == 1 and self.calls == 3:
            raise RuntimeError("injected failure on rank 1")
        return super().loss_terms(u, c)


def main(comm):
    torch.set_num_threads(1)
    problem = FailingOnRank1((12, 12))
    object.__setattr__(problem, "rank", comm.rank)
    model = UNet(problem.in_channels, 1, (4, 8))
    cfg = TrainConfig(batch_size=4, epochs=100, log_every=1000)
    train(Run.of(problem, np.linspace(3, 6, 8), cfg), model, TrainingContext(comm))


if __name__ == "__main__":
    comm = world()
    with abort_on_error(comm):
        main(comm)
