"""The classical side, in numpy and scipy: the reference and floor solves DiffNet is measured against and
the classical baselines of ``compare`` — assembled Q1 systems (:mod:`.fem`, :mod:`.q1`, :mod:`.elasticity`),
geometric multigrid on stencils (:mod:`.gmg`, :mod:`.matrix_stencil`), Burgers' schemes and Godunov
(:mod:`.burgers`, :mod:`.conservative`, :mod:`.sobel`, :mod:`.newton`), body-fitted FEM (:mod:`.bodyfitted`),
and the ``classical`` capability of the Q1 families (:mod:`.classical`). May import :mod:`diffnet.grid`,
:mod:`diffnet.instances` and, to solve the network's own scheme, :mod:`diffnet.discretisation`.
"""

__all__: list[str] = []
