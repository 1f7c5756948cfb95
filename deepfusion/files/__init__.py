"""What a run reads and writes: HDF5 checkpoints (atomic, verified), HDF5/XDMF field files, the run
directory (its config, the checkpoint to continue from, what a continued run may change) and the
plots.

May import: :mod:`deepfusion.configuration`, diffnet, and the schedule's pure functions
(:mod:`deepfusion.training.schedule`: a continued run's schedule is compared with the saved one);
never the training loop itself or the analysis.
"""
