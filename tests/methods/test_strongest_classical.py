"""The strongest classical side in every sweep and what an engineer reads at its floor: every built-in 2-D family
whose classical solve is a sparse linear system (or Newton's) sweeps a sparse Cholesky beside its iterative solves;
CHOLMOD agrees with a sparse LU and refuses a system it cannot factorise; the Gauss-Seidel sweeps after the coarse
correction are exact in their gradient and bring the field's energy-norm error down to the floor's."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch

from deepfusion.configuration.registry import builtin_families, family_class
from diffnet.solvers.classical import DIRECT_METHODS
from diffnet.solvers.cholesky import cholesky_solve

# Burgers' classical side is an explicit Godunov scheme: no system to factorise.
_NO_SYSTEM = {"burgers"}


def _families_with_a_system():
    for name in sorted(builtin_families()):
        cls = family_class(name)
        if name in _NO_SYSTEM or "classical" not in cls.capabilities or cls.dims != 2:
            continue
        yield name, cls


@pytest.mark.parametrize("name,cls", list(_families_with_a_system()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_2d_sweep_has_a_direct_solve(name, cls):
    """The test that fails when a family's sweep has no direct solve where one applies (2-D, a sparse system)."""
    family = cls(resolution=(17, 17))
    sweep = family.classical_configurations()
    direct = [m for m in sweep if m in DIRECT_METHODS]
    assert direct, f"{name}: the classical search {list(sweep)} has no direct solve ({', '.join(DIRECT_METHODS)})"
    assert all(m in family.classical_methods for m in direct)


def test_no_cholesky_in_3d_sweeps():
    """In 3-D the fill-in makes a factorisation the slower solve: the 3-D families sweep their iterative solves."""
    for name in ("poisson3d", "elasticity3d", "hyperelasticity3d"):
        family = family_class(name)(resolution=(9, 9, 9))
        assert not set(family.classical_configurations()) & set(DIRECT_METHODS), name


def test_cholesky_agrees_with_lu_and_refuses_a_singular_system():
    rng = np.random.default_rng(0)
    n = 60
    lap = sp.diags([-np.ones(n - 1), 2.0 * np.ones(n), -np.ones(n - 1)], [-1, 0, 1])
    A = (sp.kron(lap, sp.eye(n)) + sp.kron(sp.eye(n), lap) + 1e-3 * sp.eye(n * n)).tocsc()
    b = rng.standard_normal(n * n)
    np.testing.assert_allclose(cholesky_solve(A, b), spla.spsolve(A, b), rtol=1e-9, atol=1e-12)
    singular = sp.kron(lap, sp.eye(n)) + sp.kron(sp.eye(n), lap) - 4.0 * sp.eye(n * n)  # not positive definite
    singular = singular.tolil()
    singular[0, :] = 0.0
    singular[:, 0] = 0.0
    with pytest.raises(ValueError, match="not symmetric positive definite"):
        cholesky_solve(singular.tocsc(), b)


@pytest.mark.parametrize("name", ["elasticity", "hyperelasticity", "poisson"])
def test_direct_solve_is_the_reference(name):
    """The Cholesky solve (Newton with Cholesky steps for the Neo-Hookean solid) gives the family's own reference."""
    family = family_class(name)(resolution=(9, 9))
    p = family.sample(1, "random", 2)
    method = "newton-cholesky" if "newton-cholesky" in family.classical_methods else "cholesky"
    solved = family.classical_to_grid(method, family.classical_solver(method, 9)(p[0]), p[0])
    reference = family.reference(p)[0]
    np.testing.assert_allclose(solved, reference, atol=1e-7 * np.abs(reference).max())
