"""The always-on guard: ranks that call one collective differently fail, on every rank.

MPI leaves a collective whose ranks pass different dtypes, ops, counts, roots or
algorithms undefined, and the common outcome is not a hang but wrong numbers and exit
status 0 (a float32 sum against a float64 one of the same byte count, a SUM against a
MAX). ``HPCPAR_CHECK=1`` compares every call's arguments with an allgather; this guard
catches the same mistakes at almost no cost, with no setting.

Each call folds a signature of what must match across ranks (the operation, the
algorithm that runs, the op and the call's ``HPCPAR_CHECK`` fields: count, dtype, root,
...) into a sum weighted by the call's sequence number, ``sum += signature * seq``, kept
on the communicator's state: the order of the calls counts, so two calls swapped on one
rank change it as a changed call does (an unweighted sum would cancel). Calls ``i`` and
``j`` swapped change it by ``(s_i - s_j) * (j - i)``, never 0 for two different
signatures; compared modulo 2**62, that stays so for swaps fewer than 64 calls apart
and all but certainly (one chance in about 2**54) for any other. At the calls numbered
1, 2, 4, ..., ``EVERY`` and then every ``EVERY``-th on a communicator, before that call
moves any data, the ranks compare the sums of the calls since the last comparison with
one 16-byte allreduce. The allreduce fast path adds a run of identical calls in one
step when the run ends (``fold_guard_run`` on the communicator's state): the same sum.
Sums that differ raise ``CollectiveMismatchError`` on every rank,
naming the first call that differed and what each rank called (from the flight
record), so a mismatch from the first call on is caught before it computes anything
and a later one within ``EVERY`` calls, or at the end of the job, whichever comes first:
when the program ends normally every rank compares the calls on the world communicator
(hpcpar's default one and ``MPI.COMM_WORLD``) since their last comparison
(``compare_at_exit``), and a difference ends the job with the guard's error and status 1.
``hpcpar bench guard`` measures the cost.

A call whose byte count differs between ranks is reported by the MPI library when a
rank receives more than it expected (turned into ``CollectiveMismatchError``, see
``errors.explain_mpi_error``), but a rank that receives less is not told, and the call
can return a wrong result to it before the job ends. ``HPCPAR_CHECK=1`` compares every
call before it moves data.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
from mpi4py import MPI

from ..layout import format_ranks
from ..runtime import flight
from ..runtime.switches import HOT
from .errors import CollectiveMismatchError

__all__ = ["EVERY", "MASK", "compare_at_exit", "fold", "signature", "verify", "set_enabled"]

EVERY = 256  # calls between comparisons, once the first ones (1, 2, 4, ...) are done
MASK = (1 << 62) - 1  # the sums are compared modulo 2**62


def fold(total: int, mark: int, seq: int) -> int:
    """The guard's sum after call number ``seq`` of signature ``mark`` (fast path: inlined)."""
    return total + mark * seq


_KNOWN: dict[tuple[Any, ...], int] = {}  # signatures of calls seen (a loop repeats them)


def signature(collective: str, algorithm: str, op: Any, fields: dict[str, Any]) -> int:
    """A 56-bit number for what every rank must pass alike to one call (any process)."""
    try:
        key = (collective, algorithm, op, *fields.values())  # a collective names its fields alike
        return _KNOWN[key]
    except KeyError:
        pass
    except TypeError:  # a list of counts: not a dictionary key
        key = None
    plain = sorted((k, v.tolist() if hasattr(v, "tolist") else v) for k, v in fields.items())
    text = repr((collective.removeprefix("i"), algorithm, op, plain))
    mark = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=7).digest(), "little")
    if key is not None:
        if len(_KNOWN) > 4096:  # a program sweeping every size
            _KNOWN.clear()
        _KNOWN[key] = mark
    return mark


def set_enabled(on: bool) -> None:
    """Turn the guard on or off: on every rank at once (``hpcpar bench guard``)."""
    HOT.guard = bool(on)


