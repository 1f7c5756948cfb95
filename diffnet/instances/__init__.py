"""What an instance of a family is made of: shapes and signed distances (:mod:`.geometry`), side conditions
(:mod:`.boundary`), random coefficient fields (:mod:`.kl`) and the cut cells of a domain cut out of the grid
(:mod:`.cutcell`). numpy; imports nothing of diffnet above :mod:`diffnet.grid`.
"""

__all__: list[str] = []
