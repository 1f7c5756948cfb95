"""What a run reads and writes: HDF5 checkpoints (atomic, verified), HDF5/XDMF field files, the run
directory (its config, the checkpoint to continue from, what a continued run may change) and the
plots.

May import: :mod:`deepfusion.configuration` and diffnet; never the training loop or the analysis.
"""
