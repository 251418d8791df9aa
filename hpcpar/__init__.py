"""hpcpar: topology-aware collectives, derived datatypes and checkpointing on mpi4py.

This module defines the public API. Names that need MPI are imported on first use, so
``import hpcpar`` never initialises MPI by itself (the launcher relies on that: it must
not become an MPI process before it starts ``mpiexec``).
"""

from __future__ import annotations

import importlib
from typing import Any

from ._version import __version__ as __version__
from .errors import CommunicatorError as CommunicatorError
from .errors import HpcparError as HpcparError
from .errors import LaunchError as LaunchError
from .errors import LayoutError as LayoutError
from .errors import UsageError as UsageError

# The public API: name -> the module that defines it, imported on first access (None:
# imported above). ``__all__`` and the lazy imports are both made from this one list.
_PUBLIC: dict[str, str | None] = {
    "__version__": None,
    "HpcparError": None,
    "UsageError": None,
    "LayoutError": None,
    "LaunchError": None,
    "CommunicatorError": None,
    "Hierarchy": "hpcpar.topology",
    "default_comm": "hpcpar.runtime.comm",
    **dict.fromkeys(
        (
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
        ),
        "hpcpar.collectives",
    ),
    "explain": "hpcpar.collectives.cost.explain",
    "Compression": "hpcpar.collectives.compression",
    "ErrorFeedback": "hpcpar.feedback",
    "PowerSGD": "hpcpar.powersgd",
    **dict.fromkeys(
        ("send", "recv", "isend", "irecv", "sendrecv", "send_init", "recv_init"), "hpcpar.p2p"
    ),
    "HaloExchange": "hpcpar.halo",
}

__all__ = list(_PUBLIC)

# Subpackages reachable as attributes (``hpcpar.collectives``) without an explicit import.
_SUBPACKAGES = (
    "collectives",
    "datatypes",
    "topology",
    "layout",
    "testing",
    "runtime",
    "bench",
    "checkpoint",
    "plugins",
)


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"hpcpar.{name}")
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'hpcpar' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
