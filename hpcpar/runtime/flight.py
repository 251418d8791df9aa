"""The flight record: each rank's last calls into hpcpar, always on.

Every collective (blocking or nonblocking), point-to-point call of ``hpcpar.p2p``,
halo exchange and checkpoint phase adds an entry to a ring of this rank's last
``SLOTS`` calls: the communicator and the call's sequence number on it, the operation,
the algorithm, count, dtype, op and root (or peer), the user's call site, and when it
started and ended. A run of identical calls one after another (the same allreduce in
a loop) is one entry whose ``calls`` grows: its site and start are the first call's,
its end the last one's. So a repeated call costs the fast path an identity test, an
increment and two stores, and the general path a comparison of its arguments;
``hpcpar bench flight`` measures both against the same loops with the record off.

``HOT.current`` (``runtime.switches``) is the entry of the last call the rank's own
thread started (a checkpoint's background commit does not count): whether the rank is
still blocked in it shows in that thread's stack, whose innermost frames are then
hpcpar's, so nothing is stored when a call returns. ``snapshot()`` turns the ring into
plain dictionaries for reports and traces; nothing here talks to other ranks.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from . import settings
from .packages import core_folders
from .switches import HOT

__all__ = [
    "SLOTS",
    "enter",
    "setting_up",
    "fast_entry",
    "finish",
    "point",
    "leave",
    "snapshot",
    "call_site",
    "mpi_op_name",
    "site_text",
    "enabled",
    "set_enabled",
    "clear",
    "FIELDS",
    "TRACING",
    "CALLS",
]

# HPCPAR_TRACE (hpcpar.runtime.trace): every call its own entry, many more kept; so
# with HOROVOD_TIMELINE, whose timeline (hpcpar.horovod.timeline) is drawn from this record
TRACING = bool(settings.value("HPCPAR_TRACE") or os.environ.get("HOROVOD_TIMELINE"))
SLOTS = 1 << 16 if TRACING else 512  # entries kept per rank (a power of two)
_MASK = SLOTS - 1

# An entry is a list (cheaper to make and update than an object), indexed by:
COMM, SEQ, OPERATION, ALGORITHM, COUNT, DTYPE, OP, ROOT, SITE, START, END, CALLS = range(12)
FIELDS = (
    "comm",
    "seq",
    "operation",
    "algorithm",
    "count",
    "dtype",
    "op",
    "root",
    "site",
    "start",
    "end",
    "calls",
)

RING: list[list[Any] | None] = [None] * SLOTS
_INSIDE_PATHS = core_folders()


def enabled() -> bool:
    """Whether calls are recorded (``HPCPAR_FLIGHT=0`` turns the record off)."""
    return HOT.recording


def set_enabled(on: bool) -> None:
    """Turn recording on or off for this process (the overhead benchmark compares both)."""
    HOT.recording = bool(on)
    HOT.last_key = HOT.last_entry = None


def clear() -> None:
    """Forget every entry (tests)."""
    for i in range(SLOTS):
        RING[i] = None
    HOT.at = 0
    _COUNTS.clear()
    HOT.current = None
    HOT.last_key = HOT.last_entry = None


def call_site(depth: int = 1) -> tuple[Any, int] | None:
    """The innermost frame outside hpcpar's own packages, as (code, instruction offset).

    Frames of ``hpcpar`` and ``checkpoint`` count as inside; a user's script, a test or
    an app is the call site. ``depth``: the first frame to look at, counted from this
    function (1: its caller); the frames below it must be hpcpar's. Starting there
    saves a frame object for each frame skipped. Kept as the code object and offset,
    cheap to take; ``site_text`` renders ``file:line in function``.
    """
    try:
        frame = sys._getframe(depth)
    except ValueError:
        frame = sys._getframe(1)
    known = _INSIDE_CODE
    while frame is not None:
        code = frame.f_code
        seen = known.get(id(code))  # by id: a code object hashes its contents
        if seen is None or seen[0] is not code:
            seen = known[id(code)] = (code, code.co_filename.startswith(_INSIDE_PATHS))
        if not seen[1]:
            return code, frame.f_lasti
        frame = frame.f_back
    return None


_INSIDE_CODE: dict[int, tuple[Any, bool]] = {}  # the codes seen, each held by its entry


def site_text(site: tuple[Any, int] | None) -> str:
    """``file:line in function`` of a ``call_site()``."""
    if site is None:
        return "unknown"
    code, offset = site
    line = code.co_firstlineno
    for start, end, number in code.co_lines():
        if start <= offset < end and number is not None:
            line = number
            break
    return f"{code.co_filename}:{line} in {code.co_name}"


def enter(
    comm: str,
    seq: int,
    operation: str,
    algorithm: str = "",
    count: Any = None,
    dtype: Any = None,
    op: Any = None,
    root: Any = None,
    depth: int = 1,
    current: bool = True,
) -> list[Any] | None:
    """Record the start of a call; returns its entry (for ``finish``), or None when off.

    The same call as the last one recorded, next in its communicator's sequence, adds
    to that entry's ``calls`` instead of making a new one. ``depth``: how many frames
    between this function and the user's are hpcpar's for certain (1: the caller).
    ``current``: the rank's own thread makes the call (``CURRENT`` follows it), not a
    background one.
    """
    if not HOT.recording:
        return None
    if HOT.named is not None:  # the program's own name of the call (an intercepted one)
        operation, HOT.named = HOT.named, None
    key = (comm, operation, algorithm, count, dtype, op, root)
    last = HOT.last_entry
    if not TRACING and last is not None and HOT.last_key == key and last[SEQ] + last[CALLS] == seq:
        last[CALLS] += 1
        if current:
            HOT.current = last
        return last
    entry = [
        comm,
        seq,
        operation,
        algorithm,
        count,
        dtype,
        op,
        root,
        call_site(depth + 2),
        time.time(),
        None,
        1,
    ]
    RING[HOT.at & _MASK] = entry
    HOT.at += 1
    HOT.last_key, HOT.last_entry = key, entry
    if current:
        HOT.current = entry
    return entry


def setting_up(what: str, depth: int = 1) -> list[Any] | None:
    """Show a collective step before a call's own entry as this rank's current call.

    ``what`` names it (setting up a new communicator, say); nothing is added to the
    record. Returns the entry it replaced in ``CURRENT``, to put back after it.
    """
    previous = HOT.current
    if HOT.recording:
        HOT.current = [
            what,
            0,
            "set-up",
            "",
            None,
            None,
            None,
            None,
            call_site(depth + 2),
            time.time(),
            None,
            1,
        ]
    return previous


def fast_entry(decided: Any, state: Any, operation: str, x: Any, op: Any) -> list[Any]:
    """A new entry for the fast path's call, the first of a run of identical calls.

    The run's later calls store nothing: its ``calls`` is read off the communicator's
    sequence (``state._sequence``, or the next entry on it) when the record is read.
    """
    # the frames in between: this one, fast_allreduce and hpcpar.allreduce
    if HOT.named is not None:  # the program's own name of the call (an intercepted one)
        operation, HOT.named = HOT.named, None
    entry = [
        state.label,
        state._sequence,
        operation,
        "mpi",
        x.size,
        x.dtype,
        op,
        None,
        call_site(4),
        time.time(),
        None,
        None,
        state,
    ]
    RING[HOT.at & _MASK] = entry
    HOT.at += 1
    HOT.last_key, HOT.last_entry = decided, entry
    HOT.current = entry
    return entry


def finish(entry: list[Any] | None) -> None:
    """Record the end of ``entry``'s call (None: nothing was recorded)."""
    if entry is not None:
        entry[END] = time.time()


