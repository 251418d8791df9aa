"""The local level: files in a per-node directory (``/dev/shm`` works); survives a crash."""

from __future__ import annotations

import contextlib
import re
import shutil
from pathlib import Path
from typing import Any

from .base import Level

__all__ = ["LocalLevel"]

_VERSION = re.compile(r"^v(\d{12})\.committed$")


class LocalLevel(Level):
    """``root/node<N>/v<step>/rank<R>/``; the commit marker sits in ``root/``.

    Args:
        root: The level's directory (shared by the ranks of a node, or by all).
        node: This rank's node index (one subdirectory per node, so losing one node's
            storage loses only that node's shards).
    """

    name = "local"

    def __init__(self, root: Path, node: int) -> None:
        self.root = Path(root)
        self.node = node

    def shard_dir(self, step: int, rank: int) -> Path:
        """``root/node<N>/v<step>/rank<R>``."""
        return self.root / f"node{self.node}" / f"v{step:012d}" / f"rank{rank}"

    def commit_marker(self, step: int) -> Path:
        """``root/v<step>.committed``."""
        return self.root / f"v{step:012d}.committed"

    def committed(self) -> list[int]:
        """Versions with a commit marker, newest first."""
        if not self.root.is_dir():
            return []
        steps = [int(m.group(1)) for p in self.root.iterdir() if (m := _VERSION.match(p.name))]
        return sorted(steps, reverse=True)

    def remove(self, step: int, rank: int) -> None:
        """Delete this rank's shard of a version."""
        shutil.rmtree(self.shard_dir(step, rank), ignore_errors=True)
        # the node's ranks race to remove the version directory: the last one wins
        with contextlib.suppress(OSError):
            self.shard_dir(step, rank).parent.rmdir()

    def describe(self) -> dict[str, Any]:
        """The level and its root."""
        return {"level": self.name, "root": str(self.root)}
