"""The collectives' names, importable without MPI (the command line needs them early)."""

from __future__ import annotations

__all__ = ["COLLECTIVES"]

COLLECTIVES = (
    "allreduce",
    "reduce",
    "bcast",
    "allgather",
    "reduce_scatter",
    "alltoall",
    "alltoallv",
    "barrier",
)
