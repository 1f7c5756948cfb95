"""The science: diffnet's discretisations, solvers, generators and families checked against mathematics —
manufactured and exact solutions, assembled matrices (scikit-fem, pyamg, LU), orders of convergence, the floors,
the multigrid and the coarse correction, float32 against float64 — and the family protocol with the tutorial's
family. Fast unless marked slow; no mpiexec.
"""
