"""Fault injection: crash a rank at a protocol phase, fail a write, damage a checkpoint.

Faults in a running job are set by ``HPCPAR_CHECKPOINT_FAULT`` (read when a
``Checkpointer`` is created): one fault, or several separated by ``;``, each a
comma-separated list of ``key=value``:

- ``kill=PHASE``: SIGKILL this process at PHASE of the save of ``step`` on ``rank``. PHASE is
  ``snapshot`` (half of the state copied), ``write`` (half of a shard written),
  ``before-commit`` (every shard durable, no commit marker yet) or ``after-commit``.
- ``enospc=LEVEL``: the write of ``step`` on ``rank`` at LEVEL fails with ENOSPC.
- ``node=N`` (instead of ``rank``): every rank of node N dies at PHASE, and the node's
  local storage (``local_dir/node<N>``) goes with it, as when a node is lost; the
  launcher is told (``hpcpar launch --restarts`` then restarts without that node).
- ``after=S``: only once S seconds have passed since the ``Checkpointer`` was created
  (failures at a rate: one fault per start, each with its own ``restart=K``).
- ``step=N`` (default: any step), ``rank=R`` (default 0), ``level=NAME`` (kill only at
  that level; default: the first level written), ``restart=K`` (only in the job's K-th
  restart under ``hpcpar launch --restarts``, ``HPCPAR_RESTART``; default 0, the first
  start: a restarted job that saves the same step again is not killed again).

At-rest damage (``delete_node``, ``flip_bytes``, ``truncate_manifest``) works on a
checkpoint directory after the job, as the tests and ``hpcpar checkpoint inject`` do.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from .armed import arm, disarm
from .levels import file_levels, level_class
from .state import CheckpointError

__all__ = [
    "PHASES",
    "Fault",
    "parse_fault",
    "delete_node",
    "flip_bytes",
    "truncate_manifest",
    "shard_path",
]

PHASES = ("snapshot", "write", "before-commit", "after-commit")


class Fault:
    """One injected fault (see the module docstring)."""

    def __init__(
        self,
        kill: str | None = None,
        enospc: str | None = None,
        step: int | None = None,
        rank: int = 0,
        level: str | None = None,
        restart: int = 0,
        node: int | None = None,
        after: float = 0.0,
    ) -> None:
        self.kill, self.enospc, self.step, self.rank, self.level = kill, enospc, step, rank, level
        self.restart, self.node, self.after = restart, node, after
        self._born = time.monotonic()
        self.also: list[Fault] = []  # more faults of the same setting (``;``)
        self._my_node: int | None = None  # this rank's node and its local storage (bind)
        self._node_dir: Path | None = None

    def bind(self, node: int, node_dir: Path) -> None:
        """Tell this fault (and ``also``) this rank's node and its local storage."""
        for fault in (self, *self.also):
            fault._my_node, fault._node_dir = node, node_dir

    def die(self) -> None:
        """SIGKILL this process; for a node fault, its node's local storage goes first."""
        if self.node is not None:
            from hpcpar.runtime.exits import mark_node_lost

            mark_node_lost(self.node)
            if self._node_dir is not None:
                shutil.rmtree(self._node_dir, ignore_errors=True)
        os.kill(os.getpid(), signal.SIGKILL)

    def hits(self, step: int, rank: int) -> bool:
        """Whether this save on this rank, in this start of the job, is the target."""
        from hpcpar.runtime import settings

        this = settings.value("HPCPAR_RESTART") or 0
        mine = self._my_node == self.node if self.node is not None else rank == self.rank
        due = not self.after or time.monotonic() - self._born >= self.after
        return mine and self.step in (None, step) and this == self.restart and due

    def point(self, phase: str, step: int, rank: int, level: str | None = None) -> None:
        """Die here if this is the phase to kill at (of this fault or one of ``also``)."""
        for fault in (self, *self.also):
            if fault.kill != phase or not fault.hits(step, rank):
                continue
            if level is None or fault.level in (None, level):
                fault.die()

    def arm_write(self, step: int, rank: int, level: str) -> None:
        """Arm this thread's next shard write (ENOSPC, or a kill half way), if targeted."""
        hits = [f for f in (self, *self.also) if f.hits(step, rank)]
        dying = [f for f in hits if f.kill == "write" and f.level in (None, level)]
        arm(any(f.enospc == level for f in hits), dying[0].die if dying else None)

    @staticmethod
    def disarm() -> None:
        """Clear this thread's armed write faults (after each level's write)."""
        disarm()


