"""The MPI library's blocking allreduce with as little Python as possible.

``hpcpar.allreduce`` tries this first: numpy arrays, a predefined op on a native dtype,
the ``mpi`` algorithm (or ``auto`` choosing it), no argument checks. Every environment
variable that can change the decision is read raw on every call (a few dictionary
lookups), and the decision for a size, dtype, op and those variables is kept on the
communicator's state; anything else goes to the general path. With more ranks than
cores every microsecond of Python here costs several of wall time per call.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from ..runtime.env import RAW_ENVIRON
from ..runtime.flight import TRACING, fast_entry
from ..runtime.orphans import ADOPTED, progress_adopted
from ..runtime.settings import FALSE_WORDS, raw_key
from ..runtime.switches import HOT
from . import mpi_library
from .errors import explain_mpi_error
from .guard import signature, verify
from .ops import resolve_op
from .registry import LIBRARY
from .select import choose
from .state import FastDecision, fast_state

__all__ = ["fast_allreduce", "decided", "REREAD"]

_RAW = RAW_ENVIRON
_OFF = (b"", *(word.encode() for word in FALSE_WORDS))  # else the general path (on, or a typo)
_CHECK, _AUTOTUNE = raw_key("HPCPAR_CHECK"), raw_key("HPCPAR_AUTOTUNE")
_LAYOUT, _ALGORITHM = raw_key("HPCPAR_LAYOUT"), raw_key("HPCPAR_ALGORITHM_ALLREDUCE")
_RULES, _PROFILE = raw_key("HPCPAR_RULES"), raw_key("HPCPAR_PROFILE")
_IN_PLACE = MPI.IN_PLACE


def fast_allreduce(  # noqa: PLR0911, PLR0912 (inline: every helper call costs time here)
    x: Any, op: Any, out: Any, comm: Any, algorithm: str, tune_from_env: bool = True
) -> Any:
    """The MPI library's blocking Allreduce with as little Python as possible, or None.

    Taken only when the general path would do exactly this: numpy arrays, a predefined
    op on a native dtype, the ``mpi`` algorithm (``auto`` when it chooses it and
    ``HPCPAR_AUTOTUNE`` is off, or ``tune_from_env`` is False), no checks. It still
    takes a tag from the sequence, so every rank's sequence stays the same whichever
    path it took.
    """
    if _RAW is None or type(x) is not np.ndarray:
        return None
    if ADOPTED:  # dropped nonblocking calls still in flight: give them a chance
        progress_adopted()
    get = _RAW.get
    flag = get(_CHECK)
    if flag is not None and flag.strip().lower() not in _OFF:
        return None
    state = fast_state(comm, get(_LAYOUT) or b"")
    if state is None:
        return None
    if algorithm == "auto":
        if tune_from_env:
            flag = get(_AUTOTUNE)
            if flag is not None and flag.strip().lower() not in _OFF:
                return None
        # auto's choice depends on the size, the element size and three variables
        key: tuple[Any, ...] = (
            x.nbytes,
            x.dtype,
            id(op),
            get(_ALGORITHM),
            get(_RULES),
            get(_PROFILE),
        )
    elif algorithm == LIBRARY:
        key = (x.nbytes, x.dtype, id(op))
    else:
        return None
    decided = state.fast_auto.get(key)
    if decided is None or decided.op is not op:
        mpi_op = _decide(state, x, op, algorithm)
        mark = 0 if mpi_op is None else _signature(x, op)
        decided = state.fast_auto[key] = FastDecision(op, mpi_op, mark, x.nbytes, x.dtype)
        if len(state.fast_auto) > 4096:  # a program sweeping every size
            state.fast_auto.clear()
    mpi_op = decided.mpi_op
    if mpi_op is None or not x.flags.c_contiguous:
        return None
    if out is None:
        out = np.empty_like(x)
    elif (
        type(out) is not np.ndarray
        or out.shape != x.shape
        or (out.dtype is not x.dtype and out.dtype != x.dtype)
    ):
        return None
    else:
        flags = out.flags
        if not (flags.c_contiguous and flags.writeable):
            return None
    # next_tag(), blocking_allreduce() and note_library_call() inlined: calling them
    # costs a measurable share of a small call (hpcpar bench collectives: mpi against
    # mpi-direct)
    if HOT.recording and HOT.last_key is not decided:  # the flight record: a run is one entry
        fast_entry(decided, state, "allreduce", x, op)
    seq = state._sequence = state._sequence + 1  # next_tag() without the tag it computes
    if HOT.guard:  # the always-on mismatch guard: what _begin does (guard.py)
        if state.guard_run is not decided:  # a run of identical calls is folded at its end
            state.fold_guard_run(seq - 1)
            state.guard_run, state.guard_run_from = decided, seq
        if seq >= state.guard_next:
            verify(state, "allreduce")
    try:
        if out is x:
            state.private.Allreduce(_IN_PLACE, out, mpi_op)
        else:
            state.private.Allreduce(x, out, mpi_op)
    except MPI.Exception as exc:  # (free unless raised)
        raise explain_mpi_error(exc, "allreduce") from None
    HOT.last_call = decided.library_call  # note_library_call, inlined
    return out


REREAD = 63  # a caller of decided() reads the variables when the sequence is 63 mod 64


def decided(state: Any, recv: np.ndarray, op: Any) -> FastDecision | None:
    """``fast_allreduce``'s decision for such calls, if it was the library's call, or None.

    For callers whose arguments reach the library as they are (an intercepted mpi4py
    call: the library then checks the buffers and raises its own errors, so the array
    checks of ``fast_allreduce`` are left out). It is kept in ``state.fast_seen`` by
    ``(recv.nbytes, recv.dtype, id(op))``; callers call this again
    only on a miss and when the sequence number is ``REREAD`` mod 64 (the same calls on
    every rank): the variables the decision depends on are read then, not on every
    call, so a change takes effect within 64 calls. None: there is no decision yet, or
    it is not the library's call; ``fast_allreduce`` or the general path makes it.
    """
    if _RAW is None:
        return None
    get = _RAW.get
    env = (get(_CHECK), get(_AUTOTUNE), get(_ALGORITHM), get(_RULES), get(_PROFILE))
    if env != state.fast_seen_env:  # another decision may hold now
        state.fast_seen.clear()
        state.fast_seen_env = env
    for flag in env[:2]:
        if flag is not None and flag.strip().lower() not in _OFF:
            return None
    found = state.fast_auto.get((recv.nbytes, recv.dtype, id(op), *env[2:]))
    if found is None or found.op is not op or found.mpi_op is None:
        return None
    if len(state.fast_seen) > 4096:  # a program sweeping every size
        state.fast_seen.clear()
    state.fast_seen[(recv.nbytes, recv.dtype, id(op))] = found
    return found


def _signature(x: np.ndarray, op: Any) -> int:
    """The guard's signature of this call: the general path's for the same call."""
    name = resolve_op(op, x.dtype).name
    return signature(
        "allreduce", LIBRARY, name, {"count": x.size, "dtype": x.dtype.str, "reproducible": False}
    )


def _decide(state: Any, x: np.ndarray, op: Any, algorithm: str) -> Any:
    """The library's op for this call if it is the library's call, else None.

    None also while tracing (``HPCPAR_TRACE``): the general path records each call's
    start and end.
    """
    if not isinstance(op, MPI.Op) or TRACING:
        return None
    if algorithm == "auto":
        chosen = choose("allreduce", "auto", None, state, x.nbytes, x.itemsize)[0].name
        if chosen != LIBRARY:
            return None
    return mpi_library.native_mpi_op(op, x.dtype)
