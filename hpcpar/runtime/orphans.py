"""Operations whose request was dropped unfinished: kept alive and completed in the background.

MPI may still read from or write into the buffers of an unfinished operation; if its
request object and buffers were freed with the Python handle, MPI would write into
freed memory (a crash, or wrong values in a later call). A handle dropped unfinished
hands its operation here instead: every later hpcpar call tests the adopted operations
(without blocking, so no call can deadlock on them), and at interpreter exit they are
completed before MPI is finalised. Nothing an adopted operation holds is freed before
MPI has finished with it.
"""

from __future__ import annotations

import atexit
import sys
import time
import warnings
from typing import Protocol

__all__ = ["Adoptable", "ADOPTED", "adopt", "progress_adopted", "drain_adopted", "EXIT_WAIT_S"]

EXIT_WAIT_S = 60.0  # at exit, how long adopted operations may take to complete


class Adoptable(Protocol):
    """What a dropped operation offers: progress without blocking, and a name."""

    def progress(self) -> bool:
        """Advance without blocking; return True once the operation has completed."""
        ...

    def describe(self) -> str:
        """What the operation is and where it was started, for warnings."""
        ...


ADOPTED: list[Adoptable] = []  # mutated in place, never rebound: callers test it cheaply
_FAILED: list[Adoptable] = []  # raised while completing: kept (MPI may still use them)
_registered = False
_busy = False  # progress_adopted is running (an operation's progress may call it again)


def adopt(operation: Adoptable) -> None:
    """Keep ``operation`` (and everything it holds) alive until it has completed."""
    global _registered
    ADOPTED.append(operation)
    if not _registered:
        _registered = True
        atexit.register(drain_adopted)


def progress_adopted() -> None:
    """Test every adopted operation once; drop those that have completed (never blocks)."""
    global _busy
    if not ADOPTED or _busy:
        return
    _busy = True
    try:
        _progress_once()
    finally:
        _busy = False


def _progress_once() -> None:
    gone = set()
    for operation in list(ADOPTED):  # operations dropped meanwhile wait for the next round
        try:
            finished = operation.progress()
        except Exception as exc:  # nobody waits for its result: say so, keep its memory
            _FAILED.append(operation)
            warnings.warn(
                f"hpcpar: a dropped {operation.describe()} failed while completing: {exc}",
                RuntimeWarning,
                stacklevel=3,
            )
            finished = True
        if finished:
            gone.add(id(operation))
    ADOPTED[:] = [op for op in ADOPTED if id(op) not in gone]


def drain_adopted(limit_s: float = EXIT_WAIT_S) -> bool:
    """Complete the adopted operations, waiting up to ``limit_s``; True if none is left.

    Run at exit (before MPI is finalised, which an unfinished operation would make
    erroneous). Operations that do not complete in time are left alive and named.
    """
    deadline = time.monotonic() + limit_s
    pause = 0.0
    while ADOPTED and time.monotonic() < deadline:
        progress_adopted()
        time.sleep(pause)
        pause = min(0.01, pause + 0.0005)
    if ADOPTED:
        names = "; ".join(op.describe() for op in ADOPTED[:3])
        sys.stderr.write(
            f"hpcpar: {len(ADOPTED)} dropped request(s) did not complete within {limit_s:g} s "
            f"at exit (the other ranks never took part?): {names}\n"
        )
        return False
    return True
