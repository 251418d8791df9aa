"""The memory level: the newest snapshot kept in the process, restored without any I/O."""

from __future__ import annotations

from .base import Level

__all__ = ["MemoryLevel"]


class MemoryLevel(Level):
    """The snapshot ``save()`` takes, kept by the manager until the next one.

    Restores within the same run (a rollback after a detected error) need no file. It
    holds no files, so the manager keeps the snapshot itself; this class describes it.
    """

    name = "memory"
    survives = "an error the job itself detects (a rollback in the same run)"
    default_keep = 1
    in_memory = True


LEVEL = MemoryLevel  # what levels/__init__.py registers
