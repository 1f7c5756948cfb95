"""A family's parameter: per-entry training ranges and names (ParameterSpec), the samplers and laws
that respect them, and the range warning that names the entry; one shared range stays as it was."""

from dataclasses import dataclass

import numpy as np
import pytest

from deepfusion.configuration.inputs import ParameterRangeWarning, instance_parameters
from diffnet.protocol.family import Family, ParameterSpec, sample_box

SPEC = ParameterSpec("a", (2,), low=(-1.0, 0.0), high=(1.0, 2.0), names=("p1", "p2"), description="(p1, p2)")


@dataclass(frozen=True)
class _TwoEntries(Family):
    """Only what the instance checks read: a two-entry parameter with a range per entry."""

    resolution: tuple[int, ...] = (9, 9)
    name = "two_entries"

    @property
    def parameters(self) -> ParameterSpec:
        return SPEC


def test_the_spec_holds_a_range_per_entry_and_refuses_inconsistent_ones():
    low, high = SPEC.bounds()
    assert low.tolist() == [-1.0, 0.0] and high.tolist() == [1.0, 2.0] and SPEC.per_entry
    assert SPEC.range_text() == "a[0] (p1) in [-1, 1], a[1] (p2) in [0, 2]"
    assert SPEC.outside(np.array([[0.5, 1.5], [1.8, 1.0], [0.0, -0.1]])).tolist() == [False, True, True]
    shared = ParameterSpec("c", (), 3.0, 6.0)
    assert not shared.per_entry and shared.range_text() == "[3, 6]" and shared.bounds()[0].shape == ()
    assert ParameterSpec("a", (2,), [-1, 0], np.array([1, 2])) == ParameterSpec("a", (2,), (-1.0, 0.0), (1.0, 2.0))
    for bad, message in [(dict(low=(-1.0, 0.0, 1.0)), "low has 3 entries, the shape"),
                         (dict(names=("p1",)), "1 names for 2 entries"),
                         (dict(high=(1.0, 0.0)), "every entry needs finite low < high")]:
        with pytest.raises(ValueError, match=message):
            ParameterSpec(**({"name": "a", "shape": (2,), "low": (-1.0, 0.0), "high": (1.0, 2.0)} | bad))


@pytest.mark.parametrize("sampling, n", [("random", 500), ("sobol", 512), ("uniform", 25)])
def test_every_sampler_and_the_uniform_law_keep_each_entry_in_its_own_range(sampling, n):
    family = _TwoEntries()
    for params in (family.sample(n, sampling, 3), family.draw(500, "uniform", 3)):
        assert params.shape[1:] == (2,) and not SPEC.outside(params).any()
        # Each entry spans its own range, not the union [-1, 2].
        assert params[:, 0].max() > 0.9 and params[:, 1].min() < 0.1 and params[:, 1].max() > 1.9
    if sampling == "uniform":  # the tensor grid: each entry's own equispaced values, both ends included
        assert sorted(set(family.sample(n, sampling, 0)[:, 1])) == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0])


def test_one_shared_range_samples_as_before():
    # The scalar path is the draw the figures were measured with: bitwise, for every sampling.
    rng = np.random.default_rng(5).uniform(-3.0, 3.0, size=(7, 6))
    assert np.array_equal(sample_box(-3.0, 3.0, (6,), 7, "random", 5), rng)
    per_entry = sample_box([-3.0] * 6, [3.0] * 6, (6,), 16, "sobol", 5)
    assert np.allclose(per_entry, sample_box(-3.0, 3.0, (6,), 16, "sobol", 5), rtol=0, atol=1e-15)


def test_the_range_warning_names_the_entry_and_its_own_range():
    family = _TwoEntries()
    with pytest.warns(ParameterRangeWarning, match=r"rows: 1.8 \(a\[0\] \(p1\)\) is outside its training range "
                                                   r"\[-1, 1\]; the field is an extrapolation"):
        instance_parameters(family, rows=[[1.8, 1.0]])  # inside the union [-1, 2], outside p1's range
    with pytest.warns(ParameterRangeWarning, match=r"-0.5 \(a\[1\] \(p2\)\) is outside its training range \[0, 2\]"):
        instance_parameters(family, rows=[0.5, -0.5])
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert instance_parameters(family, rows=[[0.5, 1.5]]).tolist() == [[0.5, 1.5]]


def test_the_families_tutorials_two_entry_spec_is_this_one():
    import re

    from helpers import ROOT

    text = (ROOT / "docs" / "families.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", text[text.index("## A parameter with several entries"):], re.S).group(1)
    from diffnet import ParameterSpec as Spec

    spec = eval(snippet, {"ParameterSpec": Spec})  # the docs' expression, as written
    assert spec.bounds()[0].tolist() == SPEC.bounds()[0].tolist() and spec.names == SPEC.names
    assert spec.range_text() == SPEC.range_text()


LIMITED = ParameterSpec("a", (2,), low=(-1.0, 0.2), high=(1.0, 0.4), names=("p1", "nu"),
                        limits=((-np.inf, -1.0), (np.inf, 0.5)))


@dataclass(frozen=True)
class _Limited(_TwoEntries):
    @property
    def parameters(self) -> ParameterSpec:
        return LIMITED


def test_the_physics_limits_are_declared_once_and_refuse_an_instance_outside_them():
    lower, upper = LIMITED.physical()
    assert lower.tolist() == [-np.inf, -1.0] and upper.tolist() == [np.inf, 0.5]
    assert LIMITED.limit_text((1,)) == "-1 < nu < 0.5" and LIMITED.limit_text((0,)) == "p1 finite"
    family = _Limited()
    for nu in (0.5, 1.0, -1.0):  # the limits are open: 0.5 (incompressible) and -1 are not materials
        with pytest.raises(ValueError, match=rf"^instance 1: a\[1\] \(nu\) = {nu:g}; the physics needs -1 < nu < 0\.5$"):
            family.check_instances(np.array([[0.0, 0.3], [0.0, nu]]))
    family.check_instances(np.array([[5.0, 0.45]]))  # outside the training range, inside the physics: an instance
    with pytest.warns(ParameterRangeWarning, match="extrapolation"):
        instance_parameters(family, rows=[[0.0, 0.45]])
    assert ParameterSpec("c", (), 1.0, 5.0, positive=True).physical() == (0.0, np.inf)


def test_a_training_range_that_leaves_the_limits_is_refused():
    with pytest.raises(ValueError, match=r"^a\[1\] \(nu\): the training range \[0.2, 0.5\] leaves the physics' limits "
                                         r"\(-1 < nu < 0.5\)$"):
        ParameterSpec("a", (2,), low=(-1.0, 0.2), high=(1.0, 0.5), names=("p1", "nu"),
                      limits=((-np.inf, -1.0), (np.inf, 0.5)))
    with pytest.raises(ValueError, match=r"^c: the training range \[0, 1\] leaves the physics' limits \(c > 0\)$"):
        ParameterSpec("c", (), 0.0, 1.0, positive=True)
