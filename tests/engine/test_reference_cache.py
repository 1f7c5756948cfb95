"""The reference cache: off unless asked for, one entry per family, options, grid and instances, the
same arrays back, and never a hit for a different problem."""

from __future__ import annotations

import dataclasses

import numpy as np

from deepfusion.analysis import reference_cache
from diffnet.families.poisson import PoissonFamily


# Two KL instances of the Poisson family on 9^2 (the cache is the family's, whichever it is; these solve in
# milliseconds where Burgers' converged Godunov takes 0.4 s an instance).
A = np.array([[0.5, -1.0, 0.3, 0.0, 2.0, -0.7], [-2.5, 0.1, 1.1, -0.4, 0.0, 0.9]])


class _Counting:
    """Wraps a family and counts its truth and floor solves."""

    def __init__(self, family):
        self.family, self.calls = family, []

    def __call__(self, family):
        outer = self

        @dataclasses.dataclass(frozen=True)
        class Counted(type(family)):
            def truth(self, params, progress=None):
                outer.calls.append("truth")
                return super().truth(params, progress)

            def discrete_optimum(self, params, initial=None):
                outer.calls.append("floor")
                return super().discrete_optimum(params, initial)

        return Counted(**{f.name: getattr(family, f.name) for f in dataclasses.fields(family)})


def test_cache_is_off_unless_named(monkeypatch, tmp_path):
    monkeypatch.delenv(reference_cache.ENV, raising=False)
    counter = _Counting(None)
    family = counter(PoissonFamily((9, 9)))
    c = A
    reference_cache.truth(family, c)
    reference_cache.truth(family, c)
    assert counter.calls == ["truth", "truth"]


def test_entries_are_per_problem_and_instances_and_return_the_same_arrays(monkeypatch, tmp_path):
    monkeypatch.setenv(reference_cache.ENV, str(tmp_path))
    counter = _Counting(None)
    family = counter(PoissonFamily((9, 9)))
    c = A
    first = reference_cache.truth(family, c)
    again = reference_cache.truth(family, c)
    assert counter.calls == ["truth"] and np.array_equal(first, again)
    optimum, roots = reference_cache.discrete_optimum(family, c, first)
    optimum2, roots2 = reference_cache.discrete_optimum(family, c, first)
    assert counter.calls == ["truth", "floor"]
    assert np.array_equal(optimum, optimum2) and np.array_equal(roots, roots2) and roots.dtype == bool
    # Another instance, another option, another grid: each its own solve.
    reference_cache.truth(family, c + np.array([[0.0] * 5 + [0.1], [0.0] * 6]))
    reference_cache.truth(dataclasses.replace(family, eta=0.6), c)
    reference_cache.truth(dataclasses.replace(family, resolution=(9, 11)), c)
    assert counter.calls == ["truth", "floor", "truth", "truth", "truth"]
    # A damaged entry is solved again and rewritten.
    before = len(counter.calls)
    for path in (tmp_path / "poisson").glob("truth-*.npz"):
        path.write_bytes(b"damaged")
    assert np.array_equal(reference_cache.truth(family, c), first) and len(counter.calls) == before + 1


def test_a_family_that_is_not_a_dataclass_is_never_cached(monkeypatch, tmp_path):
    monkeypatch.setenv(reference_cache.ENV, str(tmp_path))

    class Plain:
        name = "plain"
        calls = 0

        def truth(self, params, progress=None):
            Plain.calls += 1
            return np.zeros((len(params), 3))

    reference_cache.truth(Plain(), np.zeros(2))
    reference_cache.truth(Plain(), np.zeros(2))
    assert Plain.calls == 2 and not any(tmp_path.iterdir())
