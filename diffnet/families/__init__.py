"""The built-in PDE families, each written against :mod:`diffnet.protocol` exactly as a user's plugin is:
Burgers, Poisson (2-D, 3-D), reaction-diffusion, elasticity (2-D, 3-D), and the cut-domain families (plate
with a hole, torsion of a star). The top floor of diffnet: may import every other subpackage.
"""

__all__: list[str] = []
