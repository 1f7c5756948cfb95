"""The training loop: one TrainingContext per run, the step (forward, loss, backward, sums), the
schedule of multigrid stages, Adam/SGD epochs, the distributed L-BFGS phase, the recorder of
metrics and checkpoints, the graceful stop, and the run directory (:mod:`.rundir`: the checkpoint to continue
from, what a continued run may change, the trained model).

May import: :mod:`deepfusion.parallel`, :mod:`deepfusion.files`, :mod:`deepfusion.configuration`
and diffnet's family protocol; never the analysis or the commands.
"""
