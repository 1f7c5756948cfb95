"""The networks that map an instance to its field: the U-Net and the multilevel stack (:mod:`.networks`),
their grid transfers (:mod:`.multilevel`), Galerkin levels (:mod:`.galerkin`), the tiles of a domain split
(:mod:`.tiling`) and the two-stage model (:mod:`.two_stage`: a second network trained on the first's
preconditioned residual). May import :mod:`diffnet.backend`, :mod:`diffnet.grid`, :mod:`diffnet.multigrid`.
"""

__all__: list[str] = []
