"""Run under mpiexec: allreduced gradients equal the serial full-batch gradient (float64).

Exits non-zero (via MPI_Abort) on any mismatch; rank 0 prints one line per check.
Every transport is checked: MPI on the buffer, staging through a (pinned) host copy, and
(on CPU) the node-by-node sum, also with bfloat16 on the wire; with ``cuda`` as the argument the model and gradients live on the GPU (ranks
sharing it when there are fewer GPUs than ranks) and the transports are those given
after it.
"""

import sys

import torch

from deepfusion.parallel.comm import abort_on_error, world
from deepfusion.parallel.gradsync import GradSync, ParameterDrift, broadcast_parameters, check_parameters
from deepfusion.parallel.partition import local_indices
from diffnet.generators.networks import UNet
from diffnet.families.burgers import BurgersFamily
from diffnet.families.poisson import PoissonFamily


def loss_of(model, problem, c, b):
    u = problem.field(model(problem.inputs(c)), c)
    return sum(t.sum() for t in problem.loss_terms(u, c).values()) / b


def replica(problem, device: str, comm, output: str = "nodal"):
    """A float64 U-Net with perturbed (non-zero) heads, equal on every rank after the broadcast."""
    model = UNet(problem.in_channels, 1, (4, 8), output=output).double().to(device)
    with torch.no_grad():
        for p in model.parameters():  # the zero-initialised head would make gradients trivial
            p.add_(0.05 * torch.randn_like(p))
    broadcast_parameters(model, comm)
    return model


def summed_gradient_error(model, problem, params, comm, sync, b: int = 8) -> float:
    """Relative max difference between the ranks' summed gradient and the serial full-batch one."""
    n = len(params)
    batch = local_indices(0, 0, 1, 0, 1, n, b)  # the whole global batch
    full = torch.autograd.grad(loss_of(model, problem, params[batch], b), list(model.parameters()))
    reference = torch.cat([g.reshape(-1) for g in reversed(full)])
    sync.zero_grad()
    idx = local_indices(0, 0, 1, comm.rank, comm.size, n, b)
    loss_of(model, problem, params[idx], b).backward()
    sync.finish()
    return (sync.buffer - reference).abs().max().item() / reference.abs().max().item()


def main(comm):
    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    transports = sys.argv[2:] or ["auto", "staged"]
    torch.set_num_threads(1)
    torch.manual_seed(100 + comm.rank)  # different on purpose: the broadcast must fix it
    problem = BurgersFamily((12, 12), viscosity=0.01)
    model = replica(problem, device, comm)
    check_parameters(model, comm, 0)
    params = torch.linspace(3, 6, 16, dtype=torch.float64, device=device)
    # Buckets are pushed by the progress thread (every 1 ms, the default) besides the hooks; the
    # last case has the hooks alone.
    cases = [(m, mb, t, "train", 1.0) for t in transports
             for m, mb in [("flat", 4.0), ("bucketed", 4.0), ("bucketed", 0.002)]]
    if device == "cpu":  # node by node, and bfloat16 on the wire (under MPIR_CVAR_NUM_CLIQUES, several "nodes")
        cases += [("hierarchical", 4.0, "auto", "train", 1.0), ("hierarchical", 0.002, "auto", "train", 1.0),
                  ("hierarchical", 0.002, "auto", "bfloat16", 1.0), ("bucketed", 0.002, "auto", "bfloat16", 1.0),
                  ("flat", 4.0, "auto", "bfloat16", 1.0), ("hierarchical", 0.002, "auto", "bfloat16", 0.0)]
    for mode, mb, transport, grad_dtype, progress_ms in cases:
        sync = GradSync(model, comm, mode, mb, transport, grad_dtype, progress_ms)
        # bfloat16 on the wire: each rank's (or node's) sum is rounded to 8 bits of mantissa.
        tol = 1e-12 if grad_dtype == "train" else 1e-2
        for _ in range(2):  # twice: the buffers must be re-armed correctly
            err = summed_gradient_error(model, problem, params, comm, sync)
            if not err < tol:
                raise AssertionError(f"{mode} {grad_dtype} ({len(sync.buckets)} buckets, {sync.reducer.name}): "
                                     f"gradient differs by {err:.3e}")
            same = comm.allgather(sync.buffer.cpu().numpy().tobytes())  # the buffer lives on the GPU under cuda
            if len(set(same)) != 1:
                raise AssertionError(f"{mode} {grad_dtype}: ranks hold different summed gradients")
        sync.close()
        if comm.rank == 0:
            print(f"OK {mode} {grad_dtype} buckets={len(sync.buckets)} transport={sync.reducer.name} "
                  f"rel_err={err:.2e}", flush=True)
    # The drift check notices one rank's parameters changing.
    with torch.no_grad():
        if comm.rank == comm.size - 1:
            next(model.parameters()).view(-1)[0] += 1e-9
    try:
        check_parameters(model, comm, 7)
    except ParameterDrift as exc:
        assert "step 7" in str(exc)
        if comm.rank == 0:
            print("OK drift detected", flush=True)
    else:
        raise AssertionError("drift not detected")
    # The Q1 energy loss, with its own (recomputing) backward, summed over ranks; the nodal and
    # the multilevel output basis (its coarse heads and synthesis in the graph).
    problem = PoissonFamily((12, 10))
    params = (torch.rand(16, problem.kl_terms, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
              * 6 - 3).to(device)
    for output in ("nodal", "multilevel"):
        model = replica(problem, device, comm, output)
        sync = GradSync(model, comm, "bucketed", 0.002, transports[0])
        err = summed_gradient_error(model, problem, params, comm, sync)
        sync.close()
        if not err < 1e-12:
            raise AssertionError(f"Poisson energy gradient ({output} output) differs by {err:.3e}")
        if comm.rank == 0:
            print(f"OK poisson energy, {output} output, rel_err={err:.2e}", flush=True)


if __name__ == "__main__":
    comm = world()
    with abort_on_error(comm):
        main(comm)
