"""Looking at a checkpoint directory without the job: versions, shards, checksums."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from .shard import read_shard
from .state import CheckpointError

__all__ = ["scan", "verify"]

_SHARD = re.compile(r"^node(\d+)/v(\d{12})/rank(\d+)$")


def scan(root: Path) -> dict[str, Any]:
    """The job's rank count, committed versions, and every shard found, per version and rank.

    Raises:
        CheckpointError: not an hpcpar checkpoint directory.
    """
    job = root / "hpcpar-checkpoint.json"
    try:
        doc = json.loads(job.read_text())
    except (OSError, ValueError):
        raise CheckpointError(
            f"{root} is not an hpcpar checkpoint (no readable {job.name})"
        ) from None
    local = root / "local"
    committed = (
        sorted((int(p.name[1:13]) for p in local.glob("v*.committed")), reverse=True)
        if local.is_dir()
        else []
    )
    shards: dict[int, dict[int, Path]] = {}
    if local.is_dir():
        for path in local.glob("node*/v*/rank*"):
            match = _SHARD.match(path.relative_to(local).as_posix())
            if match and path.is_dir():
                shards.setdefault(int(match.group(2)), {})[int(match.group(3))] = path
    return {"ranks": doc.get("ranks"), "committed": committed, "shards": shards}


def verify(root: Path) -> list[tuple[int, int, str]]:
    """Check every shard of every committed version: ``(step, rank, problem or "")``."""
    info = scan(root)
    out = []
    for step in info["committed"]:
        for rank in range(int(info["ranks"] or 0)):
            path = info["shards"].get(step, {}).get(rank)
            if path is None:
                out.append((step, rank, "shard missing"))
                continue
            try:
                read_shard(path, step, rank)
                out.append((step, rank, ""))
            except CheckpointError as exc:
                out.append((step, rank, str(exc)))
    return out
