"""Wrappers of a family declare what they pass on (diffnet.protocol.wrapper): every protocol member decided by each
wrapper, nothing forwarded by ``__getattr__``, the decisions doing what they say."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import diffnet
from diffnet.families.poisson import PoissonFamily
from diffnet.protocol.family import Family
from diffnet.protocol.wrapper import INSTANCE_MEMBERS, Wrapper, protocol_members

ROOT = Path(__file__).resolve().parents[2]


def _wrappers() -> list[type]:
    """Every Wrapper subclass in diffnet (each module imported, so that a new wrapper is found without a list)."""
    for info in pkgutil.walk_packages(diffnet.__path__, "diffnet."):
        importlib.import_module(info.name)
    found, todo = [], list(Wrapper.__subclasses__())
    while todo:
        klass = todo.pop()
        found.append(klass)
        todo += klass.__subclasses__()
    return sorted(found, key=lambda k: k.__name__)


def _defined(klass: type) -> set[str]:
    """The names a wrapper defines or declares itself (its classes down to Wrapper, which decides output_loss_terms
    once for all)."""
    names: set[str] = set()
    for base in klass.__mro__:
        if base is Family:
            break
        names |= set(vars(base))
    return names


def test_every_protocol_member_is_passed_on_withheld_or_defined_by_each_wrapper():
    wrappers = _wrappers()
    assert {k.__name__ for k in wrappers} >= {"PreconditionedLoss", "CoarseCorrected", "SecondStage", "GalerkinLoss"}
    for klass in wrappers:
        undecided = protocol_members() - _defined(klass)
        assert not undecided, f"{klass.__name__} decides nothing about {sorted(undecided)}"
        assert not (klass.passed_on & klass.withheld)


def test_no_class_forwards_by_getattr():
    # Only a module's lazy loader (diffnet/__init__.py, at column 0) may define __getattr__; a method would be indented.
    for folder in ("diffnet", "deepfusion"):
        for path in (ROOT / folder).rglob("*.py"):
            assert not re.search(r"^[ \t]+def __getattr__", path.read_text(), re.M), f"{path} forwards by __getattr__"


def test_the_decisions_do_what_they_say():
    from diffnet.generators.galerkin import GalerkinLoss
    from diffnet.product.corrected import CoarseCorrected
    from diffnet.multigrid.preconditioned import PreconditionedLoss

    family = PoissonFamily((9, 9))
    loss = PreconditionedLoss(family)
    corrected = CoarseCorrected(loss, family, 5)
    # passed on: the wrapped family's own member, read on each access
    assert corrected.parameters == family.parameters and corrected.truth_name() == family.truth_name()
    assert corrected.hessian.__func__ is PoissonFamily.hessian and loss.field.__func__ is PoissonFamily.field
    # defined: the wrapper's own (the family on another grid keeps its wrappers)
    coarse = corrected.at_resolution((5, 5))
    assert isinstance(coarse.inner, PreconditionedLoss) and coarse.inner.family.resolution == (5, 5)
    assert coarse.family.resolution == (5, 5) and coarse.resolution == (5, 5)
    params = torch.as_tensor(family.sample(2, "sobol", 0))  # S = C = 2 where it could matter
    raw = torch.randn(2, 1, 9, 9, dtype=torch.float64)
    u = corrected.field(raw, params)
    assert not torch.allclose(u, family.field(raw, params))
    # withheld: absent, as an optional member a family lacks
    galerkin = GalerkinLoss(PoissonFamily((5, 5)), family)
    assert getattr(galerkin, "reference", None) is None and not hasattr(galerkin, "hessian")
    with pytest.raises(AttributeError, match="GalerkinLoss has no 'hessian'"):
        galerkin.hessian
    assert galerkin.name == "poisson" and galerkin.resolution == (9, 9) and galerkin.in_channels == family.in_channels
    # an optional member the wrapped family lacks is absent from the wrapper too
    assert getattr(corrected, "admissible", None) is None


def test_a_member_decided_twice_is_refused():
    with pytest.raises(TypeError, match="field decided twice"):
        class Twice(Wrapper):
            wraps = "inner"
            passed_on = INSTANCE_MEMBERS | {"field"}

            def field(self, raw, params):
                return raw


def test_a_polished_product_is_the_fields_then_the_familys_polish_and_refuses_gradients():
    """model.polish (diffnet.product.polished): the inner field then the family's own polish, the same numbers as
    calling it by hand; the family on another grid keeps its steps; a gradient through it is refused, not zero."""
    from diffnet.families.burgers import BurgersFamily
    from diffnet.families.elasticity import ElasticityFamily
    from diffnet.product.polished import Polished

    burgers = BurgersFamily((9, 17), stencil="conservative")
    elastic = ElasticityFamily(resolution=(9, 9))  # two unknowns and two instances: S = C
    for family, steps in ((burgers, 2), (elastic, 1)):
        params = torch.as_tensor(family.sample(2, "uniform" if family is burgers else "sobol", 0))
        raw = torch.randn(2, len(family.unknowns), *family.resolution, dtype=torch.float64,
                          generator=torch.Generator().manual_seed(0))
        polished = Polished(family, steps)
        np.random.seed(0)  # pyamg's hierarchy (elasticity's polish) estimates a spectral radius from a random vector
        u = polished.field(raw, params)
        np.random.seed(0)
        by_hand = family.polish(params.numpy(), family.field(raw, params).numpy(), steps)
        np.testing.assert_allclose(u.numpy(), by_hand, rtol=0, atol=1e-12)
        with torch.inference_mode():  # as predict runs it: Burgers' Newton differentiates its residual inside
            np.random.seed(0)
            np.testing.assert_allclose(polished.field(raw, params).numpy(), by_hand, rtol=0, atol=1e-12)
        assert not np.allclose(by_hand, family.field(raw, params).numpy())  # the polish moved the field
        assert polished.inner is family and polished.loss_terms.__func__ is type(family).loss_terms
        assert polished.exact_parameter_gradients is False
    assert polished.at_resolution((5, 5)).steps == 1 and polished.at_resolution((5, 5)).resolution == (5, 5)
    assert Polished(burgers, 2).steps_text() == "2 Newton steps"
    with pytest.raises(RuntimeError, match="model.polish: this polish step has no gradient"):
        Polished(burgers, 2).field(torch.zeros(1, 1, 9, 17, requires_grad=True), torch.tensor([4.0]))
    with pytest.raises(ValueError, match="declares no polish step"):
        Polished(BurgersFamily((9, 17)), 1)  # the central residual has no scheme to march
