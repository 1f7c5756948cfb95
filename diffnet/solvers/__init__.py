"""Independent classical reference solvers that DiffNet is measured against."""

__all__: list[str] = []
