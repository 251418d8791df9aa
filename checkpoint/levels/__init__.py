"""Checkpoint levels: where a version's shards are kept, fastest first; one module each.

Each module defines one ``Level`` subclass that describes itself (``base.Level``);
``BUILTIN`` lists the modules in restore order (fastest first). Adding a level is one
module and its name here, or ``register`` from anywhere else.
"""

from __future__ import annotations

import importlib

from ..state import CheckpointError
from .base import Job, Level

__all__ = ["Job", "Level", "LEVELS", "BUILTIN", "register", "level_class", "file_levels"]

BUILTIN = ("memory", "local", "partner", "xor", "hdf5")  # restore order: fastest first

LEVELS: dict[str, type[Level]] = {}  # name -> class, in restore order


def register(cls: type[Level], before: str | None = None) -> type[Level]:
    """Add a level class (restored after the others, or just before the level ``before``)."""
    if before is None or before not in LEVELS:
        LEVELS[cls.name] = cls
        return cls
    items = list(LEVELS.items())
    at = [name for name, _ in items].index(before)
    items.insert(at, (cls.name, cls))
    LEVELS.clear()
    LEVELS.update(items)
    return cls


def level_class(name: str) -> type[Level]:
    """The class of the level called ``name``.

    Raises:
        CheckpointError: no such level (the known ones are listed).
    """
    cls = LEVELS.get(name)
    if cls is None:
        raise CheckpointError(f"unknown level {name!r}; choose from {', '.join(LEVELS)}")
    return cls


def file_levels() -> list[str]:
    """The levels that keep files, in restore order."""
    return [name for name, cls in LEVELS.items() if not cls.in_memory]


for _name in BUILTIN:
    register(importlib.import_module(f"{__name__}.{_name}").LEVEL)
