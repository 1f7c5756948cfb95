"""The engine: deepfusion's subsystems on their own — configuration and the run it makes, the trainer and its
schedule, checkpoints and field files, communicators, gradient sums and domain splits under a real MPI
(mpiexec -n 2 and 4, each with a timeout), faults, devices, the code's shape (tests/engine/test_structure.py).
"""
