"""The parallel layer: the communicator and its watchdog, which samples each rank takes, the domain split
(its rules, the halo exchange), the gradient sums (flat, bucketed, hierarchical, GPU) and the
runtime (threads, devices).

May import: numpy, torch, mpi4py, :mod:`diffnet.generators.tiling`, and :mod:`deepfusion.configuration` for
the configuration's types. Nothing here knows a PDE family or a training loop.
"""
