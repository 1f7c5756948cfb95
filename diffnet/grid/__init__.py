"""The structured node grid in numpy, below both the torch losses and the classical solvers: the Q1 reference
element and its matrices (:mod:`.element`), the one 1-D interpolation and the hierarchy of grids every
multigrid is built from (:mod:`.transfer`), the elastic material and its limits (:mod:`.material`), and
per-instance node data (a domain's mask) against fields of any number of unknowns (:mod:`.nodal`), a field's
values at points by the element's shape functions (:mod:`.points`). Imports nothing of diffnet.
"""

__all__: list[str] = []
