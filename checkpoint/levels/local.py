"""The local level: each rank's shard in its node's directory; survives a process crash."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..shard import EncodedShard, read_file
from ..state import CheckpointError
from .base import Level

__all__ = ["LocalLevel"]


class LocalLevel(Level):
    """``local_dir/node<N>/local/v<step>/rank<R>.shard``."""

    name = "local"
    survives = "a crash of the process (the node's storage survives)"

    def write(
        self, step: int, shard: EncodedShard, flat: dict[str, Any], written: dict[str, Path]
    ) -> str:
        """Write this rank's shard."""
        try:
            self.write_shard(self.own_path(step), shard)
        except OSError as exc:
            return f"rank {self.job.rank}: {exc.strerror or exc}"
        written[self.name] = self.own_path(step)
        return ""

    def recover(self, step: int, need: bool) -> tuple[dict[str, Any] | None, str]:
        """Read this rank's own shard (no communication)."""
        if not need:
            return None, ""
        try:
            return read_file(self.own_path(step), step, self.job.rank), ""
        except CheckpointError as exc:
            return None, str(exc)


LEVEL = LocalLevel  # what levels/__init__.py registers
