"""Cluster job scripts: the templates in ``jobs/`` rendered with validated, quoted values."""

from __future__ import annotations

import math
import re
import shlex
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

__all__ = ["NodeType", "CLUSTERS", "JobError", "JobRequest", "render_job", "template_path", "size_domain"]


@dataclass(frozen=True)
class NodeType:
    """Cores and NUMA domains of one node, as the site documents them."""

    cores: int
    numa: int
    note: str


# Node types per cluster, keyed by the partition (queue) that serves them; the first is
# the default. Sites name Azure and AWS queues themselves: give --partition with
# --node-type (or --cores-per-node) when yours is not one of these names.
CLUSTERS: dict[str, dict[str, NodeType]] = {
    "stampede": {
        "skx": NodeType(48, 2, "Stampede3 SKX, 2 x Xeon Platinum 8160"),
        "icx": NodeType(80, 2, "Stampede3 ICX, 2 x Xeon Platinum 8380"),
        "spr": NodeType(112, 8, "Stampede3 SPR, 2 x Xeon CPU Max 9480"),
    },
    "azure": {
        "hbv3": NodeType(120, 4, "Azure HB120rs_v3, AMD EPYC 7V73X"),
        "hbv4": NodeType(176, 4, "Azure HB176rs_v4, AMD EPYC 9V33X"),
        "hc": NodeType(44, 2, "Azure HC44rs, 2 x Xeon Platinum 8168"),
    },
    "aws": {
        "hpc6a": NodeType(96, 4, "AWS hpc6a.48xlarge, AMD EPYC 7R13"),
        "hpc7a": NodeType(192, 4, "AWS hpc7a.96xlarge, AMD EPYC 9R14"),
        "c5n": NodeType(36, 2, "AWS c5n.18xlarge, 2 x Xeon Platinum 8124M, hyperthreads off"),
    },
    "local": {},  # this machine: its own cores, one node
}

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_TIME = re.compile(r"(\d{1,3}):([0-5]\d):([0-5]\d)")
_PLACEHOLDER = re.compile(r"@([a-z_]+)@")


class JobError(ValueError):
    """A value that cannot go into a job script; the message names the option."""


@dataclass(frozen=True)
class JobRequest:
    """What the user asked for; every field is checked by :func:`render_job`."""

    cluster: str
    config: Path
    run_dir: Path
    nodes: int
    ranks_per_node: int
    threads: int
    time: str = "02:00:00"
    partition: str | None = None
    account: str | None = None
    node_type: str | None = None
    cores_per_node: int | None = None
    domain: tuple[int, ...] | None = None  # parallel.domain for the job's command line


