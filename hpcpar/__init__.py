"""hpcpar: topology-aware collectives, derived datatypes and checkpointing on mpi4py.

This module defines the public API. Names that need MPI are imported on first use, so
``import hpcpar`` never initialises MPI by itself (the launcher relies on that: it must
not become an MPI process before it starts ``mpiexec``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import CommunicatorError, HpcparError, LaunchError, LayoutError, UsageError

if TYPE_CHECKING:
    from .collectives import (
        allgather,
        allreduce,
        alltoall,
        alltoallv,
        barrier,
        bcast,
        iallgather,
        iallreduce,
        ialltoall,
        ialltoallv,
        ibarrier,
        ibcast,
        ireduce,
        ireduce_scatter,
        reduce,
        reduce_scatter,
    )
    from .collectives.cost.explain import explain
    from .halo import HaloExchange
    from .p2p import irecv, isend, recv, recv_init, send, send_init, sendrecv
    from .runtime.comm import default_comm
    from .topology import Hierarchy


__all__ = [
    "__version__",
    "HpcparError",
    "UsageError",
    "LayoutError",
    "LaunchError",
    "CommunicatorError",
    "Hierarchy",
    "default_comm",
    "allreduce",
    "reduce",
    "bcast",
    "allgather",
    "reduce_scatter",
    "alltoall",
    "alltoallv",
    "barrier",
    "iallreduce",
    "ireduce",
    "ibcast",
    "iallgather",
    "ireduce_scatter",
    "ialltoall",
    "ialltoallv",
    "ibarrier",
    "allreduce_init",
    "explain",
    "send",
    "recv",
    "isend",
    "irecv",
    "sendrecv",
    "send_init",
    "recv_init",
    "HaloExchange",
]

# Subpackages reachable as attributes (``hpcpar.collectives``) without an explicit import.
_SUBPACKAGES = (
    "collectives",
    "topology",
    "layout",
    "testing",
    "runtime",
    "bench",
    "checkpoint",
    "plugins",
)

# Public name -> module that defines it; resolved by __getattr__ on first access.
_LAZY = {
    "Hierarchy": "hpcpar.topology",
    "default_comm": "hpcpar.runtime.comm",
    "explain": "hpcpar.collectives.cost.explain",
    "HaloExchange": "hpcpar.halo",
    **dict.fromkeys(
        ("send", "recv", "isend", "irecv", "sendrecv", "send_init", "recv_init"), "hpcpar.p2p"
    ),
    **dict.fromkeys(
        (
            "allreduce", "reduce", "bcast", "allgather", "reduce_scatter", "alltoall", "alltoallv",
            "barrier", "iallreduce", "ireduce", "ibcast", "iallgather", "ireduce_scatter",
            "ialltoall", "ialltoallv", "ibarrier", "allreduce_init",
        ),
        "hpcpar.collectives",
    ),
}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"hpcpar.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hpcpar' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
