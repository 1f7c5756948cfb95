"""The configuration: the schema (every key's type, default, check and meaning), TOML loading with
``--set`` overrides and the cross-key checks, the generated reference, the family registry, and
a domain split checked whole, the checks on a user's input, and the run a config makes (:mod:`.run`: the
family, its instances and levels and the generator, built once).

May import: diffnet and :mod:`deepfusion.parallel.domain` (a split's tiles); nothing else of the engine.
"""
