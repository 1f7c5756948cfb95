"""DiffNet: data-free convolutional generators whose loss is the discretised PDE."""

__all__: list[str] = []
