"""The file formats a run reads and writes: HDF5 checkpoints (atomic, verified), HDF5/XDMF field files and
the plots. (The run directory's rules, what a continued run may change, are :mod:`deepfusion.training.rundir`'s.)

May import: diffnet's family protocol; nothing of the engine.
"""
