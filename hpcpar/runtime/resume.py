"""Which start of a job this process is, and the checkpoint it resumed from.

``hpcpar launch --restarts`` sets ``HPCPAR_RESTART`` (0 at the first start) and
``HPCPAR_RESTART_FAILED`` (the ranks whose failure ended the start before);
``Checkpointer.restore`` notes the version it restored. Results files and traces carry
all three.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import settings

__all__ = ["note_resumed", "resumed", "this_start"]

# the version this process's program resumed from: {"step": N, "levels": [...]}
_resumed: dict[str, Any] | None = None


def note_resumed(step: int, levels: Sequence[str]) -> None:
    """Record the checkpoint this run resumed from (``Checkpointer.restore`` calls it)."""
    global _resumed
    _resumed = {"step": int(step), "levels": sorted(set(levels))}


def resumed() -> dict[str, Any] | None:
    """The checkpoint this run resumed from (``note_resumed``), or None."""
    return _resumed


def this_start() -> dict[str, Any]:
    """``restart`` (0: the first start), ``restart_failed`` and ``resumed_from``."""
    return {
        "restart": settings.value("HPCPAR_RESTART"),
        "restart_failed": settings.value("HPCPAR_RESTART_FAILED"),
        "resumed_from": _resumed,
    }
