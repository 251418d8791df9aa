"""Restoring a checkpoint: the newest version every rank can rebuild and verify.

Levels are tried fastest first; a rank whose copy at one level is lost or damaged is
served by the next. A version saved by another number of ranks goes to ``reshard``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .directory import Directory, every_committed
from .levels import LEVELS, Job, Level
from .reshard import LayoutError, restore_resharded
from .saving import Saver
from .state import CheckpointError, layouts_of, unflatten_state

__all__ = ["Loader"]


class Loader:
    """A checkpointer's restore; ``restored_from`` names the level that served each rank."""

    def __init__(
        self,
        comm: Any,
        directory: Directory,
        job: Job,
        levels: list[Level],
        memory: str | None,
        saver: Saver,
    ) -> None:
        self.comm, self.directory, self.job, self.levels = comm, directory, job, levels
        self.rank, self.size, self.root = directory.rank, directory.size, directory.root
        self.memory, self.saver = memory, saver
        self.restored_from: list[str] = []

    def restore(
        self, step: int | None, reshard: Any, per_rank: Any, committed: dict[str, list[int]]
    ) -> tuple[int, dict[str, Any]]:
        """``Checkpointer.restore`` given the committed versions per level (collective)."""
        newest = max((v for vs in committed.values() for v in vs), default=-1)
        mine = self.saver.snapshot[0] if self.saver.snapshot is not None else -1
        everyone = self.comm.allgather(mine)
        plain = reshard is None and per_rank is None
        if plain and len(set(everyone)) == 1 and mine >= max(newest, 0) and step in (None, mine):
            self.restored_from = [self.memory] * self.size
            self.saver.continue_from(mine, newest)
            flat = {
                k: (v.copy() if isinstance(v, np.ndarray) else v)
                for k, v in self.saver.snapshot[1].items()
            }  # type: ignore[index]
            return mine, unflatten_state(flat)
        saved = self.directory.on_root(
            lambda: {v: self.directory.saved_by(v) for v in every_committed(self.root)}
        )
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
                self.saver.continue_from(candidate, newest)
                return candidate, unflatten_state(flat)
            flat, why = self._recover(candidate, committed)
            if flat is not None:
                self.saver.continue_from(candidate, newest)
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


def _np_dtype(spec: Any) -> np.dtype:
    return np.dtype(spec if isinstance(spec, str) else [tuple(f) for f in spec])
