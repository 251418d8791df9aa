"""Saving a checkpoint: snapshot, flush each due level in the background, commit, prune.

One background thread flushes one version at a time (the next save waits for the
previous commit: back-pressure); a version is committed at a level only when every rank
wrote it (a collective AND), by rank 0 writing the level's commit marker atomically.
"""

from __future__ import annotations

import contextlib
import json
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from hpcpar.datatypes.threads import copy_array
from hpcpar.runtime import flight

from .directory import Directory, unmark
from .faults import Fault
from .gpu import device_to_host, is_device_array, pinned_empty
from .levels import Level
from .naming import check_step
from .policy import Policy
from .shard import encode_shard, write_atomic
from .sharding import check_layouts
from .state import CheckpointError, flatten_state, layouts_of

__all__ = ["SaveHandle", "Saver", "describe_leaves"]


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
            CheckpointError: the version could not be committed at some level (the
                levels that did commit it are restorable).
        """
        entry = flight.point("checkpoint wait", "checkpoint")
        try:
            self._flush.result()
        finally:
            flight.leave(entry)


class Buffers:
    """Two sets of snapshot buffers used in turn (no page faults after the first saves)."""

    def __init__(self) -> None:
        self.sets: list[dict[str, np.ndarray]] = [{}, {}]
        self.turn = 0

    def copy(self, flat: dict[str, Any], fault: Fault | None, step: int, rank: int) -> dict:
        """Copy ``flat``'s arrays into this turn's buffers (other values as they are)."""
        spare = self.sets[self.turn]
        self.turn ^= 1
        out: dict[str, Any] = {}
        arrays = [k for k, v in flat.items() if isinstance(v, np.ndarray) or is_device_array(v)]
        halfway = arrays[max(len(arrays) // 2, 1) - 1] if arrays else None  # fault point
        for name, value in flat.items():
            if isinstance(value, np.ndarray) or is_device_array(value):
                device = is_device_array(value)
                buf = spare.get(name)
                if buf is None or buf.shape != value.shape or buf.dtype != value.dtype:
                    make = pinned_empty if device else np.empty
                    buf = spare[name] = make(value.shape, value.dtype)
                if device:
                    device_to_host(value, buf)
                else:
                    copy_array(buf, value)  # the caller waits: every core copies
                out[name] = buf
                if fault is not None and name == halfway:
                    fault.point("snapshot", step, rank)
            else:
                out[name] = value
        for stale in set(spare) - set(arrays):
            del spare[stale]
        return out


class Saver:
    """A checkpointer's save pipeline and the run's version state.

    ``floor``: a save must be newer; ``stale_above``: versions newer than a restored one,
    discarded when the next save starts; ``snapshot``: the in-memory level's version.
    """

    def __init__(
        self,
        comm: Any,
        front: Any,
        directory: Directory,
        levels: list[Level],
        policy: Policy,
        fault: Fault | None,
        memory: str | None,
        floor: int,
    ) -> None:
        self.comm, self._front, self.directory = comm, front, directory
        self.rank, self.size, self.root = directory.rank, directory.size, directory.root
        self.levels, self.memory, self.fault = levels, memory, fault
        self.every, self.keep = policy.every, policy.keep
        self.floor = floor
        self.stale_above: int | None = None
        self.snapshot: tuple[int, dict[str, Any]] | None = None
        self._buffers = Buffers()
        self._saves = 0
        self._layouts_checked = ""  # the last layouts check_layouts accepted
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="hpcpar-checkpoint")
        self._last: Future[Any] | None = None  # the whole flush, pruning included
        self._last_commit: Future[Any] | None = None
        self.timings: dict[str, list[float]] = {lv.name: [] for lv in levels}

    def save(self, step: int, state: dict[str, Any], lazy: bool) -> SaveHandle:
        """``Checkpointer.save`` (collective)."""
        problem, flat, described = "", {}, {}
        try:
            step = check_step(step)
            flat = flatten_state(state)
            described = describe_leaves(flat)
        except CheckpointError as exc:
            problem = f"rank {self.rank}: {exc}"
        every = self._front.allgather((problem, step if not problem else None, described))
        problems = [p for p, _, _ in every if p]
        if problems:
            raise CheckpointError(problems[0] + ("" if len(problems) == 1 else " (and others)"))
        steps = [s for _, s, _ in every]
        if len(set(steps)) > 1:
            groups: dict[int, list[int]] = {}
            for rank, s in enumerate(steps):
                groups.setdefault(s, []).append(rank)
            detail = "; ".join(f"{s} on rank(s) {_ranks(r)}" for s, r in groups.items())
            raise CheckpointError(f"save: ranks passed different steps: {detail}")
        layouts = [d for _, _, d in every]
        key = json.dumps(layouts, sort_keys=True)
        if key != self._layouts_checked:  # layouts rarely change from one save to the next
            problem = check_layouts(layouts)
            if problem:
                raise CheckpointError(problem)
            self._layouts_checked = key
        if step <= self.floor:
            raise CheckpointError(
                f"save: version {step} is not newer than version {self.floor}, already "
                f"saved or committed in {self.root} (restore() first to continue that run "
                "from an older version, or open the Checkpointer with overwrite=True to "
                "start a new run there)"
            )
        self.floor = step
        if self._last_commit is not None:  # back-pressure: one version being committed
            with contextlib.suppress(CheckpointError):  # reported by that save's handle
                self._last_commit.result()
        snapshot: Future[Any] = Future()
        if lazy:
            snapshot = self._pool.submit(self._buffers.copy, flat, self.fault, step, self.rank)
        else:
            snapshot.set_result(self._buffers.copy(flat, self.fault, step, self.rank))
        self._saves += 1
        due = [lv for lv in self.levels if (self._saves - 1) % self.every[lv.name] == 0]
        committed: Future[Any] = Future()
        self._last = self._pool.submit(self._flush, step, snapshot, due, committed)
        self._last_commit = committed
        return SaveHandle(snapshot, committed)

    def _flush(
        self, step: int, snapshot: Future[Any], due: list[Level], committed: Future[Any]
    ) -> None:
        """Commit ``step`` at the due levels, tell the handle, then prune old versions."""
        try:
            done, failed = self._commit(step, snapshot, due)
        except BaseException as exc:
            committed.set_exception(exc)
            raise
        if failed:
            committed.set_exception(
                CheckpointError(f"version {step} not committed at " + " | ".join(failed))
            )
        else:
            committed.set_result(None)
        # after the handle is told (pruning is not the caller's wait); slowest level first,
        # so a shard hard-linked from a later level has one link left when the local level
        # prunes it, and can become the local level's spare
        for level in reversed(done):
            self._prune(level)

    def _commit(
        self, step: int, snapshot: Future[Any], due: list[Level]
    ) -> tuple[list[Level], list[str]]:
        copy = snapshot.result()
        if self.stale_above is not None:  # the run went on from a restored version
            stale, self.stale_above = self.stale_above, None
            self.discard_above(stale)
        if self.memory:
            self.snapshot = (step, copy)
        if not due:
            return [], []
        stored = self._stored(copy)
        shard = encode_shard(step, self.rank, stored)
        written: dict[str, Path] = {}
        failed: list[str] = []
        done: list[Level] = []
        for level in due:
            start = time.perf_counter()
            entry = flight.point(
                f"checkpoint commit {level.name}", "checkpoint", None, step, current=False
            )  # (a background thread)
            if self.fault is not None:
                self.fault.arm_write(step, self.rank, level.name)
            reason = level.write(step, shard, stored, written)
            if self.fault is not None:
                self.fault.disarm()
            reasons = [r for r in self.comm.allgather(reason) if r]
            if reasons:
                level.remove(step)
                failed.append(f"{level.name}: {'; '.join(reasons)}")
                continue
            if self.fault is not None:
                self.fault.point("before-commit", step, self.rank, level.name)
            try:  # the marker exists on every rank's return, before anyone prunes or restores
                self.directory.on_root(lambda level=level: self._mark(level, step))
            except CheckpointError as exc:
                level.remove(step)
                failed.append(f"{level.name}: commit: {exc}")
                continue
            self.timings[level.name].append(time.perf_counter() - start)
            flight.finish(entry)
            if self.fault is not None:
                self.fault.point("after-commit", step, self.rank, level.name)
            done.append(level)
        return done, failed

    def _stored(self, copy: dict[str, Any]) -> dict[str, Any]:
        """What this rank's files hold: replicated arrays only in rank 0's."""
        if self.rank == 0:
            return copy
        replicated = {n for n, lay in layouts_of(copy).items() if lay.get("kind") == "replicated"}
        return {k: v for k, v in copy.items() if k not in replicated}

    def _mark(self, level: Level, step: int) -> None:
        """Rank 0: the level's last work on a version, then its commit marker."""
        try:
            level.on_commit(step)
        except OSError:
            raise
        except Exception as exc:  # a library's own error (h5py's): the commit failed
            raise CheckpointError(f"{type(exc).__name__}: {exc}") from None
        level.marker(step).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(level.marker(step), json.dumps({"step": step, "ranks": self.size}))

    def _prune(self, level: Level) -> None:
        # rank 0's listing for all: another rank listing while rank 0 unlinks would see less
        try:
            committed = self.directory.on_root(level.committed)
        except CheckpointError:
            return  # nothing is pruned this time; the next save tries again
        for old in committed[self.keep[level.name] :]:
            try:  # nobody deletes a file of a still-committed version
                ranks = self.directory.on_root(lambda old=old: unmark(level.marker(old), self.size))
            except CheckpointError:
                return
            level.remove(old)
            if ranks != self.size:  # saved by another job: its files are not all ours
                level.sweep(old)
        # files of versions that never committed (a job killed while writing them) and
        # never will: older than the newest committed one, which restore always prefers
        if committed:
            kept = set(committed)
            for orphan in level.steps_on_disk():
                if orphan < committed[0] and orphan not in kept:
                    level.remove(orphan)

    def drain(self) -> None:
        """Wait for every queued flush, pruning included (before any collective here)."""
        if self._last is not None:
            with contextlib.suppress(CheckpointError):  # reported by that save's handle
                self._last.result()
            self._last = None

    def discard_above(self, step: int) -> None:
        """Discard every committed version newer than ``step`` at every level (collective).

        Rank 0 removes the commit markers first (each version vanishes at once, never
        half), then every rank removes its files of those versions at the levels in use.
        """
        gone = self.directory.unmark_above(step)
        for level in self.levels:
            for old in set(gone) | {s for s in level.steps_on_disk() if s > step}:
                level.remove(old)
                if gone.get(old, self.size) != self.size:
                    level.sweep(old)
        if self.snapshot is not None and self.snapshot[0] > step:
            self.snapshot = None

    def continue_from(self, step: int, newest: int) -> None:
        """After a restore of ``step`` the run goes on from it.

        The next save must be newer than ``step``; versions newer than it (damaged, or
        not asked for) are discarded when that save starts, so no later restore returns
        them in place of the run's new versions.
        """
        self.floor = step
        self.stale_above = step if newest > step else None

    def shutdown(self) -> None:
        """Finish the flush in flight and stop the background thread."""
        self.drain()
        self._pool.shutdown(wait=True)


def describe_leaves(flat: dict[str, Any]) -> dict[str, list[Any]]:
    """This rank's declared leaves, as ``sharding.check_layouts`` compares them.

    With ``HPCPAR_CHECK=1`` a replicated leaf also carries its checksum, so copies that
    differ between ranks are found.
    """
    from hpcpar.collectives.check import checking

    from . import checksum

    out: dict[str, list[Any]] = {}
    for name, layout in layouts_of(flat).items():
        value = flat.get(name)
        if value is None:
            continue
        row = [
            layout.get("kind"),
            layout.get("global"),
            layout.get("offset"),
            list(value.shape),
            str(np.dtype(value.dtype)),
        ]
        if layout.get("kind") == "replicated" and checking():
            host = value.get() if is_device_array(value) else value
            row.append(checksum.digest(np.ascontiguousarray(host).reshape(-1).view(np.uint8)))
        out[name] = row
    return out


def _ranks(ranks: list[int]) -> str:
    from hpcpar.layout import format_ranks

    return format_ranks(ranks)
