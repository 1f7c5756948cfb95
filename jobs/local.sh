#!/usr/bin/env bash
# DeepFusion training on this machine: @ranks_per_node@ MPI ranks x @threads@ threads.
# Rendered by `deepfusion jobs local ...`; run with `bash THIS_FILE`. Stop it with Ctrl-C
# or SIGTERM: the ranks write a checkpoint, and running this file again resumes.
set -euo pipefail

export OMP_NUM_THREADS=@threads@
export OMP_PLACES=cores OMP_PROC_BIND=close

MPIEXEC=@mpiexec@
PYTHON=@python@
CONFIG=@config@
RUN_DIR=@run_dir@
resume=()
if compgen -G "$RUN_DIR/checkpoints/step-*.h5" > /dev/null; then resume=(--resume); fi

# The launcher forwards SIGTERM and SIGINT to the ranks.
exec "$MPIEXEC" -n @ranks_per_node@ "$PYTHON" -m deepfusion train "$CONFIG" --out "$RUN_DIR" "${resume[@]}" @train_args@