def size_domain(grid: tuple[int, ...], sample_bytes: float, samples: int, ranks: int, memory_per_rank: float,
                align: int) -> tuple[int, ...] | None:
    """The smallest domain split (tiles per axis) under which one rank's share of a training step fits
    ``memory_per_rank`` bytes, or None when no split is needed.

    ``samples`` is the global batch and ``ranks`` the job's ranks: a split into T tiles makes
    ranks / T data-parallel groups, each holding ceil(samples / groups) samples, T ranks to each.
    Tiles double along the axes in turn (2-D [1,2], [2,2], [2,4], ...; 3-D slabs first), each a
    multiple of ``align`` nodes a side. Raises JobError when even a split over every rank does not fit.
    """
    def need(tiles: int) -> float:
        groups = max(1, ranks // tiles)
        return sample_bytes * -(-samples // groups) / tiles

    splits = [1] * len(grid)
    axis = 0 if len(grid) == 3 else len(grid) - 1
    while need(math.prod(splits)) > memory_per_rank:
        splits[axis] *= 2
        axis = (axis + 1) % len(grid) if len(grid) == 3 else (axis - 1) % len(grid)
        tiles = math.prod(splits)
        if tiles > ranks or ranks % tiles or any(n % p or (n // p) % align for n, p in zip(grid, splits)):
            raise JobError(f"--memory-per-node: a training step of the {'x'.join(map(str, grid))} grid needs about "
                           f"{need(1) / 2**30:.1f} GiB per rank unsplit; no domain split over these {ranks} ranks "
                           f"brings it under {memory_per_rank / 2**30:.1f} GiB (more nodes, a smaller batch, or "
                           f"model.checkpoint_activations)")
    return tuple(splits) if math.prod(splits) > 1 else None


def template_path(cluster: str) -> Path:
    """``jobs/<cluster>.slurm`` (``local.sh``) from the source tree, or the copy installed under ``share/``."""
    name = "local.sh" if cluster == "local" else f"{cluster}.slurm"
    for root in (Path(__file__).resolve().parents[1], Path(sysconfig.get_path("data")) / "share" / "deepfusion"):
        if (root / "jobs" / name).is_file():
            return root / "jobs" / name
    raise JobError(f"cannot find the job template jobs/{name}; is the package installed in full?")


def _count(option: str, value: int, top: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
        raise JobError(f"{option}: must be an integer in 1..{top}, got {value!r}")
    return value


def _name(option: str, value: str) -> str:
    if not _NAME.fullmatch(value):
        raise JobError(f"{option}: {value!r} is not a plain name (letters, digits, '_', '.', '-'; at most 64)")
    return value


def _node(request: JobRequest, local_cores: int) -> tuple[str, int, int]:
    """(partition, cores per node, NUMA domains per node) for the request."""
    if request.cluster == "local":
        return "", request.cores_per_node or local_cores, 1
    table = CLUSTERS[request.cluster]
    partition = _name("--partition", request.partition) if request.partition else next(iter(table))
    kind = request.node_type or (partition if partition in table else None)
    if kind is not None and kind not in table:
        raise JobError(f"--node-type: {kind!r} is not a {request.cluster} node type ({', '.join(table)})")
    if request.cores_per_node:
        return partition, request.cores_per_node, table[kind].numa if kind else 1
    if kind is None:
        raise JobError(f"--partition: {partition!r} is not in the {request.cluster} table ({', '.join(table)}); "
                       "give --node-type or --cores-per-node for it")
    return partition, table[kind].cores, table[kind].numa


def render_job(request: JobRequest, local_cores: int = 1, mpiexec: str | None = None) -> str:
    """The job script for ``request``: its cluster's template with every value validated and quoted.

    Counts are integers in range, names match a safe character set, paths are absolute
    and shell-quoted, and ranks per node x threads must fit the node's cores.

    Raises
    ------
    JobError
        On any value that does not pass, naming the option.
    """
    if request.cluster not in CLUSTERS:
        raise JobError(f"cluster: must be one of {', '.join(CLUSTERS)}, got {request.cluster!r}")
    nodes = _count("--nodes", request.nodes, 1 if request.cluster == "local" else 100_000)
    ranks = _count("--ranks-per-node", request.ranks_per_node, 4096)
    threads = _count("--threads", request.threads, 4096)
    if request.cores_per_node is not None:
        _count("--cores-per-node", request.cores_per_node, 100_000)
    match = _TIME.fullmatch(request.time)
    if not match or not any(int(g) for g in match.groups()):
        raise JobError(f"--time: expected a positive HH:MM:SS, got {request.time!r}")
    account = _name("--account", request.account) if request.account else None
    for option, path in (("CONFIG", request.config), ("output.dir", request.run_dir)):
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in str(path)):
            raise JobError(f"{option}: {str(path)!r} contains control characters")
    partition, cores, numa = _node(request, local_cores)
    if ranks * threads > cores:
        raise JobError(f"--ranks-per-node x --threads = {ranks} x {threads} = {ranks * threads} exceeds the "
                       f"{cores} cores of a {request.cluster} node{f' ({partition})' if partition else ''}")
    # Open MPI places ranks per NUMA domain when they divide evenly, else per node.
    map_by = f"ppr:{ranks // numa}:numa:pe={threads}" if ranks % numa == 0 else f"ppr:{ranks}:node:pe={threads}"
    values = {
        "job_name": "deepfusion-" + re.sub(r"[^A-Za-z0-9_.-]", "_", request.config.stem)[:40],
        "partition": partition,
        "nodes": str(nodes),
        "ranks_per_node": str(ranks),
        "threads": str(threads),
        "time": request.time,
        "account_line": f"#SBATCH --account={account}" if account else "# (no --account: the user's default)",
        "map_by": map_by,
        "python": shlex.quote(sys.executable),
        "mpiexec": shlex.quote(mpiexec or "mpiexec"),
        "config": shlex.quote(str(request.config.resolve())),
        "run_dir": shlex.quote(str(request.run_dir.resolve())),
        "train_args": "" if not request.domain else
        "--set " + shlex.quote(f"parallel.domain=[{','.join(str(int(p)) for p in request.domain)}]"),
    }
    text = template_path(request.cluster).read_text()
    missing = {m for m in _PLACEHOLDER.findall(text) if m not in values}
    if missing:  # a template edited with a name this code does not fill
        raise JobError(f"{template_path(request.cluster)}: unknown placeholder(s) {sorted(missing)}")
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], text)