_COUNTS: dict[str, int] = {}  # calls recorded by ``point`` per channel


def point(
    operation: str,
    channel: str,
    peer: Any = None,
    data: Any = None,
    *,
    current: bool = True,
    depth: int = 1,
) -> list[Any] | None:
    """Record a point-to-point call, a halo exchange or a checkpoint phase.

    ``channel`` names what the sequence number counts (``p2p``, ``halo``,
    ``checkpoint``): this rank's calls of that kind, which need not line up with other
    ranks' as a collective's do. ``peer`` goes in the root field; ``data``'s size and
    dtype (an array's, or a count) in count and dtype. ``current``: the rank's own
    thread makes the call (not a background one). ``depth`` as for ``enter``.
    """
    if not HOT.recording:
        return None
    seq = _COUNTS.get(channel, 0)
    _COUNTS[channel] = seq + 1
    count = getattr(data, "size", data)
    return enter(
        channel,
        seq,
        operation,
        "",
        count,
        getattr(data, "dtype", None),
        None,
        peer,
        depth + 1,
        current,
    )


def leave(entry: list[Any] | None) -> None:
    """The call ``point`` recorded has returned: stamp its end."""
    if entry is not None:
        entry[END] = time.time()


_MPI_OPS = (
    "SUM",
    "PROD",
    "MIN",
    "MAX",
    "LAND",
    "LOR",
    "LXOR",
    "BAND",
    "BOR",
    "BXOR",
    "MINLOC",
    "MAXLOC",
    "REPLACE",
    "NO_OP",
)


def mpi_op_name(op: Any) -> str:
    """``SUM`` for ``MPI.SUM`` (every predefined op by its name), else "an MPI user op"."""
    from mpi4py import MPI

    return next((n for n in _MPI_OPS if op == getattr(MPI, n, None)), "an MPI user op")


def _name(value: Any) -> Any:
    if value is None or isinstance(value, (int, float, str, bool)):
        return value
    from mpi4py import MPI

    if isinstance(value, MPI.Op):
        return mpi_op_name(value)
    name = getattr(value, "name", None)  # ops (hpcpar's and MPI's), numpy dtypes
    if isinstance(name, str) and name:
        return name
    return str(value)


def _dtype_name(value: Any) -> Any:
    """``float64`` for a dtype or its code (``<f8``); other values as ``_name`` gives them."""
    if isinstance(value, str) and value[:1] in "<>|=":
        import numpy as np

        try:
            return np.dtype(value).name
        except TypeError:
            return value
    return _name(value)


def snapshot(last: int | None = None) -> list[dict[str, Any]]:
    """The ring's entries (the ``last`` ones), oldest first, as plain dictionaries.

    A run of identical calls has ``calls`` > 1: its ``seq`` is the first call's and the
    last one's is ``seq + calls - 1``; its ``end`` is None (the run's calls end when
    the next entry starts).
    """
    made = HOT.at
    keep = SLOTS if last is None else min(SLOTS, max(0, last))
    entries = [RING[i & _MASK] for i in range(max(0, made - keep), made)]
    entries = [e for e in entries if e is not None]
    out = []
    for i, entry in enumerate(entries):
        record = {key: _name(value) for key, value in zip(FIELDS, entry, strict=False)}
        record["site"] = site_text(entry[SITE])
        record["dtype"] = _dtype_name(entry[DTYPE])
        record["current"] = entry is HOT.current
        if entry[CALLS] is None:  # a fast-path run: up to the next call on its communicator
            later = next((e[SEQ] for e in entries[i + 1 :] if e[COMM] == entry[COMM]), None)
            record["calls"] = (later if later is not None else entry[-1]._sequence) - entry[SEQ]
        out.append(record)
    return out
