"""The methods end to end: each family of the product (the built-in ones, the tutorial's and the docs' plugin
families) and each method of the generator (the exact coarse correction, the second stage, the preconditioned loss,
the polish, the floor it is measured against) from its mathematics to its runs through the engine: trained, inferred,
compared and drawn for uq as a user runs them (deepfusion imported; mpiexec where the number of ranks matters).
The mathematics alone, without the engine, is in tests/science."""
