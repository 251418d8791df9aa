"""Hierarchical collectives: every collective with flat, classic and topology-aware algorithms.

``hpcpar.allreduce`` and friends are re-exported at the top level; this package also
exposes the counters (``last_stats``), the algorithm table and ``register`` (a new
algorithm: ``algorithms/``), and the request type. Like
``hpcpar`` itself it imports its MPI-using modules on first use, so light modules such
as ``hpcpar.collectives.names`` can be imported before MPI starts.
"""

from __future__ import annotations

import importlib
from typing import Any

from .names import COLLECTIVES

# The public names: name -> the module that defines it, imported on first access (None:
# defined or imported here). ``__all__`` and the lazy imports are made from this list.
_PUBLIC: dict[str, str | None] = {
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
            "last_stats",
        ),
        ".api",
    ),
    "allreduce_init": ".persistent",
    "PersistentAllreduce": ".persistent",
    "explain": ".cost.explain",
    "algorithms_for": None,
    "COLLECTIVES": None,
    "ALGORITHMS": ".algorithms",
    "Algorithm": ".registry",
    "register": ".registry",
    "CollectiveStats": ".channel",
    "CollectiveRequest": ".schedule",
    "PendingRequestWarning": ".schedule",
    "CollectiveError": ".errors",
    "CollectiveMismatchError": ".errors",
    "OpError": ".ops",
}

__all__ = list(_PUBLIC)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'hpcpar.collectives' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def algorithms_for(collective: str) -> list[str]:
    """Names accepted by ``algorithm=`` for ``collective`` (besides ``"auto"``)."""
    from .algorithms import ALGORITHMS
    from .errors import CollectiveError

    if collective not in ALGORITHMS:
        raise CollectiveError(
            f"unknown collective {collective!r}; choose one of {', '.join(COLLECTIVES)}"
        )
    return list(ALGORITHMS[collective])
