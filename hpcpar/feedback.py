"""Error feedback for compressed sums: what coding loses joins the next call's contribution.

``ErrorFeedback`` keeps one vector's residuals between compressed allreduces (one
object per vector, as torch's communication hooks keep one state per bucket). Coding
happens in two places, so there are two residuals: the ``worker`` residual of the
slice of its node's sum a rank codes, and the ``server`` residual of the chunk whose
total it codes. Each is added before its coding and left holding what that coding lost
(1-bit SGD, EF-SGD, and 1-bit Adam's worker and server errors), so the running sum of
compressed results tracks the running exact sum: what is lost once is sent later.

Everything held is owed to the sum exactly once, so it survives any change: when the
slice or chunk a rank codes changes (another layout, another rank count after a
restore) the old residuals are added to this rank's next contribution instead, and an
exact call (one node, or ``auto`` choosing exact) adds them all.

``state_dict()`` holds the residuals as a ``Sharded`` array of shape (ranks, 2, n), a
row per rank, so a ``Checkpointer`` saves and restores them; restored on the same ranks
each rank gets its own row back (bitwise the same run), on another count the rows
each rank receives are summed, which keeps what is owed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hpcpar.checkpoint import Sharded

from .collectives.errors import CollectiveError
from .collectives.state import state_for

__all__ = ["ErrorFeedback"]

_Span = tuple[int, int]


class ErrorFeedback:
    """The residuals of one vector's compressed allreduces on one communicator.

    Args:
        comm: The communicator of the calls (None: hpcpar's), for ``state_dict``.

    Pass it as ``feedback=`` to every ``hpcpar.allreduce`` of that vector; it may not be
    shared by two calls in flight at once.
    """

    def __init__(self, comm: Any = None) -> None:
        self.comm = comm
        self.n: int | None = None
        self._key: tuple[Any, ...] | None = None  # the spans the residuals are for
        self._worker = np.zeros(0, np.float32)  # the whole vector's positions
        self._server = np.zeros(0, np.float32)
        self._owed: np.ndarray | None = None  # (2, n) restored rows not yet placed

    def _check(self, n: int) -> None:
        if self.n is None:
            self.n = n
        elif self.n != n:
            raise CollectiveError(
                f"ErrorFeedback holds residuals of {self.n} elements, not {n}: "
                "use one ErrorFeedback per vector"
            )
        if self._worker.size != n:
            self._worker = np.zeros(n, np.float32)
            self._server = np.zeros(n, np.float32)

    def _placed(self) -> np.ndarray:
        """Everything held, as (2, n): worker and server residuals at their positions."""
        assert self.n is not None
        rows = np.zeros((2, self.n), np.float32) if self._owed is None else self._owed.copy()
        if self._worker.size:
            rows[0] += self._worker
            rows[1] += self._server
        return rows

    def _reset(self, owed: np.ndarray | None) -> None:
        self._key, self._owed = None, owed
        self._worker[...] = 0
        self._server[...] = 0

    def residuals(
        self, n: int, parts: list[_Span], chunks: list[_Span]
    ) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
        """The residuals for a call that codes ``parts`` (slices) and ``chunks`` (totals).

        Returns ``(extra, worker, server)``: ``worker`` and ``server`` are whole-vector
        float32 arrays whose spans the coder uses; ``extra`` is what this rank must add
        to its contribution once (residuals of spans it no longer codes, or restored
        ones), or None.
        """
        self._check(n)
        key = (tuple(parts), tuple(chunks))
        if key == self._key and self._owed is None:
            return None, self._worker, self._server
        rows = self._placed()
        keep = np.zeros((2, n), bool)
        for row, spans in ((0, parts), (1, chunks)):
            for a, b in spans:
                keep[row, a:b] = True
        self._worker[...] = np.where(keep[0], rows[0], 0)
        self._server[...] = np.where(keep[1], rows[1], 0)
        extra = np.where(keep, 0, rows).sum(axis=0, dtype=np.float32)
        self._key, self._owed = key, None
        return (extra if extra.any() else None), self._worker, self._server

    def settle(self, work: np.ndarray) -> None:
        """An exact call: add everything held to ``work`` (this rank's contribution)."""
        self._check(work.size)
        rows = self._placed()
        if rows.any():
            work += rows.sum(axis=0).astype(work.dtype, copy=False)
        self._reset(None)

    def owed(self) -> np.ndarray:
        """What this rank holds in all (the residuals summed at their positions)."""
        if self.n is None:
            return np.zeros(0, np.float32)
        return self._placed().sum(axis=0)

    def carry(self, owed: np.ndarray) -> None:
        """Take over ``owed`` (this vector's length, at its positions).

        It joins the next contribution: residuals of buckets laid out otherwise, say.
        """
        owed = np.asarray(owed, np.float32).reshape(-1)
        self._check(owed.size)
        rows = self._placed()
        rows[0] += owed
        self._reset(rows)

    def state_dict(self) -> dict[str, Any]:
        """The residuals, for ``Checkpointer.save`` (a row of a Sharded (ranks, 2, n) array)."""
        state = state_for(self.comm)
        n = self.n or 0
        rows = self._placed() if self.n is not None else np.zeros((2, 0), np.float32)
        return {"residual": Sharded(rows[None], (state.size, 2, n), (state.rank, 0, 0))}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Take residuals back from a restored ``state_dict`` (same or other rank count)."""
        leaf = saved.get("residual") if isinstance(saved, dict) else None
        if leaf is None:
            raise CollectiveError("ErrorFeedback.load_state_dict: no 'residual' in the state")
        block = np.asarray(leaf.block if isinstance(leaf, Sharded) else leaf, np.float32)
        if block.ndim != 3 or block.shape[1] != 2:
            raise CollectiveError(
                f"ErrorFeedback.load_state_dict: 'residual' has shape {block.shape}, "
                "not (rows, 2, n)"
            )
        n = block.shape[2]
        self.n = n if n else None
        self._worker = np.zeros(n, np.float32)
        self._server = np.zeros(n, np.float32)
        self._reset(block.sum(axis=0) if n else None)
