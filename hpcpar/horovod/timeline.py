"""Horovod's timeline: a Chrome-trace file of the collectives, drawn from the flight record.

``HOROVOD_TIMELINE=FILE`` (set before the job starts: every call is then its own entry
of each rank's flight record, as with ``HPCPAR_TRACE``) or ``start_timeline(FILE)``;
``stop_timeline()`` or ``shutdown()`` gathers every rank's entries since the start to
rank 0, which writes them as ``hpcpar trace --chrome`` does: a process per rank, a
thread per communicator, one event per call named by its operation and algorithm.
Without the variable at start, the record keeps the last 512 entries and merges runs
of identical small calls, so the timeline shows those.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

__all__ = ["start", "stop", "start_from_env"]

_ACTIVE: dict[str, Any] = {}


def start(file_path: str) -> None:
    """Record the collectives from now on for ``file_path`` (written by rank 0)."""
    if not isinstance(file_path, str) or not file_path:
        raise ValueError(f"start_timeline needs a file path, not {file_path!r}")
    _ACTIVE.update(path=file_path, since=time.time())


def start_from_env() -> None:
    """``start_timeline(HOROVOD_TIMELINE)`` when the variable names a file."""
    path = os.environ.get("HOROVOD_TIMELINE", "").strip()
    if path and path != "DYNAMIC":
        start(path)


def stop(comm: Any) -> None:
    """Gather every rank of ``comm``'s calls since ``start``; rank 0 writes the file."""
    from ..runtime import flight, trace

    if not _ACTIVE:
        return
    since = _ACTIVE["since"]
    path = _ACTIVE.pop("path")
    _ACTIVE.clear()
    mine = [e for e in flight.snapshot() if e["start"] is not None and e["start"] >= since]
    every = comm.gather(mine, root=0)
    if comm.Get_rank() == 0:
        events = trace.chrome_trace(dict(enumerate(every)))
        partial = f"{path}.tmp{os.getpid()}"
        with open(partial, "w") as f:
            json.dump(events, f)
        os.replace(partial, path)
