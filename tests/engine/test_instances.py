"""Instances by the family's own names (deepfusion.configuration.inputs): the parameter's, each entry's and the
field input's, on the command line and in the Python API; the generic names of earlier versions refused in one line."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

from deepfusion.configuration.inputs import InputError, by_name, command_line_instances, instance_parameters
from diffnet.families.burgers import BurgersFamily
from diffnet.families.elastic_plate import ElasticPlateFamily
from diffnet.families.poisson import PoissonFamily


def _named(family, **given) -> np.ndarray:
    keywords, names = by_name(family, given)
    return instance_parameters(family, **keywords, names=names)


def _command_line(family, *param: str, c=None, nu=None, coeffs=None) -> np.ndarray:
    args = argparse.Namespace(param=list(param), c=c, nu=nu, coeffs=coeffs)
    return command_line_instances(family, args, (2, 3))


def test_a_vector_parameter_by_its_entries_names_is_the_same_rows():
    plate = ElasticPlateFamily((17, 17))
    assert plate.parameters.names == ("hole_x", "hole_y", "hole_r", "nu")
    rows = np.array([[0.5, 0.5, 0.1, 0.3], [0.5, 0.5, 0.15, 0.3]])
    named = _named(plate, hole_x=0.5, hole_y=[0.5, 0.5], hole_r=[0.1, 0.15], nu=0.3)  # one number stands for all
    np.testing.assert_array_equal(named, rows)
    np.testing.assert_array_equal(_named(plate, p=rows), rows)
    cli = _command_line(plate, "hole_x=0.5", "hole_y=0.5", "hole_r=0.1", "hole_r=0.15", "nu=0.3")
    np.testing.assert_array_equal(cli, rows)
    # --nu is the shorthand of a field input's file; the plate's nu is a number, told in one line.
    with pytest.raises(InputError, match=r"^--nu: this run's family's nu is a number; give it as --param nu=VALUE$"):
        _command_line(plate, "hole_x=0.5", "hole_y=0.5", "hole_r=0.1", nu=Path("0.3"))


@pytest.mark.parametrize("given, message", [
    ({"hole_x": 0.5, "hole_r": 0.1}, "hole_y, nu: give every entry of p by name (hole_x, hole_y, hole_r, nu)"),
    ({"hole_x": [0.5, 0.4, 0.45], "hole_y": [0.5, 0.5], "hole_r": 0.1, "nu": 0.3},
     "p: its entries give different numbers of instances (hole_x 3, hole_y 2, hole_r 1, nu 1)"),
    ({"hole_x": "wide", "hole_y": 0.5, "hole_r": 0.1, "nu": 0.3}, "hole_x: expected numbers, got str"),
    ({"p": [[0.5, 0.5, 0.1, 0.3]], "hole_x": 0.5, "hole_y": 0.5, "hole_r": 0.1, "nu": 0.3},
     "hole_x: the instances are given twice (also as p)"),
    ({"coeffs": [[0.5, 0.5, 0.1, 0.3]]}, "coeffs: this run's family (elastic_plate) takes its instances as p (rows of "
                                         "4) or its entries by name (hole_x, hole_y, hole_r, nu) (the generic 'coeffs' "
                                         "of earlier versions is retired)"),
    ({"hole_x": 0.5, "hole_y": 0.5, "hole_r": 0.6, "nu": 0.3}, "hole_x, hole_y, hole_r, nu: instance 0"),
])
def test_entries_by_name_are_checked_in_one_line(given, message):
    with pytest.raises(InputError) as exc:
        _named(ElasticPlateFamily((17, 17)), **given)
    assert str(exc.value).startswith(message) and "\n" not in str(exc.value)


def test_the_shorthand_flags_are_the_families_own_names(tmp_path):
    burgers, poisson = BurgersFamily((9, 9)), PoissonFamily((9, 9), kl_terms=2)
    np.testing.assert_array_equal(_command_line(burgers, "c=3", "c=4"), [3.0, 4.0])
    np.testing.assert_array_equal(_command_line(burgers, c=[3.0, 4.0]), [3.0, 4.0])
    with pytest.raises(InputError, match=r"^--param c: the instances are given twice \(also as --c\)"):
        _command_line(burgers, "c=4", c=[3.0])
    with pytest.raises(InputError, match=r"^--c: not a name of this run's family \(poisson\), which takes its "
                                         r"instances as a \(rows of 2\) or nu \(nodal fields\)"):
        _command_line(poisson, c=[3.0])
    np.save(tmp_path / "a.npy", np.array([[0.5, -0.5]]))
    with pytest.raises(InputError, match=r"^--coeffs: retired; give the instances under the poisson family's own "
                                         r"names, --param NAME=VALUE: a \(rows of 2\) or nu"):
        _command_line(poisson, coeffs=tmp_path / "a.npy")
    np.testing.assert_array_equal(_command_line(poisson, f"a={tmp_path / 'a.npy'}"), [[0.5, -0.5]])
    with pytest.raises(InputError, match=r"^--param a: expected a number|^a: this run's family \(burgers\)"):
        _command_line(burgers, f"a={tmp_path / 'a.npy'}")
