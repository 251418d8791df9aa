"""torch.distributed's gloo backend started over an MPI job's ranks (the SGD benchmark's peer)."""

from __future__ import annotations

import os
import socket
from typing import Any

from hpcpar.runtime.interfaces import ipv4_interfaces

__all__ = ["torch_group"]


def torch_group(comm: Any) -> Any:
    """Start torch.distributed (gloo) over the job's ranks; ``None`` without torch.

    The rendezvous address and gloo's interface are chosen from the ranks' own IPv4
    interfaces: the loopback where every rank sees the same addresses (one host, one
    network namespace), else rank 0's address on
    the subnet the others share with it (so virtual nodes, whose host names resolve
    nowhere, work too).
    """
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if dist.is_initialized():
        return dist
    from datetime import timedelta

    from hpcpar.errors import UsageError

    mine = ipv4_interfaces()
    every = comm.allgather(mine)
    outside = {frozenset(ip for _, ip in addrs if not ip.startswith("127.")) for addrs in every}
    if len(outside) == 1:  # one host (one network namespace): its loopback
        address, interface = "127.0.0.1", _loopback(mine)
    else:
        theirs = [ip for addrs in every[1:] for _, ip in addrs if not ip.startswith("127.")]
        ours = [a for a in every[0] if not a[1].startswith("127.")]
        if not ours or not theirs:
            raise UsageError("bench sgd: the ranks' hosts have no IPv4 address for gloo")
        address = max(ours, key=lambda a: max(_common_bits(a[1], t) for t in theirs))[1]
        interface = max(mine, key=lambda a: _common_bits(a[1], address))[0]
    port = None
    if comm.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port, root=0)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = address, str(port)
    if interface:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
    if comm.Get_rank() == 0:
        print(
            f"# gloo: rendezvous at {address}:{port}, interface "
            f"{os.environ.get('GLOO_SOCKET_IFNAME', 'chosen by gloo')}",
            flush=True,
        )
    dist.init_process_group(
        "gloo", rank=comm.Get_rank(), world_size=comm.Get_size(), timeout=timedelta(seconds=120)
    )
    return dist


def _loopback(interfaces: list[tuple[str, str]]) -> str | None:
    return next((name for name, ip in interfaces if ip.startswith("127.")), None)


def _common_bits(a: str, b: str) -> int:
    x = int.from_bytes(socket.inet_aton(a), "big") ^ int.from_bytes(socket.inet_aton(b), "big")
    return 32 - x.bit_length()
