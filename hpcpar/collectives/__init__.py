"""Hierarchical collectives: every collective with flat, classic and topology-aware algorithms.

``hpcpar.allreduce`` and friends are re-exported at the top level; this package also
exposes the counters (``last_stats``), the algorithm tables and the request type. Like
``hpcpar`` itself it imports its MPI-using modules on first use, so light modules such
as ``hpcpar.collectives.names`` can be imported before MPI starts.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .names import COLLECTIVES

if TYPE_CHECKING:
    from .algorithms import ALGORITHMS
    from .api import (
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
        last_stats,
        reduce,
        reduce_scatter,
    )
    from .channel import CollectiveStats
    from .cost.explain import explain
    from .errors import CollectiveError, CollectiveMismatchError
    from .ops import OpError
    from .persistent import PersistentAllreduce, allreduce_init
    from .schedule import CollectiveRequest, PendingRequestWarning

__all__ = [
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
    "allreduce_init",
    "PersistentAllreduce",
    "explain",
    "algorithms_for",
    "COLLECTIVES",
    "ALGORITHMS",
    "CollectiveStats",
    "CollectiveRequest",
    "PendingRequestWarning",
    "CollectiveError",
    "CollectiveMismatchError",
    "OpError",
]

_LAZY = {
    **dict.fromkeys(__all__[:17], ".api"),
    "allreduce_init": ".persistent",
    "PersistentAllreduce": ".persistent",
    "explain": ".cost.explain",
    "ALGORITHMS": ".algorithms",
    "CollectiveStats": ".channel",
    "CollectiveRequest": ".schedule",
    "PendingRequestWarning": ".schedule",
    "CollectiveError": ".errors",
    "CollectiveMismatchError": ".errors",
    "OpError": ".ops",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
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
