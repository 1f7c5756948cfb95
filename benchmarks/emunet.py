"""Emulated nodes on one machine: a network namespace per node, veth links through a bridge, a
traffic shaper on each link, and MPI jobs launched across them by MPI's own launcher.

Node ``i`` is the namespace ``<tag>n<i>`` with one interface ``eth0`` (address ``10.213.X.i+1``)
whose peer sits on the bridge ``<tag>b`` (``10.213.X.254``, where ``mpiexec`` runs). Each link is
shaped in both directions with a token bucket (``tbf``) at the given rate; the given latency is
added with ``netem`` where the kernel has it (this machine's kernel has only ``tbf`` and ``htb``:
then the latency is the stack's own, and the fitted alpha of a raw Allreduce sweep says what it
is). Hydra (MPICH's ``mpiexec``) starts one proxy per node through a small ``rsh`` stand-in that
enters the node's namespace (and gives it its own host name), so ranks on one node share memory
and ranks on different nodes talk TCP over the links: UCX is told to use TCP on ``eth0`` only,
which the links' byte counters confirm (:meth:`Fabric.tx_bytes`).

    python benchmarks/emunet.py --nodes 2 --ppn 2 --rate 1gbit -- python -m deepfusion train ...
    python benchmarks/emunet.py --clean          # remove what a killed run left behind

Needs root (``ip netns``, ``tc``); :func:`unavailable` says why not, for a clean skip.
"""

from __future__ import annotations

import argparse
import atexit
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["Fabric", "unavailable", "clean"]

PREFIX = "dfe"  # every namespace, bridge and link this tool makes starts with it
_RATE = re.compile(r"^(\d+(?:\.\d+)?)([kmg]?)bit$")


def _bits_per_s(rate: str) -> float:
    """``"1gbit"`` -> 1e9."""
    number, unit = _RATE.match(rate).groups()
    return float(number) * {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9}[unit]


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", *args] if ns is None else ["ip", "netns", "exec", ns, "ip", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


def _tc(*args: str, ns: str | None = None) -> subprocess.CompletedProcess:
    cmd = ["tc", *args] if ns is None else ["ip", "netns", "exec", ns, "tc", *args]
    return subprocess.run(cmd, capture_output=True, text=True)


def unavailable() -> str | None:
    """Why emulated nodes cannot be made here (None when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool!r} is not installed"
    probe = f"{PREFIX}probe{os.getpid() % 10000}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def clean() -> list[str]:
    """Remove every namespace and bridge this tool made (after a run that was killed); their names."""
    gone = []
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    for ns in [n for n in names if n.startswith(PREFIX)]:
        for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
            _kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        gone.append(ns)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(PREFIX):
            _ip("link", "del", name, check=False)  # a bridge; a veth goes with its namespace
            gone.append(name)
    return gone


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


class Fabric:
    """K emulated nodes joined by shaped links; a context manager that tears them down on exit.

    Parameters
    ----------
    nodes : int
        Number of nodes (1..200).
    rate : str
        Link bandwidth in ``tc`` units, each direction (``"1gbit"``, ``"10gbit"``).
    latency_us : float
        One-way latency added to each link with netem where the kernel has it (0: none).
    """

    def __init__(self, nodes: int, rate: str = "10gbit", latency_us: float = 0.0) -> None:
        if not 1 <= nodes <= 200:
            raise ValueError("nodes must be in 1..200")
        if not _RATE.match(rate):
            raise ValueError(f"rate {rate!r} is not a tc rate such as '1gbit'")
        self.nodes, self.rate, self.latency_us = nodes, rate, float(latency_us)
        tag = f"{PREFIX}{os.getpid() % 100000}"
        self.bridge = f"{tag}b"
        self.namespaces = [f"{tag}n{i}" for i in range(nodes)]
        self.links = [f"{tag}v{i}" for i in range(nodes)]
        self.subnet = f"10.213.{os.getpid() % 250}"
        self.hosts = [f"{self.subnet}.{i + 1}" for i in range(nodes)]
        self.head = f"{self.subnet}.254"
        self.latency_emulated = False
        self._dir: Path | None = None

    # ------------------------------------------------------------------ set-up and tear-down

    def __enter__(self) -> "Fabric":
        atexit.register(self.close)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _build(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.head}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for ns, link, host in zip(self.namespaces, self.links, self.hosts):
            _ip("netns", "add", ns)
            _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", link, "master", self.bridge)
            _ip("link", "set", link, "up")
            _ip("addr", "add", f"{host}/24", "dev", "eth0", ns=ns)
            _ip("link", "set", "eth0", "up", ns=ns)
            _ip("link", "set", "lo", "up", ns=ns)
            for where in (None, ns):  # into the node (bridge side) and out of it
                self._shape(link if where is None else "eth0", where)
        self._dir = Path(tempfile.mkdtemp(prefix="emunet-"))
        self._write_rsh()

    def _shape(self, dev: str, ns: str | None) -> None:
        # A token bucket of 1 ms at the rate: bursts no longer than a real NIC's queue would pass.
        burst = max(32_000, int(_bits_per_s(self.rate) / 8 / 1000))
        if self.latency_us > 0:
            got = _tc("qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "delay",
                      f"{self.latency_us:g}us", "rate", self.rate, ns=ns)
            if got.returncode == 0:
                self.latency_emulated = True
                return
        got = _tc("qdisc", "add", "dev", dev, "root", "tbf", "rate", self.rate, "burst", str(burst),
                  "latency", "50ms", ns=ns)
        if got.returncode != 0:
            raise RuntimeError(f"tc could not shape {dev}: {got.stderr.strip()}")

    def _write_rsh(self) -> None:
        # Hydra runs "<launcher-exec> [-x] HOST COMMAND": enter HOST's namespace, give it its own
        # host name (ranks report where they run), and run COMMAND there as a remote shell would.
        cases = "\n".join(f'    {host}) ns={ns}; name=node{i} ;;'
                          for i, (host, ns) in enumerate(zip(self.hosts, self.namespaces)))
        script = f"""#!/bin/sh
