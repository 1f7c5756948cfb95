"""Run under mpiexec: a sample split over ranks gives the unsplit generator's output, loss and gradients.

For every split the world size allows (2 ranks: 2-D [1, 2] and [2, 1], 3-D slabs [2, 1, 1]; 4 ranks:
[2, 2], [1, 4], [4, 1, 1] and [2, 2, 1], and groups of 2 beside a data-parallel pair), each family's
tiled loss (the Q1 energies on the tile's own elements, the gathered default for Burgers) and the
tiled U-Net (nodal and multilevel output, and a deepened two-level stack) are compared with the whole grid: the tile's output
with its block of the whole output, the loss, and the parameter gradients summed over the
tiles. The split's claim is exactness, and float64 to 1e-10 is its proof. The float32 cases show
only that nothing is wildly off, to a bound from the arithmetic (see :func:`float32_bounds`), so that
it holds for any of oneDNN's kernel choices. Rank 0 prints one ``OK`` line per case; a mismatch
raises (MPI_Abort through abort_on_error). With ``cuda`` among the arguments the models and fields live
on the GPU (every rank on device 0): the halos, the tile gather and the domain sums go through host memory.
"""

import copy
import math
import sys

import torch

from deepfusion.parallel.comm import abort_on_error, world
from deepfusion.parallel.halo import MPITiling, domain_groups
from diffnet.generators.networks import UNet, build_network
from diffnet.families.burgers import BurgersFamily
from diffnet.families.poisson import PoissonFamily
from diffnet.families.poisson3d import Poisson3DFamily
from diffnet.families.reaction_diffusion import ReactionDiffusionFamily


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


UNIT = 2.0**-24  # float32's unit roundoff
MARGIN = 8.0  # how far two summation orders' rounding may part, in units of one order's (measured: up to 3)


def float32_bounds(model, problem, params, raw, terms, grads, summed_abs) -> dict[str, float]:
    """Bounds on how far the split float32 run may lie from the unsplit one, relative to the largest entry.

    Both runs evaluate the same sums in float32 in different orders (the tiles' partial sums, oneDNN's
    blocking for the tile's shape); each lies from the exact value by about the unsplit run's own
    rounding R, measured against its float64 twin (floored at the unit roundoff). The output has no
    sum across tiles: 2 R. The loss sums non-negative element energies (nothing cancels): 2 R. A
    gradient entry is a sum over the tiles of partial gradients, each rounded relative to its own
    size, so the split's error scales with kappa = max sum_t |g_t| / max |g|, the cancellation across
    tiles: (1 + kappa) R. Each times MARGIN, since rounding errors of two orders are not equal.
    """
    twin = copy.deepcopy(model).double()
    raw64 = twin(problem.inputs(params.double()))
    terms64 = problem.loss_terms(problem.field(raw64, params.double()), params.double())
    grads64 = torch.autograd.grad(sum(t.sum() for t in terms64.values()), list(twin.parameters()))
    rounding = {
        "output": relative(raw.double(), raw64.detach()),
        "loss": max(relative(terms[k].double(), terms64[k].detach()) for k in terms),
        "gradient": max(relative(a.double(), b) for a, b in zip(grads, grads64)),
    }
    kappa = max((s.abs().max() / g.abs().max().clamp_min(1e-30)).item() for s, g in zip(summed_abs, grads))
    factor = {"output": 2.0, "loss": 2.0, "gradient": 1.0 + kappa}
    return {k: MARGIN * factor[k] * max(r, UNIT) for k, r in rounding.items()}


