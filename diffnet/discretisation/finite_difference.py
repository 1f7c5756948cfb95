"""Sobel/Scharr-type finite-difference kernels applied as convolutions on nodal grids."""

from __future__ import annotations

import torch

from diffnet.backend.constants import constant
from diffnet.backend.precision import conv

__all__ = ["SWEEPS_WEIGHTS", "derivative_kernels", "pad_extrapolate", "apply_kernels", "central_residual"]

#: Cross weights (w1, w2, w1) of the 3x3 first-derivative kernels.
SWEEPS_WEIGHTS: dict[str, tuple[float, float]] = {
    "sobel": (1.0, 2.0),
    "scharr": (3.0, 10.0),
}


def derivative_kernels(kind: str, h_row: float, h_col: float) -> torch.Tensor:
    """Return the 3x3 kernels (d/drow, d/dcol, d2/dcol2) scaled by the grid spacing.

    The first-derivative kernels difference by +-1 over two spacings along one axis and
    smooth with the cross weights (w1, w2, w1) along the other, so each is divided by
    ``2 h (2 w1 + w2)``. The second-derivative kernel is the 3-point ``[1, -2, 1] / h**2``
    along the columns, smoothed with the same normalised weights along the rows.

    Parameters
    ----------
    kind : {"sobel", "scharr"}
        Which cross weights to use.
    h_row, h_col : float
        Grid spacing along the rows (first array axis, e.g. t) and columns (e.g. x).

    Returns
    -------
    torch.Tensor
        Shape (3, 1, 3, 3), float64, for use as ``conv2d`` weights (cross-correlation).
    """
    if kind not in SWEEPS_WEIGHTS:
        raise ValueError(f"unknown stencil {kind!r}; choose from {sorted(SWEEPS_WEIGHTS)}")
    w1, w2 = SWEEPS_WEIGHTS[kind]
    w = torch.tensor([w1, w2, w1], dtype=torch.float64)
    d = torch.tensor([-1.0, 0.0, 1.0], dtype=torch.float64)
    dd = torch.tensor([1.0, -2.0, 1.0], dtype=torch.float64)
    norm = 2.0 * w1 + w2
    d_row = torch.outer(d, w) / (2.0 * h_row * norm)
    d_col = torch.outer(w, d) / (2.0 * h_col * norm)
    d2_col = torch.outer(w, dd) / (h_col**2 * norm)
    return torch.stack([d_row, d_col, d2_col]).unsqueeze(1)


def pad_extrapolate(u: torch.Tensor) -> torch.Tensor:
    """Pad the last two axes by one ghost node on each side, quadratically extrapolated.

    A central 3-point difference at an edge node that reads a quadratically extrapolated
    ghost (``u_{-1} = 3 u_0 - 3 u_1 + u_2``) equals the second-order one-sided difference
    there, so applying the 3x3 kernels to the padded field closes the system with
    one-sided differences on every edge without separate edge kernels.

    Parameters
    ----------
    u : torch.Tensor
        Shape (..., R, C) with R, C >= 3.

    Returns
    -------
    torch.Tensor
        Shape (..., R + 2, C + 2).
    """
    if u.shape[-1] < 3 or u.shape[-2] < 3:
        raise ValueError(f"need at least 3x3 nodes, got {tuple(u.shape[-2:])}")

    def ghosts(v: torch.Tensor, dim: int) -> torch.Tensor:
        first = 3 * v.narrow(dim, 0, 1) - 3 * v.narrow(dim, 1, 1) + v.narrow(dim, 2, 1)
        n = v.shape[dim]
        last = 3 * v.narrow(dim, n - 1, 1) - 3 * v.narrow(dim, n - 2, 1) + v.narrow(dim, n - 3, 1)
        return torch.cat([first, v, last], dim=dim)

    return ghosts(ghosts(u, -2), -1)


def apply_kernels(u: torch.Tensor, kernels: torch.Tensor) -> torch.Tensor:
    """Apply (K, 1, 3, 3) kernels to every node of a (S, R, C) batch of nodal fields.

    Returns shape (S, K, R, C): edge nodes use one-sided differences through
    :func:`pad_extrapolate`.
    """
    padded = pad_extrapolate(u).unsqueeze(1)
    return conv(padded, kernels.to(dtype=u.dtype, device=u.device))


def central_residual(
    u: torch.Tensor, dt: float, dx: float, viscosity: float, kind: str = "sobel"
) -> torch.Tensor:
    """The Burgers residual u_t + u u_x - nu u_xx by the central kernels, at every unknown node.

    Parameters
    ----------
    u : torch.Tensor
        Space-time fields, shape (S, N_t, N_x), row 0 the initial condition and column 0
        the inflow boundary.
    dt, dx : float
        Node spacings in t and x.
    viscosity : float
        nu >= 0.
    kind : {"sobel", "scharr"}
        Cross weights of the 3x3 derivative kernels.

    Returns
    -------
    torch.Tensor
        Shape (S, N_t - 1, N_x - 1): the residual at nodes n >= 1, j >= 1. The last time
        row and the outflow column use one-sided differences, so there is exactly one
        equation per unknown node.
    """
    kernels = constant(("derivative", kind, dt, dx), lambda: derivative_kernels(kind, dt, dx), u)
    d = apply_kernels(u, kernels)[:, :, 1:, 1:]
    u_in = u[:, 1:, 1:]
    r = d[:, 0] + u_in * d[:, 1]
    if viscosity > 0.0:
        r = r - viscosity * d[:, 2]
    return r
