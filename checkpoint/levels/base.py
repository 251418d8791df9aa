"""What every checkpoint level shares: the job's layout, commit markers, one interface.

A level describes itself with class attributes (its name, what failure it survives,
its default interval and keep count, whether its files can be recycled, where they
live, which policy options it takes); the policy, the manager, the fault injection,
``hpcpar checkpoint`` and the inspection tools read those, so a new level is one module
with one ``Level`` subclass, plus its name in ``levels.BUILTIN``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from ..naming import marker_name, parse_marker, parse_version, version_name
from ..shard import EncodedShard, fsync_dir, read_file, write_file

__all__ = ["Job", "Level"]

# The partner and XOR levels move a shard in MPI messages (and reductions) of at most
# this many bytes: neither they nor the MPI library hold another copy of a whole shard.
PIECE_BYTES = 32 << 20


class Job:
    """The job as the levels see it: ranks, their nodes, and where files go.

    Args:
        comm: The checkpointer's communicator.
        node_of: The node index of every rank.
        root: The checkpoint root (shared by all ranks: commit markers, HDF5 files).
        local_dir: The node-local storage; node N uses ``local_dir/node<N>``.
    """

    def __init__(self, comm: Any, node_of: list[int], root: Path, local_dir: Path) -> None:
        self.comm, self.node_of, self.root, self.local_dir = comm, node_of, root, local_dir
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.node = node_of[self.rank]
        self.n_nodes = max(node_of) + 1
        self.ranks_of = [
            [r for r, n in enumerate(node_of) if n == node] for node in range(self.n_nodes)
        ]
        self.local_rank_of = [self.ranks_of[n].index(r) for r, n in enumerate(node_of)]

    def node_dir(self, node: int | None = None) -> Path:
        """A node's local directory (this rank's node by default)."""
        return self.local_dir / f"node{self.node if node is None else node}"


class Level:
    """One place versions are kept.

    ``write`` and ``recover`` are collective over the job (every rank calls them for the
    same version, in the same order); a failure on one rank is returned, never raised, so
    no rank is left waiting in a collective the others skipped.

    Attributes:
        name: As given in ``levels=`` and on the command line.
        survives: The failure a version kept here survives, in a few words.
        default_every: Written on every N-th save unless the policy says otherwise.
        default_keep: Versions kept unless the policy says otherwise.
        recyclable: Whether its writes can go over a pruned file's blocks.
        in_memory: Kept in the process (no files; the manager holds the snapshot).
        node_local: Files under ``local_dir/node<N>/<name>``; else under ``root/<name>``.
        own_kind: The kind of a rank's own file (``shard``, or ``h5``), as
            ``checkpoint.inspect`` names files.
        options: Extra policy entries it reads: name -> (default, check), where
            ``check(value)`` returns why a value is wrong, or "".
    """

    name: ClassVar[str] = "level"
    survives: ClassVar[str] = ""
    default_every: ClassVar[int] = 1
    default_keep: ClassVar[int] = 2
    recyclable: ClassVar[bool] = True
    in_memory: ClassVar[bool] = False
    node_local: ClassVar[bool] = True
    own_kind: ClassVar[str] = "shard"
    options: ClassVar[dict[str, tuple[Any, Callable[[Any], str]]]] = {}

    def __init__(self, job: Job) -> None:
        self.job = job
        self.recycle = self.recyclable  # the manager applies the policy's choice

    @classmethod
    def create(cls, job: Job, options: dict[str, Any]) -> Level:
        """Make the level for ``job`` with its policy options (collective).

        Raises:
            CheckpointError: the job's layout cannot be protected this way.
        """
        return cls(job)

    @classmethod
    def read(cls, path: Path, step: int, rank: int) -> dict[str, Any]:
        """Read and verify a rank's own file of this level (no job needed).

        Raises:
            CheckpointError: missing, damaged, or of another version or rank.
        """
        return read_file(path, step, rank)

    @classmethod
    def folder(cls, root: Path, local_dir: Path, step: int, node: int) -> Path:
        """Where the level keeps a node's files of version ``step`` (no job needed)."""
        base = local_dir / f"node{node}" if cls.node_local else root
        return base / cls.name / version_name(step)

    # ---- files ------------------------------------------------------------------------

    def spare(self, path: Path) -> Path:
        """Where a pruned file waits to be written over by the next version's same file."""
        return self.job.node_dir() / self.name / ".spare" / path.name

    def write_shard(self, path: Path, shard: EncodedShard) -> None:
        """Write a shard file, over the spare of its name when recycling.

        Raises:
            OSError: the write failed.
        """
        write_file(path, shard, reuse=self.spare(path) if self.recycle else None)

    # ---- commit markers (in the shared root) ----------------------------------------

    def marker(self, step: int) -> Path:
        """The file whose presence commits version ``step`` at this level."""
        return self.job.root / "commits" / self.name / marker_name(step)

    def committed(self) -> list[int]:
        """Committed versions, newest first (call on one rank and broadcast)."""
        folder = self.job.root / "commits" / self.name
        if not folder.is_dir():
            return []
        steps = [s for p in folder.iterdir() if (s := parse_marker(p.name)) is not None]
        return sorted(steps, reverse=True)

    def version_dir(self, step: int, node: int | None = None) -> Path:
        """Where this level keeps a node's files of version ``step``."""
        job = self.job
        return self.folder(job.root, job.local_dir, step, job.node if node is None else node)

    def steps_on_disk(self) -> list[int]:
        """Versions with a directory where this rank's files of this level go."""
        folder = self.version_dir(0).parent
        try:
            names = [p.name for p in folder.iterdir()]
        except OSError:
            return []
        return sorted(s for n in names if (s := parse_version(n)) is not None)

    def own_path(self, step: int) -> Path:
        """This rank's own shard of version ``step``."""
        return self.version_dir(step) / f"rank{self.job.rank}.shard"

    # ---- the interface ----------------------------------------------------------------

    def write(
        self, step: int, shard: EncodedShard, flat: dict[str, Any], written: dict[str, Path]
    ) -> str:
        """Write this rank's part of version ``step`` (collective).

        ``written`` maps the levels already written in this save to this rank's shard
        file, so a level can hard-link instead of writing the same bytes again.

        Returns:
            "" on success, else why this rank failed.
        """
        raise NotImplementedError

    def recover(self, step: int, need: bool) -> tuple[dict[str, Any] | None, str]:
        """Rebuild version ``step`` for the ranks with ``need`` (collective).

        Returns:
            ``(flat state or None, reason it could not be rebuilt)``.
        """
        raise NotImplementedError

    def on_commit(self, step: int) -> None:
        """Run on rank 0 after every rank wrote ``step``, before the marker is written."""

    def remove(self, step: int) -> None:
        """Delete this rank's files of version ``step``.

        When recycling, a file with no other link becomes the spare of its name (one per
        name) for the next version to write over; the version itself is gone either way.
        """
        folder = self.version_dir(step)
        for path in self.files(step):
            path.with_name(f".{path.name}.tmp").unlink(missing_ok=True)  # a write cut short
            if self.recycle and self._keep_as_spare(path):
                continue
            path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # the node's last rank to get here removes it
            folder.rmdir()

    def sweep(self, step: int) -> None:
        """Delete every file of version ``step`` this rank can see, on every node.

        For a version saved by another number of ranks, whose files ``remove`` (this
        rank's own) does not cover; any rank may run it, at the same time as others.
        """
        if self.node_local:
            folders = list(self.job.local_dir.glob(f"node*/{self.name}/{version_name(step)}"))
        else:
            folders = [self.version_dir(step)]
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)

    def _keep_as_spare(self, path: Path) -> bool:
        spare = self.spare(path)
        try:
            if path.stat().st_nlink != 1 or spare.exists():
                return False  # another level's hard link shares its blocks
            spare.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, spare)
        except OSError:
            return False
        return True

    def files(self, step: int) -> list[Path]:
        """This rank's files of version ``step``."""
        return [self.own_path(step)]

    def describe(self) -> dict[str, Any]:
        """What the level is, for ``hpcpar checkpoint ls``."""
        return {"level": self.name}

    def close(self) -> None:
        """Release what the level holds (communicators); the manager calls it once."""


def link_or_write(level: Level, path: Path, shard: EncodedShard, written: dict[str, Path]) -> None:
    """Hard-link a shard file written by another level in this save, else write it.

    Raises:
        OSError: the write failed.
    """
    source = next((p for p in written.values() if p.suffix == ".shard"), None)
    if source is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        try:
            os.link(source, path)
        except OSError:
            pass  # another file system: write a copy
        else:
            fsync_dir(path.parent)
            return
    level.write_shard(path, shard)
