"""Virtual nodes as network namespaces with their own host names, joined by a shaped bridge.

``up`` makes N namespaces ``hpv-node0..N-1``, each with one veth link to a bridge in the
host namespace (address .1 of the subnet, which MPI's launcher listens on), shapes each
node's outgoing link with ``tc netem`` (latency and rate), and writes a launcher wrapper
that starts a command inside node i's namespace under a fresh UTS namespace whose host
name is ``vnodeI``. MPICH's ``mpiexec -launcher ssh -launcher-exec <wrapper>`` then runs
ranks there: shared memory inside a virtual node, TCP between them. Only the subnet's
addresses inside namespaces made here are used; ``down`` removes everything, and a
failed ``up`` cleans up after itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import HpcparError
from ..runtime import settings

__all__ = [
    "cluster",
    "network_env",
    "ClusterSpec",
    "VClusterError",
    "cluster_up",
    "cluster_down",
    "cluster_status",
    "plan_run",
    "parse_link",
    "STATE_DIR",
]

STATE_DIR = Path(settings.value("HPCPAR_VCLUSTER_DIR"))
PREFIX = "hpv"
BRIDGE = f"{PREFIX}br0"
MAX_NODES = 64

_WRAPPER = """#!/bin/sh
# hpcpar vcluster: ssh-style launcher for mpiexec ([options] host command...)
while [ "${1#-}" != "$1" ]; do shift; done
host="$1"; shift
case "$host" in vnode[0-9]*) ;; *) echo "hpcpar vcluster: unknown host $host" >&2; exit 255;; esac
exec ip netns exec "%(prefix)s-node${host#vnode}" \\
    unshare --uts sh -c 'hostname "$0"; exec sh -c "$*"' "$host" "$@"
"""


class VClusterError(HpcparError):
    """The virtual cluster cannot be made, used or removed."""


@dataclass(frozen=True)
class ClusterSpec:
    """A virtual cluster: how many nodes, how their links are shaped, which subnet."""

    nodes: int
    link: str | None = None
    subnet: str = "10.213.7"

    @property
    def bridge_address(self) -> str:
        """The host side of the bridge, where mpiexec's proxies call back."""
        return f"{self.subnet}.1"

    def node_address(self, i: int) -> str:
        """Node i's address."""
        return f"{self.subnet}.{i + 2}"


_LATENCY = r"[0-9.]+(?:us|ms|s|ns)"
_RATE = r"[0-9.]+(?:bit|kbit|mbit|gbit|tbit)"


def parse_link(text: str, netem: bool = True) -> list[str]:
    """``"20us,10gbit"`` -> the tc qdisc that shapes a link that way.

    With netem: ``netem delay 20us rate 10gbit``. Kernels without netem get a token
    bucket (``tbf``) for the rate only; the latency is then the link's own.

    Raises:
        VClusterError: not latency,rate with tc's units.
    """
    parts = [p.strip().lower() for p in text.split(",")]
    if len(parts) != 2 or not re.fullmatch(_LATENCY, parts[0]) or not re.fullmatch(_RATE, parts[1]):
        raise VClusterError(f"bad --link {text!r}: expected latency,rate such as 20us,10gbit")
    if netem:
        return ["netem", "delay", parts[0], "rate", parts[1]]
    return ["tbf", "rate", parts[1], "burst", "256kb", "latency", "50ms"]


def netem_available() -> bool:
    """Whether this kernel has the netem qdisc (probed on a throwaway veth pair)."""
    probe = f"{PREFIX}probe{os.getpid() % 10000}"
    made = subprocess.run(
        ["ip", "link", "add", probe, "type", "veth", "peer", "name", probe + "b"],
        capture_output=True,
        check=False,
    )
    if made.returncode != 0:
        return False
    try:
        added = subprocess.run(
            ["tc", "qdisc", "add", "dev", probe, "root", "netem", "delay", "1us"],
            capture_output=True,
            check=False,
        )
        return added.returncode == 0
    finally:
        subprocess.run(["ip", "link", "del", probe], capture_output=True, check=False)


def _setup_commands(spec: ClusterSpec, netem: bool = True) -> list[list[str]]:
    cmds = [
        ["ip", "link", "add", BRIDGE, "type", "bridge"],
        ["ip", "addr", "add", f"{spec.bridge_address}/24", "dev", BRIDGE],
        ["ip", "link", "set", BRIDGE, "up"],
    ]
    shaping = parse_link(spec.link, netem) if spec.link else None
    for i in range(spec.nodes):
        ns, outer, inner = f"{PREFIX}-node{i}", f"{PREFIX}{i}a", f"{PREFIX}{i}b"
        cmds += [
            ["ip", "netns", "add", ns],
            ["ip", "link", "add", outer, "type", "veth", "peer", "name", inner],
            ["ip", "link", "set", outer, "master", BRIDGE, "up"],
            ["ip", "link", "set", inner, "netns", ns],
            ["ip", "-n", ns, "link", "set", inner, "name", "eth0"],
            ["ip", "-n", ns, "addr", "add", f"{spec.node_address(i)}/24", "dev", "eth0"],
            ["ip", "-n", ns, "link", "set", "eth0", "up"],
            ["ip", "-n", ns, "link", "set", "lo", "up"],
        ]
        if shaping:
            cmds.append(
                ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", *shaping]
            )
    return cmds


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise VClusterError(
            f"'{' '.join(cmd)}' failed: {detail[0] if detail else f'exit {proc.returncode}'}"
        )