while [ "${{1#-}}" != "$1" ]; do shift; done
host=$1; shift
case "$host" in
{cases}
    *) echo "emunet rsh: unknown host $host" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" unshare --uts sh -c "hostname $name; $*"
"""
        path = self._dir / "rsh"
        path.write_text(script)
        path.chmod(0o755)

    def close(self) -> None:
        """Kill whatever still runs on the nodes and remove namespaces, links, bridge (idempotent)."""
        for ns in self.namespaces:
            for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
                _kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        _ip("link", "del", self.bridge, check=False)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    # ------------------------------------------------------------------ using it

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment for an MPI job on the fabric: UCX on TCP over ``eth0`` only (without it UCX
        finds the other "nodes" share this machine's memory and never touches the links), gloo on ``eth0``."""
        env = dict(os.environ if base is None else base)
        env.update(UCX_TLS="self,tcp", UCX_NET_DEVICES="eth0", GLOO_SOCKET_IFNAME="eth0",
                   MASTER_ADDR=self.hosts[0])
        return env

    def mpiexec(self, ppn: int, command: list[str], mpiexec: str | None = None, nodes: int | None = None) -> list[str]:
        """The argv of ``command`` as an MPI job of ``ppn`` ranks on each of the first ``nodes`` nodes (all by
        default), started by hydra."""
        nodes = self.nodes if nodes is None else nodes
        if not 1 <= nodes <= self.nodes:
            raise ValueError(f"the fabric has {self.nodes} nodes, not {nodes}")
        if self._dir is None:
            raise RuntimeError("the fabric is not up (use it as a context manager)")
        if mpiexec is None:
            from deepfusion.parallel.runtime import find_mpiexec

            mpiexec = find_mpiexec()
        return [mpiexec, "-launcher", "ssh", "-launcher-exec", str(self._dir / "rsh"),
                "-hosts", ",".join(self.hosts[:nodes]), "-localhost", self.head,
                "-n", str(ppn * nodes), "-ppn", str(ppn), *command]

    def tx_bytes(self) -> list[int]:
        """Bytes each node has sent on its link so far."""
        out = []
        for ns in self.namespaces:
            got = subprocess.run(["ip", "netns", "exec", ns, "cat", "/sys/class/net/eth0/statistics/tx_bytes"],
                                 capture_output=True, text=True, check=True)
            out.append(int(got.stdout))
        return out

    def kill_node(self, node: int, sig: int = signal.SIGKILL) -> list[int]:
        """Send ``sig`` to every process on ``node`` except its MPI proxy (the node's ranks); their pids."""
        pids = []
        for pid in subprocess.run(["ip", "netns", "pids", self.namespaces[node]], capture_output=True,
                                  text=True).stdout.split():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if "python" in Path(argv[0].decode(errors="replace")).name:
                _kill(int(pid), sig)
                pids.append(int(pid))
        return pids

    def set_link(self, node: int, up: bool) -> None:
        """Take ``node``'s link down (a pulled cable) or bring it back; back means carrying traffic again:
        the bridge port reports ``up`` (the carrier takes a moment; a job started before it failed its
        MPI_Init with "Destination is unreachable" once in CI)."""
        _ip("link", "set", self.links[node], "up" if up else "down")
        if up:
            state = Path("/sys/class/net") / self.links[node] / "operstate"
            deadline = time.monotonic() + 10.0
            while state.read_text().strip() != "up" and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.2)  # the bridge's forwarding state follows the carrier
            # While the link was down, a node that tried to reach another marked that neighbour FAILED; for
            # a few seconds more the kernel answers a new connection to it with "No route to host" (a job
            # resumed at once failed its MPI_Init so under load). Forget every neighbour: the next packet asks again.
            _ip("neigh", "flush", "dev", self.bridge, check=False)
            for ns in self.namespaces:
                _ip("neigh", "flush", "dev", "eth0", ns=ns, check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--ppn", type=int, default=1, help="ranks per node")
    parser.add_argument("--rate", default="10gbit", help="link bandwidth, tc units (default 10gbit)")
    parser.add_argument("--latency-us", type=float, default=0.0, help="added latency (netem, where the kernel has it)")
    parser.add_argument("--clean", action="store_true", help="remove leftovers of killed runs and exit")
    parser.add_argument("command", nargs="*", help="the command to run on every rank (after --)")
    args = parser.parse_args()
    if args.clean:
        print("\n".join(clean()) or "nothing to clean")
        return 0
    why = unavailable()
    if why:
        print(f"emunet: {why}", file=sys.stderr)
        return 2
    if not args.command:
        parser.error("give the command to run after --")
    if args.ppn < 1 or args.latency_us < 0:
        parser.error("--ppn must be >= 1 and --latency-us >= 0")
    try:
        fabric = Fabric(args.nodes, args.rate, args.latency_us)
    except ValueError as exc:
        parser.error(str(exc))
    with fabric:
        if args.latency_us and not fabric.latency_emulated:
            print("emunet: this kernel has no netem; links are shaped in rate only", file=sys.stderr)
        before = fabric.tx_bytes()
        rc = subprocess.run(fabric.mpiexec(args.ppn, args.command), env=fabric.env()).returncode
        sent = [a - b for a, b in zip(fabric.tx_bytes(), before)]
        print(f"emunet: bytes sent per node over the links: {sent}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
