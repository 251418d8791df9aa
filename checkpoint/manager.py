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

from pathlib import Path
from typing import Any

import numpy as np

from hpcpar.runtime import flight, resume, settings

from .directory import Directory
from .faults import Fault, parse_fault
from .levels import LEVELS, Job, Level
from .policy import check_levels, parse_policy, young_daly_interval
from .reshard import PER_RANK
from .restoring import Loader
from .saving import SaveHandle, Saver
from .state import CheckpointError

__all__ = ["Checkpointer", "SaveHandle"]


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
        fault = parse_fault(settings.value("HPCPAR_CHECKPOINT_FAULT"))
        layout = comm.layout if isinstance(comm, Hierarchy) else None
        self.comm = resolve_comm(comm).Dup()  # checkpoint traffic runs on its own communicator
        with Hierarchy(self.comm, layout=layout) as h:
            node_of = list(h.node_of)
        self._front = self.comm.Dup()  # the caller's thread: save()'s checks
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.root = Path(path)
        self._directory = Directory(self.comm, self.root)
        local = Path(local_dir) if local_dir is not None else self.root / "nodes"
        self.job = Job(self.comm, node_of, self.root, local)
        if fault is not None:
            fault.bind(self.job.node, self.job.node_dir())
        files = [LEVELS[n] for n in names if not LEVELS[n].in_memory]
        try:
            floor = self._directory.open(bool(overwrite))  # a save must be newer
            self.levels: list[Level] = self._directory.agree(
                lambda: [cls.create(self.job, self.policy.options[cls.name]) for cls in files]
            )
        except CheckpointError:
            self._release()
            raise
        for level in self.levels:
            level.recycle = self.policy.recycle and level.recyclable
        # the in-memory level's name, if one is in use (the saver keeps its snapshot)
        self.memory = next((n for n in names if LEVELS[n].in_memory), None)
        self._saver = Saver(
            self.comm,
            self._front,
            self._directory,
            self.levels,
            self.policy,
            fault,
            self.memory,
            floor,
        )
        self._loader = Loader(
            self.comm, self._directory, self.job, self.levels, self.memory, self._saver
        )
        if overwrite:
            self._saver.discard_above(-1)
        self.timings = self._saver.timings  # commit seconds per level, one per save

    @property
    def restored_from(self) -> list[str]:
        """The level that served each rank in the last restore (each saved rank, resharded)."""
        return self._loader.restored_from

    @property
    def fault(self) -> Fault | None:
        """The fault this rank injects (``HPCPAR_CHECKPOINT_FAULT``; tests set it directly)."""
        return self._saver.fault

    @fault.setter
    def fault(self, fault: Fault | None) -> None:
        self._saver.fault = fault

    def _release(self) -> None:
        """Free the communicators and give up the directory's lock."""
        self._front.Free()
        self.comm.Free()
        self._directory.release()

    def save(self, step: int, state: dict[str, Any], *, lazy: bool = False) -> SaveHandle:
        """Snapshot ``state`` for version ``step`` and flush it in the background (collective).

        Raises:
            CheckpointError: on every rank, for a bad step or state on any rank (the key
                and rank are named), ranks that passed different steps, or a step that
                is not newer than every version saved or committed before.
        """
        entry = flight.point("checkpoint save", "checkpoint", None, step)
        try:
            return self._saver.save(step, state, lazy)
        finally:
            flight.leave(entry)

    def committed(self) -> dict[str, list[int]]:
        """Committed versions per file level, newest first (collective)."""
        self._saver.drain()
        return self._directory.on_root(lambda: {lv.name: lv.committed() for lv in self.levels})

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
            found, state = self._loader.restore(step, reshard, per_rank, self.committed())
        finally:
            flight.leave(entry)
        resume.note_resumed(found, self.restored_from)
        return found, state

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
        self._saver.shutdown()
        if sync:  # not on an error path: the other ranks may never get here
            self.comm.Barrier()
        for level in self.levels:
            level.close()
        self._release()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(sync=exc_type is None)