def _state_file() -> Path:
    return STATE_DIR / "state.json"


def cluster_status() -> ClusterSpec | None:
    """The cluster that is up, or None."""
    try:
        doc = json.loads(_state_file().read_text())
    except (OSError, ValueError):
        return None
    return ClusterSpec(int(doc["nodes"]), doc.get("link"), doc.get("subnet", "10.213.7"))


def wrapper_path() -> Path:
    """The launcher wrapper mpiexec runs instead of ssh."""
    return STATE_DIR / "netns-exec"


def cluster_up(spec: ClusterSpec) -> list[str]:
    """Create the namespaces, links and wrapper; on any failure remove what was made.

    Returns:
        Warnings (a latency that this kernel cannot emulate).

    Raises:
        VClusterError: bad spec, already up, no privileges, or a failing command.
    """
    if not 1 <= spec.nodes <= MAX_NODES:
        raise VClusterError(f"--nodes must be 1..{MAX_NODES}, not {spec.nodes}")
    if not re.fullmatch(r"10\.\d{1,3}\.\d{1,3}", spec.subnet):
        raise VClusterError(
            f"bad --subnet {spec.subnet!r}: expected the first three octets of a 10.x.y.0/24"
        )
    if spec.link:
        parse_link(spec.link)
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            raise VClusterError(f"vcluster needs '{tool}' (Debian: iproute2, util-linux)")
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        raise VClusterError("vcluster needs root (network namespaces, veth links and tc)")
    if cluster_status() is not None:
        raise VClusterError("a virtual cluster is already up; run 'hpcpar vcluster down' first")
    warnings = []
    netem = netem_available() if spec.link else True
    if not netem:
        warnings.append(
            "this kernel has no netem qdisc: links are rate-limited with tbf, latency not added"
        )
    try:
        for cmd in _setup_commands(spec, netem):
            _run(cmd)
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        wrapper_path().write_text(_WRAPPER % {"prefix": PREFIX})
        wrapper_path().chmod(0o755)
        _state_file().write_text(json.dumps({**asdict(spec), "netem": netem}))
    except BaseException:
        cluster_down()
        raise
    return warnings


def cluster_down() -> list[str]:
    """Remove every namespace, link and file the virtual cluster made (idempotent).

    Returns:
        What was removed.
    """
    removed = []
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    for line in listing.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(f"{PREFIX}-node"):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
            removed.append(name)
    links = subprocess.run(
        ["ip", "-o", "link", "show"], capture_output=True, text=True, check=False
    )
    for line in links.stdout.splitlines():
        fields = line.split(":")
        name = fields[1].strip().split("@")[0] if len(fields) > 1 else ""
        if re.fullmatch(rf"{PREFIX}\d+a|{BRIDGE}|{PREFIX}probe\d+", name):
            subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)
            removed.append(name)
    for path in (_state_file(), wrapper_path()):
        path.unlink(missing_ok=True)
    return removed


def network_env(environ: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """Make MPICH cross virtual nodes over TCP (through the shaped links).

    The namespaces share one kernel, so MPICH's default UCX transports (and libfabric's
    shm provider) would carry "inter-node" messages through shared memory and bypass the
    links. Variables the user already set are left alone.
    """
    wanted = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}
    return {k: v for k, v in wanted.items() if k not in environ}


def plan_run(
    spec: ClusterSpec, ppn: int, rank_argv: list[str], mpiexec: str, cyclic: bool = False
) -> list[str]:
    """The mpiexec command line that runs ``rank_argv`` on every virtual node.

    Ranks fill the nodes in blocks of ``ppn`` (ranks 0..ppn-1 on vnode0), or with
    ``cyclic`` are dealt one per node in turn (rank r on node r mod N), as Slurm's
    ``--distribution=cyclic`` and Open MPI's ``--map-by node`` place them.
    """
    hosts = ",".join(f"vnode{i}:{1 if cyclic else ppn}" for i in range(spec.nodes))
    return [
        mpiexec,
        "-launcher",
        "ssh",
        "-launcher-exec",
        str(wrapper_path()),
        "-localhost",
        spec.bridge_address,
        "-hosts",
        hosts,
        "-n",
        str(spec.nodes * ppn),
        *rank_argv,
    ]


@contextlib.contextmanager
def cluster(spec: ClusterSpec, who: str) -> Iterator[list[str]]:
    """A virtual cluster of ``spec``'s shape for the ``with`` block (warnings as value).

    One already up with the same nodes and link is used and left up; none is brought up
    here and always taken down after, also when the block fails.

    Raises:
        VClusterError: another shape is up (both named), or ``up`` failed.
    """
    have = cluster_status()
    if have is not None:
        if (have.nodes, have.link) != (spec.nodes, spec.link):
            raise VClusterError(
                f"{who}: a virtual cluster of {have.nodes} node(s), links "
                f"{have.link or 'unshaped'}, is up; this asks for {spec.nodes}, "
                f"{spec.link or 'unshaped'}: run 'hpcpar vcluster down' first"
            )
        yield []
        return
    warnings = cluster_up(spec)
    try:
        yield warnings
    finally:
        cluster_down()
