"""Torch utilities every torch module of diffnet shares: constants built once per device and dtype
(:mod:`.constants`, so a CUDA graph sees no host-to-device copy) and the float32 precision switches
(:mod:`.precision`, TF32 on or off around the loss's convolutions). Imports nothing of diffnet.
"""

__all__: list[str] = []
