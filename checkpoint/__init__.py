"""hpcpar.checkpoint: asynchronous multi-level checkpointing (installed from checkpoint/).

Levels so far: ``memory`` (a snapshot copy) and ``local`` (files per node, checksummed,
committed atomically). Partner copies, XOR parity, HDF5 and the fault-injection harness
are the rest of the checkpointing issue.
"""

from __future__ import annotations

from .manager import LEVELS, Checkpointer, SaveHandle
from .state import CheckpointError

__all__ = ["Checkpointer", "SaveHandle", "CheckpointError", "LEVELS"]
