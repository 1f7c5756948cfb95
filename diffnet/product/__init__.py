"""The product: what a user gets from a trained generator, the network's field finished, built in one place
(:mod:`.product`: :class:`~diffnet.product.product.Product` and what trains under it), with its two finishing
families: the coarse correction and its sweeps, by the kind of the family's loss (:mod:`.corrected`), and the family's
polish (:mod:`.polished`). The only code that looks inside the wrappers and the two-stage generator. May import
:mod:`diffnet.backend`, :mod:`diffnet.grid`, :mod:`diffnet.multigrid`, :mod:`diffnet.generators`, :mod:`diffnet.protocol`.
"""

__all__: list[str] = []
