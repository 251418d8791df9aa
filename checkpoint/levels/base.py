"""The interface every checkpoint level implements."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["Level"]


class Level:
    """One place versions are kept (a directory tree for file levels).

    A level writes a rank's shard of a version into a temporary directory, renames it
    into place, and after every rank has succeeded writes the version's commit marker.
    Only committed versions are ever restored.
    """

    name = "level"

    def shard_dir(self, step: int, rank: int) -> Path:
        """Where rank's shard of version ``step`` lives."""
        raise NotImplementedError

    def commit_marker(self, step: int) -> Path:
        """The file whose presence commits version ``step``."""
        raise NotImplementedError

    def committed(self) -> list[int]:
        """Committed versions, newest first."""
        raise NotImplementedError

    def remove(self, step: int, rank: int) -> None:
        """Delete rank's shard of a version (and the marker, on the marker's writer)."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """What the level is, for manifests and ``hpcpar checkpoint ls``."""
        return {"level": self.name}
