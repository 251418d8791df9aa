"""A checkpoint directory's bookkeeping: its lock, its description file, its commit markers.

Rank 0 does the bookkeeping; ``Directory.on_root`` hands its result, or its error, to
every rank, so no rank waits for one that gave up.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .levels import LEVELS
from .lock import DirectoryLock
from .naming import marker_name, parse_marker
from .shard import write_atomic
from .state import CheckpointError

__all__ = ["Directory", "unmark", "every_committed"]

_JOB_FILE = "hpcpar-checkpoint.json"


class Directory:
    """The root directory of a checkpoint, as the ranks of ``comm`` share it."""

    def __init__(self, comm: Any, root: Path) -> None:
        self.comm, self.root = comm, root
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self._lock: DirectoryLock | None = None

    def agree(self, build: Any) -> Any:
        """Build on every rank; if it fails on any, raise the first error everywhere."""
        try:
            out, problem = build(), ""
        except CheckpointError as exc:
            out, problem = None, str(exc)
        problems = [p for p in self.comm.allgather(problem) if p]
        if problems:
            raise CheckpointError(problems[0])
        return out

    def on_root(self, work: Any, comm: Any = None) -> Any:
        """Run ``work()`` on rank 0 and hand its result to every rank (collective).

        Raises:
            CheckpointError: on every rank, if it failed on rank 0 (an OSError or a
                CheckpointError), so no rank waits for one that gave up.
        """
        comm = comm or self.comm
        result, problem = None, ""
        if self.rank == 0:
            try:
                result = work()
            except (OSError, CheckpointError) as exc:
                problem = str(exc) if isinstance(exc, CheckpointError) else os_problem(exc)
        result, problem = comm.bcast((result, problem), root=0)
        if problem:
            raise CheckpointError(problem)
        return result

    def open(self, overwrite: bool) -> int:
        """Lock the directory, check or write its description; return its newest version.

        Raises:
            CheckpointError: on every rank (see the constructor).
        """

        def open_on_root() -> int:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                self._lock = DirectoryLock(self.root)
                job = self.root / _JOB_FILE
                doc = json.loads(job.read_text()) if job.exists() else None
            except (OSError, ValueError, RecursionError) as exc:
                raise CheckpointError(
                    f"cannot use checkpoint directory {self.root}: {exc}"
                ) from None
            if (doc is not None and not overwrite) and (
                not isinstance(doc, dict) or doc.get("format") != "hpcpar-checkpoint"
            ):
                raise CheckpointError(
                    f"{self.root} holds something that is not an hpcpar checkpoint"
                )
            if doc != {"format": "hpcpar-checkpoint", "ranks": self.size}:
                write_atomic(job, json.dumps({"format": "hpcpar-checkpoint", "ranks": self.size}))
            return -1 if overwrite else max(every_committed(self.root), default=-1)

        return int(self.on_root(open_on_root))

    def saved_by(self, step: int) -> tuple[int, list[str]]:
        """Rank 0: how many ranks saved version ``step``, and the file levels that committed it.

        A resharding restore reads any of them, in use here or not.
        """
        ranks, names = self.size, []
        for name, cls in LEVELS.items():
            if cls.in_memory:
                continue
            try:
                doc = json.loads((self.root / "commits" / name / marker_name(step)).read_text())
            except (OSError, ValueError, RecursionError):
                continue
            names.append(name)
            found = doc.get("ranks") if isinstance(doc, dict) else None
            if isinstance(found, int) and not isinstance(found, bool) and found >= 1:
                ranks = found
        return ranks, names

    def release(self) -> None:
        """Give up the directory's lock."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def unmark_above(self, step: int) -> dict[int, int]:
        """Remove the commit markers of every version newer than ``step`` (collective).

        Returns:
            Each removed version and how many ranks saved it.
        """

        def on_root() -> dict[int, int]:
            gone: dict[int, int] = {}
            for folder in (self.root / "commits").glob("*"):
                for marker in folder.glob("v*.committed"):
                    found = parse_marker(marker.name)
                    if found is not None and found > step:
                        ranks = unmark(marker, self.size)
                        gone[found] = ranks if ranks != self.size else gone.get(found, ranks)
            return gone

        return self.on_root(on_root)


def unmark(marker: Path, size: int) -> int:
    """Remove a commit marker; how many ranks saved its version (``size`` if unreadable).

    Raises:
        OSError: the marker could not be removed.
    """
    try:
        doc = json.loads(marker.read_text())
        ranks = doc.get("ranks", size) if isinstance(doc, dict) else size
    except (OSError, ValueError, RecursionError):
        ranks = size
    marker.unlink(missing_ok=True)
    return ranks if isinstance(ranks, int) else size


def os_problem(exc: OSError) -> str:
    where = f"{exc.filename}: " if exc.filename else ""
    return f"{where}{exc.strerror or exc}"


def every_committed(root: Path) -> list[int]:
    """Every version committed at any level in ``root`` (run on one rank)."""
    found = (parse_marker(m.name) for m in (root / "commits").glob("*/v*.committed"))
    return [step for step in found if step is not None]
