"""The training loop: one TrainingContext per run, the step (forward, loss, backward, sums), the
schedule of multigrid stages, Adam/SGD epochs, the distributed L-BFGS phase, the recorder of
metrics and checkpoints, and the graceful stop.

May import: :mod:`deepfusion.parallel`, :mod:`deepfusion.files`, :mod:`deepfusion.configuration`
and diffnet's family protocol; never the analysis or the commands.
"""