def case(problem, params, output, splits, domain, dtype, tol, device="cpu") -> str:
    torch.manual_seed(0)  # the same model on every rank
    channels = (4, 8, 8)
    if output == "stack":  # a deepened multigrid generator: the coarse U-Net whole, the top block tiled
        n = problem.resolution[0]
        model = build_network("unet", problem.in_channels, channels, levels=(n // 2, n), top_channels=8,
                              output="multilevel", dims=problem.dims).to(dtype)
    else:
        model = UNet(problem.in_channels, 1, channels, output=output, dims=problem.dims).to(dtype)
    with torch.no_grad():
        for p in model.parameters():  # the zero-initialised heads would make gradients trivial
            p.add_(0.05 * torch.randn_like(p))
    model = model.to(device)
    params = (params.to(dtype) if params.is_floating_point() else params).to(device)
    # The whole grid, as one rank computes it.
    x = problem.inputs(params).to(dtype)
    raw = model(x)
    terms = problem.loss_terms(problem.field(raw, params), params)
    loss = sum(t.sum() for t in terms.values())
    grads = torch.autograd.grad(loss, list(model.parameters()))
    # The tile of this rank: its share of the objective is the (replicated) loss over the tiles.
    tiling = MPITiling(domain, problem.resolution, splits, align=2 ** (len(channels) - 1))
    raw_t = model(tiling.local(x), tiling)
    terms_t = problem.tile_loss_terms(raw_t, params, tiling)
    loss_t = sum(t.sum() for t in terms_t.values())
    grads_t = torch.autograd.grad(loss_t / tiling.tiles, list(model.parameters()))
    summed = [domain.allreduce_(g.detach().cpu().clone().contiguous()).to(device) for g in grads_t]
    errors = {
        "output": relative(raw_t, tiling.local(raw).detach()),
        "loss": max(relative(terms_t[k], terms[k].detach()) for k in terms),
        "gradient": max(relative(a, b) for a, b in zip(summed, grads)),
    }
    if tol is None:  # float32: a bound per quantity from the arithmetic
        summed_abs = [domain.allreduce_(g.detach().abs().cpu().contiguous()).to(device) for g in grads_t]
        bounds = float32_bounds(model, problem, params, raw.detach(), terms, grads, summed_abs)
    else:
        bounds = dict.fromkeys(errors, tol)
    bad = {k: f"{v:.2e} (bound {bounds[k]:.2e})" for k, v in errors.items() if not v < bounds[k]}
    label = f"{problem.name} {output} {list(splits)} {str(dtype).split('.')[-1]}"
    if bad:
        raise AssertionError(f"{label}: differs from the whole grid by {bad}")
    return label + " " + " ".join(f"{k}={v:.1e}/{bounds[k]:.1e}" for k, v in errors.items())


def main(comm, dtypes: set[str], device: str = "cpu") -> None:
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    kl = lambda n: torch.rand(n, 6, dtype=torch.float64, generator=g) * 6 - 3  # noqa: E731
    problems = [
        (PoissonFamily((32, 32)), kl(2)),
        (ReactionDiffusionFamily((16, 32)), kl(2)),
        # Per-side conditions: a lift in y, fluxes on two sides (their work summed over the tiles' nodes).
        (PoissonFamily((32, 32), x0="flux=0.5", x1="flux=-1", y0="u=0", y1="u=2"), kl(2)),
        (BurgersFamily((16, 32), viscosity=0.01), torch.tensor([3.5, 5.0], dtype=torch.float64)),
        (Poisson3DFamily((16, 16, 16)), kl(2)),
    ]
    splits2 = {2: [(1, 2), (2, 1)], 4: [(2, 2), (1, 4)]}
    splits3 = {2: [(2, 1, 1)], 4: [(4, 1, 1), (2, 2, 1)]}
    runs = []
    for tiles in sorted({2, comm.size}):
        domain, _ = domain_groups(comm, tiles)
        for problem, params in problems:
            for splits in (splits3 if problem.dims == 3 else splits2)[tiles]:
                runs.append((problem, params, "multilevel", splits, domain, torch.float64, 1e-10))
        runs.append((problems[0][0], problems[0][1], "nodal", splits2[tiles][0], domain, torch.float64, 1e-10))
        runs.append((problems[0][0], problems[0][1], "stack", splits2[tiles][-1], domain, torch.float64, 1e-10))
        runs.append((problems[4][0], problems[4][1], "stack", splits3[tiles][-1], domain, torch.float64, 1e-10))
        runs.append((problems[0][0], problems[0][1], "multilevel", splits2[tiles][0], domain, torch.float32, None))
        runs.append((problems[4][0], problems[4][1], "multilevel", splits3[tiles][0], domain, torch.float32, None))
    runs = [r for r in runs if str(r[5]).split(".")[-1] in dtypes]
    for args in runs:
        line = case(*args, device=device)
        if comm.rank == 0:
            print("OK", line, f"(domain groups of {math.prod(args[3])} in {comm.size} ranks)", flush=True)


if __name__ == "__main__":
    comm = world()
    with abort_on_error(comm):
        words = set(sys.argv[1:])
        main(comm, (words - {"cuda"}) or {"float64", "float32"}, "cuda" if "cuda" in words else "cpu")
