"""One grid of a multigrid hierarchy: the type every hierarchy here fills (PyAMG's ``Level`` is the model).

A level is the operator on one node grid as a stencil (identity rows on its fixed nodes), which nodes are fixed,
and the interpolation from the next coarser grid, per axis; a hierarchy is a list of them, coarsest first (level 0,
as the training's multigrid levels are counted). Two
hierarchies fill it:

- :class:`diffnet.multigrid.vcycle.VCycle`, the batched torch V-cycle of the preconditioned loss, the second stage
  and the families' polish (one hierarchy per instance of a batch): ``stencil`` (S, C, C, 3^d, *grid), offset-major,
  ``fixed`` (S, C, *grid), ``interpolation`` one dense matrix per axis, ``smoother`` the damped-Jacobi
  diagonal and damping (:class:`~diffnet.multigrid.vcycle.Jacobi`);
- :class:`diffnet.solvers.gmg.GMGSolver`, the numpy/numba geometric multigrid of the classical solves (one system):
  ``stencil`` (N_z, N_y, N_x, k_z, k, k), node-major in the 3-D layout of :mod:`diffnet.solvers.matrix_stencil`,
  ``fixed`` (N_z, N_y, N_x), ``interpolation`` (left neighbour, weight) per axis, ``values`` its Dirichlet data and
  ``smoother`` the compiled passes and work arrays.

Why two stencil layouts: each follows its smoother's memory access. The torch V-cycle applies a whole grid one
coupling at a time (damped Jacobi on a batch: each of the 3^d offsets is one contiguous shifted multiply-add over
every node), so offsets lead; the numba Gauss-Seidel sweeps visit one node at a time and read all its couplings
before the next node's update, so the couplings of a node are contiguous. The exact coarse correction
(:mod:`diffnet.multigrid.coarse`) needs no hierarchy: it solves one coarse space directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["Level"]

Array = Union["np.ndarray", "torch.Tensor"]


@dataclass
class Level:
    """One grid of a multigrid hierarchy (see the module docstring for each hierarchy's layouts).

    Attributes
    ----------
    stencil : array
        The operator on this grid; identity rows on the fixed nodes.
    fixed : array of bool
        The nodes held (Dirichlet, or outside a cut domain).
    interpolation : tuple or list, optional
        Per axis, the interpolation P from the next coarser grid (its transpose restricts); None on the coarsest.
    values : array, optional
        The Dirichlet data on the fixed nodes, zero elsewhere, where the hierarchy solves for the field itself.
    inactive : array of bool, optional
        The nodes outside a domain cut out of the grid (held at 0), where there are any.
    smoother : object, optional
        What the hierarchy's smoother keeps for this level (a diagonal and damping, compiled passes, work arrays).
    """

    stencil: Array
    fixed: Array
    interpolation: tuple | list | None = None
    values: Array | None = None
    inactive: Array | None = None
    smoother: object = None

    @cached_property
    def free(self) -> Array:
        """The nodes the hierarchy solves for (not ``fixed``), made once: the torch V-cycle masks with it on every
        transfer of every cycle."""
        return ~self.fixed