def verify(state: Any, collective: str) -> None:
    """Compare the ranks' sums of the calls since the last comparison (collective).

    Called when ``state._sequence`` reaches ``state.guard_next``, which is the same on
    every rank that made the same calls.

    Raises:
        CollectiveMismatchError: on every rank, when the sums differ.
    """
    state.fold_guard_run()
    seq = state._sequence
    first = state.guard_from
    state.guard_next = seq + min(seq, EVERY)
    state.guard_from = seq
    mine = state.guard_sum & MASK
    state.guard_sum = 0
    both = np.array([mine, -mine], dtype=np.int64)
    state.private.Allreduce(MPI.IN_PLACE, both, MPI.MAX)
    if int(both[0]) == mine and -int(both[1]) == mine:
        return
    raise CollectiveMismatchError(_explain(state, collective, first, seq, mine))


def compare_at_exit(states: list[Any], comm: MPI.Intracomm) -> str | None:
    """Compare the calls since the last comparison of ``states`` as the job ends.

    ``states``: this rank's states of the world-wide communicators (a rank that never
    called on one has none); ``comm``: a world-wide communicator every rank has.
    Collective over ``comm``. Returns None when every rank made the same calls, else
    the guard's message (on every rank).
    """
    total = 0
    for state in states:
        state.fold_guard_run()
        total += state.guard_sum
    mine = total & MASK
    both = np.array([mine, -mine], dtype=np.int64)
    comm.Allreduce(MPI.IN_PLACE, both, MPI.MAX)
    if int(both[0]) == mine and -int(both[1]) == mine:
        return None
    for state in sorted(states, key=lambda s: s.label):
        if state.guard_sum & MASK:  # the first state with calls to compare, by name
            span = (state.guard_from, state._sequence + 1)
            return _explain(state, "the end of the job", *span, mine, comm)
    return _explain(None, "the end of the job", 0, 0, mine, comm)


def _explain(
    state: Any, collective: str, first: int, last: int, mine: int, comm: Any = None
) -> str:
    """What differed among the calls numbered ``first .. last - 1``.

    Collective over ``comm``, by default the state's own communicator.
    """
    calls = {}
    for record in flight.snapshot() if state is not None else ():
        if record["comm"] != state.label:
            continue
        for seq in range(record["seq"], record["seq"] + (record["calls"] or 1)):
            if first <= seq < last:
                calls[seq] = _what(record)
    every = (comm or state.private).allgather((mine, calls))
    tail = "; HPCPAR_CHECK=1 compares every call's arguments as it is made"
    for seq in range(first, last):
        seen: dict[str, list[int]] = {}
        for rank, (_, theirs) in enumerate(every):
            what = theirs.get(seq, "a call the flight record no longer holds")
            seen.setdefault(what, []).append(rank)
        if len(seen) > 1:
            parts = "; ".join(f"rank(s) {format_ranks(r)} called {w}" for w, r in seen.items())
            return f"{collective}: ranks differ at #{seq} on {state.label}: {parts}{tail}"
    where = f" on {state.label}" if state is not None else ""
    groups: dict[int, list[int]] = {}
    for rank, (theirs, _) in enumerate(every):
        groups.setdefault(theirs, []).append(rank)
    parts = " and ".join(f"rank(s) {format_ranks(r)}" for r in groups.values())
    calls = f"call #{first}" if last - first == 1 else f"one of calls #{first}-#{last - 1}"
    return (
        f"{collective}: {parts} passed different arguments (dtype, op, count, root, "
        f"algorithm or options) to {calls}{where}{tail}"
    )


def _what(record: dict[str, Any]) -> str:
    """``allreduce (mpi, count 3, float64, op SUM)``."""
    extra = [str(record["algorithm"])] if record.get("algorithm") else []
    for key, label in (("count", "count "), ("dtype", ""), ("op", "op "), ("root", "root ")):
        if record.get(key) is not None:
            extra.append(f"{label}{record[key]}")
    return f"{str(record['operation']).removeprefix('i')} ({', '.join(extra)})"
