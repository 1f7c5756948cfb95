"""The discrete losses DiffNet is trained on, in torch: Q1 energies as convolutions (:mod:`.energy`,
:mod:`.elasticity`), finite differences (:mod:`.finite_difference`), finite volumes (:mod:`.finite_volume`)
and cut-cell energies (:mod:`.immersed`). May import :mod:`diffnet.backend`, :mod:`diffnet.grid`,
:mod:`diffnet.instances`.
"""

__all__: list[str] = []
