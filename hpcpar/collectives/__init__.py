"""Hierarchical collectives: every collective with flat, classic and topology-aware algorithms.

``hpcpar.allreduce`` and friends are re-exported at the top level; this package also
exposes the counters (``last_stats``), the algorithm tables and the request type.
"""

from __future__ import annotations

from .algorithms import ALGORITHMS, COLLECTIVES
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
from .errors import CollectiveError, CollectiveMismatchError
from .ops import OpError
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


def algorithms_for(collective: str) -> list[str]:
    """Names accepted by ``algorithm=`` for ``collective`` (besides ``"auto"``)."""
    if collective not in ALGORITHMS:
        raise CollectiveError(
            f"unknown collective {collective!r}; choose one of {', '.join(COLLECTIVES)}"
        )
    return list(ALGORITHMS[collective])