def parse_fault(text: str | None) -> Fault | None:
    """``HPCPAR_CHECKPOINT_FAULT`` -> a Fault (the first, the rest in its ``also``), or None.

    Raises:
        CheckpointError: an unknown key, phase or value.
    """
    if not text:
        return None
    first, *rest = (_one_fault(part) for part in text.split(";"))
    first.also = rest
    return first


_KEYS = ("kill", "enospc", "step", "rank", "level", "restart", "node", "after")
_WHOLE = ("step", "rank", "restart", "node")


def _value(key: str, value: str) -> Any:
    """One entry's value: a whole number, seconds (``after``), or the text."""
    if key == "after":
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not 0 <= seconds < float("inf"):
            raise CheckpointError("HPCPAR_CHECKPOINT_FAULT: after must be seconds >= 0")
        return seconds
    if key in _WHOLE:
        try:
            return int(value)
        except ValueError:
            raise CheckpointError(f"HPCPAR_CHECKPOINT_FAULT: {key} must be an integer") from None
    return value


def _one_fault(text: str) -> Fault:
    fields: dict[str, Any] = {}
    for item in text.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep or key not in _KEYS:
            raise CheckpointError(
                f"HPCPAR_CHECKPOINT_FAULT: bad entry {item!r} "
                "(use kill=PHASE or enospc=LEVEL, with step=N, rank=R or node=N, level=NAME, "
                "restart=K, after=S)"
            )
        fields[key] = _value(key, value)
    if fields.get("kill") not in (None, *PHASES):
        raise CheckpointError(
            f"HPCPAR_CHECKPOINT_FAULT: unknown phase {fields['kill']!r}; one of {', '.join(PHASES)}"
        )
    for key in ("enospc", "level"):
        if key in fields and fields[key] not in file_levels():
            raise CheckpointError(
                f"HPCPAR_CHECKPOINT_FAULT: {key}={fields[key]!r} is not a level with files; "
                f"one of {', '.join(file_levels())}"
            )
    if "kill" not in fields and "enospc" not in fields:
        raise CheckpointError(
            "HPCPAR_CHECKPOINT_FAULT: no fault given (kill=PHASE or enospc=LEVEL)"
        )
    if "node" in fields and "rank" in fields:
        raise CheckpointError("HPCPAR_CHECKPOINT_FAULT: give rank=R or node=N, not both")
    for key in _WHOLE:
        if fields.get(key, 0) < 0:
            raise CheckpointError(f"HPCPAR_CHECKPOINT_FAULT: {key} must be >= 0")
    return Fault(**fields)


# ---- damage at rest ------------------------------------------------------------------


def _node_dir(root: Path, node: int, local_dir: Path | None = None) -> Path:
    return Path(local_dir or Path(root) / "nodes") / f"node{node}"


def delete_node(root: Path, node: int, local_dir: Path | None = None) -> Path:
    """Delete one node's local storage (its local, partner and XOR files)."""
    target = _node_dir(root, node, local_dir)
    if not target.is_dir():
        raise CheckpointError(f"{target}: no such node directory")
    shutil.rmtree(target)
    return target


def shard_path(root: Path, level: str, step: int, rank: int, node: int | None = None) -> Path:
    """Where a rank's own file of a version lives at a level (any node when not given).

    Raises:
        CheckpointError: unknown level, one without files, or no such file.
    """
    cls = level_class(level)
    if cls.in_memory:
        raise CheckpointError(f"level {level!r} keeps no files")
    root = Path(root)
    nodes = root / "nodes"
    name = f"rank{rank}.{cls.own_kind}"
    if not cls.node_local or node is not None:
        return cls.folder(root, nodes, step, node or 0) / name
    for found in sorted(nodes.glob("node*")):
        index = found.name.removeprefix("node")
        if index.isdigit() and (path := cls.folder(root, nodes, step, int(index)) / name).exists():
            return path
    raise CheckpointError(f"no {level} file of version {step} for rank {rank}")


def flip_bytes(path: Path, offset: int = 0, count: int = 1) -> None:
    """Invert ``count`` bytes of a file at ``offset`` (negative: from the end)."""
    data = bytearray(Path(path).read_bytes())
    if not data:
        raise CheckpointError(f"{path}: empty file")
    start = offset % len(data)
    for i in range(start, min(start + count, len(data))):
        data[i] ^= 0xFF
    Path(path).write_bytes(bytes(data))


def truncate_manifest(path: Path, keep: int = 40) -> None:
    """Cut a shard file inside its manifest (the trailer and the manifest's end are lost)."""
    size = Path(path).stat().st_size
    os.truncate(path, max(0, size - keep))
