"""The configuration: the schema (every key's type, default, check and meaning), TOML loading with
``--set`` overrides and the cross-key checks, the generated reference, the family registry, and
the wiring from a config to a family, a model and its instances.

May import: diffnet and :mod:`deepfusion.parallel.domain`'s rules; nothing else of the engine.
"""
