"""The science: diffnet alone, checked against mathematics: its discretisations, solvers, generators, multigrid and
families against manufactured and exact solutions, assembled matrices (scikit-fem, pyamg, LU), orders of convergence,
float32 against float64. No file here imports the engine (deepfusion) or starts mpiexec
(tests/engine/test_structure.py checks it); a family's or a method's runs through the engine are in tests/methods."""
