"""The parallel layer: the communicator and its watchdog, which samples each rank takes, the domain split
(its tiles, the halo exchange), the gradient sums (flat, bucketed, hierarchical, GPU) and the
runtime (threads, devices).

May import: numpy, torch, mpi4py, :mod:`diffnet.generators.tiling` and :mod:`diffnet.backend`; nothing of the
engine (a split's configuration is checked in :mod:`deepfusion.configuration.split`). Nothing here knows a PDE
family or a training loop.
"""
