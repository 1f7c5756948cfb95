"""The networks that map an instance to its field: the U-Net and the multilevel stack (:mod:`.networks`),
their grid transfers (:mod:`.multilevel`), Galerkin levels (:mod:`.galerkin`), the tiles of a domain split
(:mod:`.tiling`) and the two-stage model (:mod:`.two_stage`: a second network trained on the first's
preconditioned residual). What finishes their fields is :mod:`diffnet.product`. May import :mod:`diffnet.backend`,
:mod:`diffnet.grid`, :mod:`diffnet.multigrid`, :mod:`diffnet.protocol`.
"""

__all__: list[str] = []
