"""``Checkpointer``: background saves, all-or-nothing commits, verified restores.

Consistency contract (enforced here): ``save()`` returns once the memory snapshot is
taken (the caller may change its arrays at once; with ``lazy=True`` the copy itself is
made in the background and the caller must not change the arrays until
``handle.wait_snapshot()``); the flush to each file level runs on a background thread,
one flush at a time (the next ``save()`` waits: back-pressure); every shard is written
to a temporary directory with fsync and renamed into place; a version is committed at a
level only when every rank reports success (a collective AND), by rank 0 writing the
commit marker atomically; ``restore()`` considers only committed versions, newest
first, verifies every checksum on every rank, and falls back to older versions until
one is whole everywhere. Abandoned or failed versions are never committed.
"""

from __future__ import annotations

import contextlib
import json
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from .levels import Level, LocalLevel
from .shard import read_shard, write_atomic, write_shard
from .state import CheckpointError, flatten_state, unflatten_state

__all__ = ["Checkpointer", "SaveHandle", "LEVELS"]

LEVELS = ("memory", "local")
_JOB_FILE = "hpcpar-checkpoint.json"


class SaveHandle:
    """A save in progress: ``wait()`` blocks until it is committed (or raises)."""

    def __init__(self, snapshot: Future[Any], flush: Future[Any]) -> None:
        self._snapshot, self._flush = snapshot, flush

    def snapshot_done(self) -> bool:
        """Whether the state's copy is taken (the caller may change its arrays)."""
        return self._snapshot.done()

    def wait_snapshot(self) -> None:
        """Block until the copy is taken."""
        self._snapshot.result()

    def done(self) -> bool:
        """Whether the save has finished (committed or failed)."""
        return self._flush.done()

    def wait(self) -> None:
        """Block until the version is committed at every due level.

        Raises:
            CheckpointError: the version could not be committed (it is not restorable).
        """
        self._flush.result()


def _copy(flat: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in flat.items()}


