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
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from hpcpar.datatypes.threads import copy_array
from hpcpar.runtime import flight, settings

from .faults import Fault, parse_fault
from .gpu import device_to_host, is_device_array, pinned_empty
from .levels import LEVELS, Job, Level
from .lock import DirectoryLock
from .naming import check_step, marker_name, parse_marker
from .policy import check_levels, parse_policy, young_daly_interval
from .reshard import PER_RANK, LayoutError, restore_resharded
from .shard import encode_shard, write_atomic
from .sharding import check_layouts
from .state import CheckpointError, flatten_state, layouts_of, unflatten_state

__all__ = ["Checkpointer", "SaveHandle"]

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
            CheckpointError: the version could not be committed at some level (the
                levels that did commit it are restorable).
        """
        entry = flight.point("checkpoint wait", "checkpoint")
        try:
            self._flush.result()
        finally:
            flight.leave(entry)


class _Buffers:
    """Two sets of snapshot buffers used in turn (no page faults after the first saves)."""

    def __init__(self) -> None:
        self.sets: list[dict[str, np.ndarray]] = [{}, {}]
        self.turn = 0

    def copy(self, flat: dict[str, Any], fault: Fault | None, step: int, rank: int) -> dict:
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


class Checkpointer:
    """Multi-level checkpoints of a job's state.

    Args:
        path: The checkpoint root, shared by all ranks (commit markers, HDF5 files, and
            the node directories unless ``local_dir`` is given).
        comm: ``None`` (hpcpar's communicator), a communicator or a ``Hierarchy`` (its
            layout decides which ranks share a node, i.e. fail together).
        levels: Level names (``hpcpar.checkpoint.LEVELS``: ``memory``, ``local``,
            ``partner``, ``xor``, ``hdf5``); default ``["memory", "local"]``.
        policy: ``{"every": {"local": 1, "partner": 5, "hdf5": 50}, "keep": {"local": 2},
            "xor_group": 4}``: write a level on every N-th save (the first save writes
            all), keep its newest K versions (each level's ``default_keep``: memory 1,
            files 2), and the levels' own options (the nodes per XOR group); see
            ``policy.parse_policy``.
        local_dir: Node-local storage (``/dev/shm/...`` works); node N uses
            ``local_dir/node<N>``. Default ``path/nodes``.
        overwrite: Start a new run in a directory that holds an old one: its versions
            are discarded now (their commit markers first, so none is ever half
            visible). Without it, a save must be newer than every version already
            committed there (``restore()`` first to continue a run).

    A directory written by a job with another number of ranks is opened as well: its
    versions restore with ``restore()``, which reshards ``Sharded`` leaves.

    Raises:
        CheckpointError: unknown level, bad policy, a layout the partner or xor level
            cannot protect, or a directory another job is using (the lock's holder is
            named).
    """

    def __init__(
        self,
        path: Any,
        comm: Any = None,
        levels: list[str] | None = None,
        policy: dict[str, Any] | None = None,
        *,
        local_dir: Any = None,
        overwrite: bool = False,
    ) -> None:
        from hpcpar.runtime.comm import resolve_comm
        from hpcpar.topology import Hierarchy

        names = check_levels(levels)
        self.policy = parse_policy(policy, names)
        self.every, self.keep = self.policy.every, self.policy.keep
        self.fault = parse_fault(settings.value("HPCPAR_CHECKPOINT_FAULT"))
        layout = comm.layout if isinstance(comm, Hierarchy) else None
        self.comm = resolve_comm(comm).Dup()  # checkpoint traffic runs on its own communicator
        with Hierarchy(self.comm, layout=layout) as h:
            node_of = list(h.node_of)
        self._front = self.comm.Dup()  # the caller's thread: save()'s checks
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.root = Path(path)
        self._lock: DirectoryLock | None = None
        self._floor = self._open_directory(bool(overwrite))  # a save must be newer
        self._stale_above: int | None = None  # versions newer than a restored one
        local = Path(local_dir) if local_dir is not None else self.root / "nodes"
        self.job = Job(self.comm, node_of, self.root, local)
        files = [LEVELS[n] for n in names if not LEVELS[n].in_memory]
        try:
            self.levels: list[Level] = self._agree(
                lambda: [cls.create(self.job, self.policy.options[cls.name]) for cls in files]
            )
        except CheckpointError:
            self._release()
            raise
        for level in self.levels:
            level.recycle = self.policy.recycle and level.recyclable
        # the in-memory level's name, if one is in use (the manager keeps its snapshot)
        self.memory = next((n for n in names if LEVELS[n].in_memory), None)
        self._snapshot: tuple[int, dict[str, Any]] | None = None
        if overwrite:
            self._discard_above(-1)
        self._buffers = _Buffers()
        self._saves = 0
        self._layouts_checked = ""  # the last layouts check_layouts accepted
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="hpcpar-checkpoint")
        self._last: Future[Any] | None = None  # the whole flush, pruning included
        self._last_commit: Future[Any] | None = None
        self.restored_from: list[str] = []
        self.timings: dict[str, list[float]] = {lv.name: [] for lv in self.levels}

    def _agree(self, build: Any) -> Any:
        """Build on every rank; if it fails on any, raise the first error everywhere."""
        try:
            out, problem = build(), ""
        except CheckpointError as exc:
            out, problem = None, str(exc)
        problems = [p for p in self.comm.allgather(problem) if p]
        if problems:
            raise CheckpointError(problems[0])
        return out

    def _on_root(self, work: Any, comm: Any = None) -> Any:
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
                problem = str(exc) if isinstance(exc, CheckpointError) else _os_problem(exc)
        result, problem = comm.bcast((result, problem), root=0)
        if problem:
            raise CheckpointError(problem)
        return result

    def _open_directory(self, overwrite: bool) -> int:
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
            return -1 if overwrite else max(_every_committed(self.root), default=-1)

        try:
            return int(self._on_root(open_on_root))
        except CheckpointError:
            self._release()
            raise

    def _release(self) -> None:
        """Free the communicators and give up the directory's lock."""
        self._front.Free()
        self.comm.Free()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _discard_above(self, step: int) -> None:
        """Discard every committed version newer than ``step`` at every level (collective).

        Rank 0 removes the commit markers first (each version vanishes at once, never
        half), then every rank removes its files of those versions at the levels in use.
        """

        def unmark() -> dict[int, int]:
            gone: dict[int, int] = {}
            for folder in (self.root / "commits").glob("*"):
                for marker in folder.glob("v*.committed"):
                    found = parse_marker(marker.name)
                    if found is not None and found > step:
                        ranks = _unmark(marker, self.size)
                        gone[found] = ranks if ranks != self.size else gone.get(found, ranks)
            return gone

        gone = self._on_root(unmark)
        for level in self.levels:
            for old in set(gone) | {s for s in level.steps_on_disk() if s > step}:
                level.remove(old)
                if gone.get(old, self.size) != self.size:
                    level.sweep(old)
        if self._snapshot is not None and self._snapshot[0] > step:
            self._snapshot = None

    # ---- saving --------------------------------------------------------------------

    def save(self, step: int, state: dict[str, Any], *, lazy: bool = False) -> SaveHandle:
        """Snapshot ``state`` for version ``step`` and flush it in the background (collective).

        Raises:
            CheckpointError: on every rank, for a bad step or state on any rank (the key
                and rank are named), ranks that passed different steps, or a step that
                is not newer than every version saved or committed before.
        """
        entry = flight.point("checkpoint save", "checkpoint", None, step)
        try:
            return self._save(step, state, lazy)
        finally:
            flight.leave(entry)

    def _save(self, step: int, state: dict[str, Any], lazy: bool) -> SaveHandle:
        problem, flat, described = "", {}, {}
        try:
            step = check_step(step)
            flat = flatten_state(state)
            described = _describe(flat)
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
        if step <= self._floor:
            raise CheckpointError(
                f"save: version {step} is not newer than version {self._floor}, already "
                f"saved or committed in {self.root} (restore() first to continue that run "
                "from an older version, or open the Checkpointer with overwrite=True to "
                "start a new run there)"
            )
        self._floor = step
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
        if self._stale_above is not None:  # the run went on from a restored version
            stale, self._stale_above = self._stale_above, None
            self._discard_above(stale)
        if self.memory:
            self._snapshot = (step, copy)
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
                self._on_root(lambda level=level: self._mark(level, step))
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
            committed = self._on_root(level.committed)
        except CheckpointError:
            return  # nothing is pruned this time; the next save tries again
        for old in committed[self.keep[level.name] :]:
            try:  # nobody deletes a file of a still-committed version
                ranks = self._on_root(lambda old=old: _unmark(level.marker(old), self.size))
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

    def _drain(self) -> None:
        """Wait for every queued flush, pruning included (before any collective here)."""
        if self._last is not None:
            with contextlib.suppress(CheckpointError):  # reported by that save's handle
                self._last.result()
            self._last = None

    # ---- restoring -----------------------------------------------------------------

    def committed(self) -> dict[str, list[int]]:
        """Committed versions per file level, newest first (collective)."""
        self._drain()
        return self._on_root(lambda: {lv.name: lv.committed() for lv in self.levels})

    def versions(self) -> list[int]:
        """Every version committed at some file level, newest first (collective)."""
        return sorted({v for vs in self.committed().values() for v in vs}, reverse=True)

    def restore(
        self, step: int | None = None, *, reshard: Any = None, per_rank: str | None = None
    ) -> tuple[int, dict[str, Any]]:
        """The newest version every rank can rebuild and verify (or exactly ``step``).

        Levels are tried fastest first (memory, local, partner, xor, hdf5); a rank whose
        copy at one level is lost or damaged is served by the next, and
        ``restored_from`` lists the level that served each rank.

        A version saved by another number of ranks is resharded: each rank receives its
        new block of every ``Sharded`` leaf (read from the saved shards where they
        overlap it, from whichever level holds them whole), every ``Replicated`` leaf,
        and the plain values that were the same on every saved rank; ``restored_from``
        then lists the level that served each *saved* rank.

        Args:
            step: The version (None: the newest recoverable one).
            reshard: The blocks this rank wants, per sharded leaf: ``None`` (the saved
                blocks if the rank count is unchanged, else near-equal blocks along the
                axis the saved ones were cut on), an axis, ``(offset, shape)``, a dict of
                leaf name (``"opt/m"``) -> one of those, or a callable ``(name,
                global_shape) -> one of those``. Given, it reshards at any rank count.
            per_rank: ``"all"``: leaves saved per rank (unmarked arrays, values that
                differ) come back on every rank as a list of every saved rank's; without
                it they are an error when the rank count changed.

        Returns:
            ``(step, state)``.

        Raises:
            CheckpointError: no committed version is whole on every rank (the reasons of
                the newest one are given); a version saved by another number of ranks
                with per-rank leaves; a target block that does not fit.
        """
        if per_rank not in PER_RANK:
            raise CheckpointError(f"restore: per_rank must be None or 'all', not {per_rank!r}")
        entry = flight.point("checkpoint restore", "checkpoint", None, step)
        try:
            return self._restore(step, reshard, per_rank)
        finally:
            flight.leave(entry)

    def _restore(self, step: int | None, reshard: Any, per_rank: Any) -> tuple[int, dict[str, Any]]:
        committed = self.committed()
        newest = max((v for vs in committed.values() for v in vs), default=-1)
        mine = self._snapshot[0] if self._snapshot is not None else -1
        everyone = self.comm.allgather(mine)
        plain = reshard is None and per_rank is None
        if plain and len(set(everyone)) == 1 and mine >= max(newest, 0) and step in (None, mine):
            self.restored_from = [self.memory] * self.size
            self._continue_from(mine, newest)
            flat = {
                k: (v.copy() if isinstance(v, np.ndarray) else v)
                for k, v in self._snapshot[1].items()
            }  # type: ignore[index]
            return mine, unflatten_state(flat)
        saved = self._on_root(lambda: {v: self._saved_by(v) for v in _every_committed(self.root)})
        # versions at the levels in use, and those another number of ranks saved at any
        # level (resharding reads every level)
        ours = {v for vs in committed.values() for v in vs}
        candidates = sorted(
            (v for v in saved if v in ours or saved[v][0] != self.size), reverse=True
        )
        if step is not None:
            candidates = [v for v in candidates if v == step]
        problems: list[str] = []
        for candidate in candidates:
            old, names = saved[candidate]
            if old != self.size or not plain:
                levels = [LEVELS[n] for n in names]
                try:
                    flat, served = restore_resharded(
                        self.comm,
                        self.root,
                        self.job.local_dir,
                        candidate,
                        old,
                        levels,
                        reshard,
                        per_rank,
                    )
                except LayoutError:
                    raise
                except CheckpointError as exc:
                    problems.append(f"version {candidate}: {exc}")
                    continue
                self.restored_from = served
                self._continue_from(candidate, newest)
                return candidate, unflatten_state(flat)
            flat, why = self._recover(candidate, committed)
            if flat is not None:
                self._continue_from(candidate, newest)
                return candidate, unflatten_state(self._with_replicas(flat))
            problems.append(f"version {candidate}: {why}")
        wanted = f"version {step}" if step is not None else "version"
        detail = f" ({problems[0]})" if problems else ""
        raise CheckpointError(f"no recoverable {wanted} in {self.root}{detail}")

    def _recover(
        self, candidate: int, committed: dict[str, list[int]]
    ) -> tuple[dict[str, Any] | None, str]:
        """Every rank's own shard of ``candidate``, from the fastest level that has it."""
        flat, served, why = None, "", ""
        for level in self.levels:
            if candidate not in committed[level.name]:
                continue
            got, reason = level.recover(candidate, flat is None)
            if flat is None:
                if got is not None:
                    flat, served = got, level.name
                else:
                    why = reason or why
            servers = self.comm.allgather(served)
            if all(servers):
                self.restored_from = servers
                return flat, ""
        reasons = [r for r in self.comm.allgather("" if flat is not None else why) if r]
        return None, reasons[0] if reasons else "incomplete"

    def _saved_by(self, step: int) -> tuple[int, list[str]]:
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

    def _with_replicas(self, flat: dict[str, Any]) -> dict[str, Any]:
        """Hand rank 0's replicated arrays to the other ranks (collective), in pieces."""
        from .levels.base import PIECE_BYTES

        replicated = sorted(
            n for n, lay in layouts_of(flat).items() if lay.get("kind") == "replicated"
        )
        for name in replicated:
            value = flat.get(name) if self.rank == 0 else None
            described = self.comm.bcast(
                (value.shape, value.dtype.descr if value.dtype.fields else value.dtype.str)
                if isinstance(value, np.ndarray)
                else None,
                root=0,
            )
            if described is None:
                raise CheckpointError(f"replicated {name!r} is missing from rank 0's shard")
            shape, dtype = described
            out = value if self.rank == 0 else np.empty(shape, _np_dtype(dtype))
            raw = out.reshape(-1).view(np.uint8)
            for start in range(0, raw.size, PIECE_BYTES):
                self.comm.Bcast(raw[start : start + PIECE_BYTES], root=0)
            flat[name] = out
        return flat

    def _continue_from(self, step: int, newest: int) -> None:
        """After a restore of ``step`` the run goes on from it.

        The next save must be newer than ``step``; versions newer than it (damaged, or
        not asked for) are discarded when that save starts, so no later restore returns
        them in place of the run's new versions.
        """
        self._floor = step
        self._stale_above = step if newest > step else None

    def suggest_interval(self, mtbf_s: float, level: str | None = None) -> float:
        """Young/Daly compute time between saves, from this run's median commit time.

        Args:
            mtbf_s: The mean time between failures the level must survive.
            level: The level whose cost counts (default: the slowest one written so far).

        Raises:
            CheckpointError: no save has been committed yet, or an unknown level.
        """
        if level is not None and level not in self.timings:
            raise CheckpointError(f"level {level!r} is not in use")
        costs = {n: float(np.median(t)) for n, t in self.timings.items() if t}
        if level is not None:
            costs = {level: costs[level]} if level in costs else {}
        if not costs:
            raise CheckpointError("no committed save measured yet; save once first")
        return young_daly_interval(max(costs.values()), mtbf_s)

    def close(self, *, sync: bool = True) -> None:
        """Finish the flush in flight and release the background thread and communicators.

        Collective; when it returns on any rank, every rank's flush and pruning are done,
        so the files on disk no longer change (a race the 3-rank tests once hit: rank 0
        deleted a node's directory while a rank of that node was still pruning in it).
        """
        self._drain()
        self._pool.shutdown(wait=True)
        if sync:  # not on an error path: the other ranks may never get here
            self.comm.Barrier()
        for level in self.levels:
            level.close()
        self._release()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(sync=exc_type is None)


def _np_dtype(spec: Any) -> np.dtype:
    return np.dtype(spec if isinstance(spec, str) else [tuple(f) for f in spec])


def _describe(flat: dict[str, Any]) -> dict[str, list[Any]]:
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


def _unmark(marker: Path, size: int) -> int:
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


def _os_problem(exc: OSError) -> str:
    where = f"{exc.filename}: " if exc.filename else ""
    return f"{where}{exc.strerror or exc}"


def _every_committed(root: Path) -> list[int]:
    """Every version committed at any level in ``root`` (run on one rank)."""
    found = (parse_marker(m.name) for m in (root / "commits").glob("*/v*.committed"))
    return [step for step in found if step is not None]


def _ranks(ranks: list[int]) -> str:
    from hpcpar.layout import format_ranks

    return format_ranks(ranks)
