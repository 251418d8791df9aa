"""Names the command line needs before MPI starts (no mpi4py import here)."""

from __future__ import annotations

__all__ = ["PARTITIONS"]

PARTITIONS = ("1d-vertex", "1d-edge", "2d", "hier")