class Checkpointer:
    """Multi-level checkpoints of a job's state.

    Args:
        path: The checkpoint root (a shared or node-local directory).
        comm: ``None`` (hpcpar's communicator), a communicator or a ``Hierarchy``.
        levels: Level names, default ``["memory", "local"]``.
        policy: ``{"every": {"local": 1}, "keep": {"local": 2}}``: write a level every N
            saves and keep its newest K versions (defaults 1 and 2).

    Raises:
        CheckpointError: unknown level, bad policy, or a directory written by a job with
            another number of ranks.
    """

    def __init__(
        self,
        path: Any,
        comm: Any = None,
        levels: list[str] | None = None,
        policy: dict[str, Any] | None = None,
    ) -> None:
        from hpcpar.runtime.comm import resolve_comm
        from hpcpar.topology import Hierarchy

        names = list(levels) if levels is not None else ["memory", "local"]
        unknown = [n for n in names if n not in LEVELS]
        if unknown:
            raise CheckpointError(f"unknown level(s) {unknown}; choose from {', '.join(LEVELS)}")
        self.every, self.keep = self._policy(policy or {}, names)
        layout = comm.layout if isinstance(comm, Hierarchy) else None
        self.comm = resolve_comm(comm).Dup()  # checkpoint traffic runs on its own communicator
        with Hierarchy(self.comm, layout=layout) as h:
            node = h.node_index
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.root = Path(path)
        self._check_job()
        self.levels: list[Level] = (
            [LocalLevel(self.root / "local", node)] if "local" in names else []
        )
        self.memory = "memory" in names
        self._snapshot: tuple[int, dict[str, Any]] | None = None
        self._saves = 0
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="hpcpar-checkpoint")
        self._last: Future[Any] | None = None
        self._lock = threading.Lock()

    @staticmethod
    def _policy(policy: dict[str, Any], names: list[str]) -> tuple[dict[str, int], dict[str, int]]:
        every, keep = {n: 1 for n in names}, {n: 2 for n in names}
        for key, table in policy.items():
            if key not in ("every", "keep") or not isinstance(table, dict):
                raise CheckpointError(
                    f"policy: unknown entry {key!r} (use 'every' and 'keep' tables)"
                )
            for level, value in table.items():
                if level not in names:
                    raise CheckpointError(
                        f"policy.{key}: {level!r} is not one of the levels {names}"
                    )
                if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                    raise CheckpointError(
                        f"policy.{key}.{level} must be a positive integer, not {value!r}"
                    )
                (every if key == "every" else keep)[level] = value
        return every, keep

    def _check_job(self) -> None:
        problem = None
        if self.rank == 0:
            job = self.root / _JOB_FILE
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                if job.exists():
                    doc = json.loads(job.read_text())
                    if doc.get("format") != "hpcpar-checkpoint":
                        problem = f"{self.root} holds something that is not an hpcpar checkpoint"
                    elif doc.get("ranks") != self.size:
                        problem = (
                            f"{self.root} was written by a job of {doc.get('ranks')} ranks; "
                            f"this job has {self.size} (restart with the same number of ranks)"
                        )
                else:
                    write_atomic(
                        job, json.dumps({"format": "hpcpar-checkpoint", "ranks": self.size})
                    )
            except (OSError, ValueError) as exc:
                problem = f"cannot use checkpoint directory {self.root}: {exc}"
        problem = self.comm.bcast(problem, root=0)
        if problem:
            raise CheckpointError(problem)

    # ---- saving --------------------------------------------------------------------

    def save(self, step: int, state: dict[str, Any], *, lazy: bool = False) -> SaveHandle:
        """Snapshot ``state`` for version ``step`` and flush it in the background (collective).

        Raises:
            CheckpointError: a bad step or state (the key is named).
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise CheckpointError(f"step must be an integer >= 0, not {step!r}")
        flat = flatten_state(state)
        self._drain()  # back-pressure: one flush in flight
        snapshot: Future[Any] = Future()
        if lazy:
            work = self._pool.submit(_copy, flat)
            snapshot = work
        else:
            snapshot.set_result(_copy(flat))
        self._saves += 1
        due = [lv for lv in self.levels if (self._saves - 1) % self.every[lv.name] == 0]
        self._last = self._pool.submit(self._flush, step, snapshot, due)
        return SaveHandle(snapshot, self._last)

    def _flush(self, step: int, snapshot: Future[Any], due: list[Level]) -> None:
        copy = snapshot.result()
        if self.memory:
            self._snapshot = (step, copy)
        for level in due:
            ok, reason = True, ""
            try:
                write_shard(level.shard_dir(step, self.rank), step, self.rank, copy)
            except OSError as exc:
                ok, reason = False, f"rank {self.rank}: {exc.strerror or exc}"
            reasons = self.comm.allgather(reason if not ok else "")
            if any(reasons):
                level.remove(step, self.rank)
                raise CheckpointError(
                    f"version {step} not committed at {level.name}: "
                    + "; ".join(r for r in reasons if r)
                )
            if self.rank == 0:
                write_atomic(
                    level.commit_marker(step), json.dumps({"step": step, "ranks": self.size})
                )
            self.comm.Barrier()  # the marker exists before anyone prunes or restores
            self._prune(level)

    def _prune(self, level: Level) -> None:
        # rank 0's listing for all: another rank listing while rank 0 unlinks would see less
        stale = self.comm.bcast(
            level.committed()[self.keep[level.name] :] if self.rank == 0 else None
        )
        for old in stale:
            if self.rank == 0:
                level.commit_marker(old).unlink(missing_ok=True)
            self.comm.Barrier()  # nobody deletes a shard of a still-committed version
            level.remove(old, self.rank)

    def _drain(self) -> None:
        if self._last is not None:
            with contextlib.suppress(CheckpointError):  # reported by that save's handle
                self._last.result()
            self._last = None

    # ---- restoring -----------------------------------------------------------------

    def versions(self) -> list[int]:
        """Committed versions at the slowest file level, newest first (collective)."""
        self._drain()
        seen = set()
        for level in self.levels:
            seen |= set(level.committed())
        mine = sorted(seen, reverse=True)
        return self.comm.bcast(mine, root=0)

    def restore(self, step: int | None = None) -> tuple[int, dict[str, Any]]:
        """The newest version every rank can rebuild and verify (or exactly ``step``).

        Returns:
            ``(step, state)``.

        Raises:
            CheckpointError: no committed version is whole on every rank (the reasons of
                the newest one are given).
        """
        self._drain()
        committed = self.versions()
        mine = self._snapshot[0] if self._snapshot is not None else -1
        everyone = self.comm.allgather(mine)
        newest_file = committed[0] if committed else -1
        if len(set(everyone)) == 1 and mine >= max(newest_file, 0) and step in (None, mine):
            return mine, unflatten_state(_copy(self._snapshot[1]))  # type: ignore[index]
        problems: list[str] = []
        for candidate in committed:
            if step is not None and candidate != step:
                continue
            for level in self.levels:
                try:
                    flat, reason = (
                        read_shard(level.shard_dir(candidate, self.rank), candidate, self.rank),
                        "",
                    )
                except CheckpointError as exc:
                    flat, reason = None, str(exc)
                reasons = [r for r in self.comm.allgather(reason) if r]
                if not reasons:
                    return candidate, unflatten_state(flat)  # type: ignore[arg-type]
                problems.append(f"version {candidate} at {level.name}: {reasons[0]}")
        wanted = f"version {step}" if step is not None else "any version"
        detail = f" ({problems[0]})" if problems else ""
        raise CheckpointError(f"no recoverable {wanted} in {self.root}{detail}")

    def close(self) -> None:
        """Finish the flush in flight and release the background thread and communicator."""
        self._drain()
        self._pool.shutdown(wait=True)
        self.comm.Free()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
