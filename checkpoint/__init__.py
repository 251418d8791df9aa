"""hpcpar.checkpoint: asynchronous multi-level checkpointing (installed from checkpoint/).

Levels, fastest first: ``memory`` (a snapshot copy), ``local`` (files per node),
``partner`` (a copy on the next node), ``xor`` (parity across nodes), ``hdf5`` (the
parallel file system). ``hpcpar.checkpoint.faults`` injects crashes and damage.
"""

from __future__ import annotations

from .levels import LEVELS
from .manager import Checkpointer, SaveHandle
from .policy import young_daly_interval
from .state import CheckpointError, Replicated, Sharded

__all__ = [
    "Checkpointer",
    "SaveHandle",
    "CheckpointError",
    "Sharded",
    "Replicated",
    "LEVELS",
    "young_daly_interval",
]
