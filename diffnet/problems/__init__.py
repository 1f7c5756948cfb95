"""Parametric PDE families: domain, parameter sampling, boundary conditions, loss."""

__all__: list[str] = []
