"""DeepFusion: data-parallel training of DiffNet generators on CPU clusters (MPI + threads)."""

__all__ = ["__version__"]

__version__ = "0.1.0"
