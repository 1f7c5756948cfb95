"""The family protocol, on the ground floor: what a PDE family gives the engine (:mod:`.family`), the optional
parts it may declare (:mod:`.capabilities`) and how it declares its configuration keys (:mod:`.options`).

Imports nothing of diffnet: every other subpackage may import it, and a user's family needs nothing else.
"""

__all__: list[str] = []
