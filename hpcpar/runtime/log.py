"""Rank-aware logging: rank 0 at INFO, the others at WARNING, every line ``[rank/size]``."""

from __future__ import annotations

import logging
import sys

from . import settings

__all__ = ["get_logger"]

_configured = False


class _RankFilter(logging.Filter):
    """Adds the rank prefix (looked up per record: MPI may start after the logger)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from .comm import world_rank_size

        rank, size = world_rank_size()
        record.rankinfo = f"[{rank}/{size}]"
        return True


def _level_for_rank() -> int:
    from .env import launcher_rank_size

    override = settings.value("HPCPAR_LOG_LEVEL")
    if override:
        return logging.getLevelName(override.upper()) if not override.isdigit() else int(override)
    rank, _ = launcher_rank_size()
    return logging.INFO if rank == 0 else logging.WARNING


def get_logger(name: str = "hpcpar") -> logging.Logger:
    """Return a logger under ``hpcpar``, configuring the package logger once.

    ``HPCPAR_LOG_LEVEL`` (a level name or number) overrides the per-rank default.
    """
    global _configured
    root = logging.getLogger("hpcpar")
    if not _configured:
        handler = logging.StreamHandler(sys.stderr)
        handler.addFilter(_RankFilter())
        handler.setFormatter(logging.Formatter("%(rankinfo)s %(name)s: %(levelname)s: %(message)s"))
        root.addHandler(handler)
        root.setLevel(_level_for_rank())
        root.propagate = False
        _configured = True
    return logging.getLogger(name) if name.startswith("hpcpar") else root.getChild(name)
