"""Checkpoint levels: where a version's shards are kept."""

from __future__ import annotations

from .base import Level
from .local import LocalLevel

__all__ = ["Level", "LocalLevel"]
