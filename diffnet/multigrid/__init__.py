"""The torch multigrid inside the loss and the generator: the Hessian of a family's loss as a stencil
(:mod:`.hessian`, :mod:`.stencil`), the batched V-cycle B (:mod:`.vcycle`), the preconditioned loss
(:mod:`.preconditioned`) and the exact coarse-space correction (:mod:`.coarse`). Knows no family: every
operator is read off the family's loss. May import :mod:`diffnet.backend` and :mod:`diffnet.grid` (the numpy
geometric multigrid of the classical side is :mod:`diffnet.solvers.gmg`).
"""

__all__: list[str] = []
