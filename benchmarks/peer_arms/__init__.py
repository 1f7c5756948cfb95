"""The peers of ``benchmarks/peers.py``, each trained to a wall-clock budget on a DiffNet family's held-out
instances: DeepXDE's physics-informed network (:mod:`peer_arms.pinn`, the strong forms in :mod:`peer_arms.forms`)
and a Fourier neural operator trained on the classical solver's fields (:mod:`peer_arms.fno`); both time themselves
with :mod:`peer_arms.watch`. They need the ``peers`` extra (``pip install -e ".[peers]"``)."""
