"""What hpcpar keeps per user communicator: a private duplicate, its hierarchy, tags.

The state is cached on the user's communicator with MPI attribute caching, so it is
created once (collectively, on the first collective call) and freed with it; creating
it checks that every rank runs with the same algorithm settings (``agree.py``). All of
hpcpar's messages run on the private duplicate and the hierarchy's communicators, so
they never match the user's own messages on the same communicator.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from mpi4py import MPI

from ..runtime import flight, settings
from ..runtime.abort import abort_job
from ..runtime.comm import default_comm, end_of_job, resolve_comm
from ..runtime.env import getenv_fast
from ..runtime.settings import raw_key
from ..runtime.switches import HOT
from ..topology import Hierarchy
from .agree import agree
from .channel import Channel, CollectiveStats
from .errors import CollectiveMismatchError
from .guard import compare_at_exit

__all__ = ["CommState", "FastDecision", "state_for", "fast_state", "TAGS_PER_CALL"]

TAGS_PER_CALL = 8  # sub-schedules of one call that run side by side use tag + 0..7
_KEYVAL: int | None = None
# The state of comm=None and the HPCPAR_LAYOUT it was made for (looked up on every call).
_DEFAULT: tuple[str, CommState, bytes] | None = None  # (layout, state, layout encoded)
_LAYOUT_KEY = raw_key("HPCPAR_LAYOUT")
_MADE = 0  # states made in this process: communicators are numbered in that order


class FastDecision:
    """The fast path's decision for one kind of allreduce, kept per communicator.

    Attributes:
        op: The op as the caller passed it (the decision is for that object).
        mpi_op: The library's op to call, or None: the call takes the general path.
        signature: The mismatch guard's signature of the call (0 with no ``mpi_op``).
        library_call: What the call leaves in ``HOT.last_call``: ``("allreduce", bytes)``.
        nbytes, dtype: The size and dtype of the call it was made for.
    """

    __slots__ = ("dtype", "library_call", "mpi_op", "nbytes", "op", "signature")

    def __init__(self, op: Any, mpi_op: Any, signature: int, nbytes: int, dtype: Any) -> None:
        self.op, self.mpi_op, self.signature = op, mpi_op, signature
        self.nbytes, self.dtype = nbytes, dtype
        self.library_call = ("allreduce", nbytes)


class CommState:
    """The private communicator, hierarchy and tag sequence behind one user communicator."""

    def __init__(self, comm: MPI.Intracomm, layout: str | None) -> None:
        self.private = comm if comm is default_comm() else comm.Dup()
        try:
            agree(self.private)  # the same algorithm settings on every rank
        except CollectiveMismatchError:
            if self.private is not comm:
                self.private.Free()
            raise
        global _MADE
        _MADE += 1
        if self.private is default_comm():
            label = "world"
        else:  # the predefined ones by their MPI names (an intercepted program's world)
            name = comm.Get_name()
            label = name if name in ("MPI_COMM_WORLD", "MPI_COMM_SELF") else f"comm{_MADE}"
        # names the communicator in the flight record; the same on every rank
        self.label = label + (f" ({layout})" if layout else "")
        self.hierarchy = Hierarchy(self.private, layout=layout)
        h = self.hierarchy
        self.size = self.private.Get_size()
        self.rank = self.private.Get_rank()
        self.node_of = list(h.node_of)
        self.node_ranks = [h.ranks_of_node(i) for i in range(h.n_nodes)]
        self.leader_ranks = [ranks[0] for ranks in self.node_ranks]
        self.rail_ranks = [
            ranks[h.local_rank] for ranks in self.node_ranks if len(ranks) > h.local_rank
        ]
        self.contiguous = self.node_of == sorted(self.node_of)
        tag_ub = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB) or 32767
        self._tag_slots = max(1, (min(int(tag_ub), 1 << 30) - 1) // TAGS_PER_CALL)
        self._sequence = 0
        self.guard_sum = 0  # the calls since the last comparison, weighted (guard.py)
        self.guard_from = 0  # the sequence number of the first of them
        self.guard_next = 1  # compare when the sequence reaches this
        # the fast path's run of identical calls not yet in guard_sum: its cached
        # decision and the sequence number of its first call
        self.guard_run: FastDecision | None = None
        self.guard_run_from = 0
        self.auto_cache: dict[tuple[object, ...], tuple[str, str]] = {}
        self.fast_auto: dict[tuple[object, ...], FastDecision] = {}  # allreduce's fast path
        # fastpath.decided()'s decisions by size, dtype and op, under these variables
        self.fast_seen: dict[tuple[object, ...], FastDecision] = {}
        self.fast_seen_env: tuple[bytes | None, ...] = ()
        self.fast_hit: FastDecision | None = None  # the last of them used
        self.tuned: dict[tuple[object, ...], tuple[str, str]] = {}  # autotune's winners
        self.tuned_quick: dict[tuple[object, ...], tuple[str, str]] = {}  # by call arguments

    def fold_guard_run(self, last: int | None = None) -> None:
        """Add the fast path's pending run of identical calls to the guard's sum.

        The run's calls are numbered ``guard_run_from`` to ``last`` (default: the last
        call made): their weights sum to the run's length times its middle number, one
        multiply for the run.
        """
        run = self.guard_run
        if run is not None:
            first = self.guard_run_from
            last = self._sequence if last is None else last
            self.guard_sum += run.signature * ((first + last) * (last - first + 1) // 2)
            self.guard_run = None

    def next_tag(self) -> int:
        """The base tag of the next collective call (every rank calls in the same order)."""
        if self.guard_run is not None:  # a call off the fast path ends its run
            self.fold_guard_run()
        tag = 1 + (self._sequence % self._tag_slots) * TAGS_PER_CALL
        self._sequence += 1
        return tag

    def channels(self, tag: int, stats: CollectiveStats) -> dict[str, Channel | None]:
        """Counted channels on the flat, node, leader and rail communicators for one call."""
        h = self.hierarchy
        node = [self.node_of[self.rank]] * h.local_size
        return {
            "flat": Channel(self.private, self.node_of, tag, stats),
            "node": Channel(h.node, node, tag, stats),
            "leaders": Channel(h.leaders, list(range(h.n_nodes)), tag, stats)
            if h.leaders
            else None,
            "rail": Channel(h.rail, [self.node_of[r] for r in self.rail_ranks], tag, stats),
        }

    def free(self) -> None:
        """Free the hierarchy and the private duplicate."""
        self.hierarchy.free()
        if self.private is not default_comm():
            self.private.Free()


def _delete(comm: Any, keyval: int, value: Any) -> None:
    for state in value.values():
        state.free()


def fast_state(comm: Any, layout: bytes | None = None) -> CommState | None:  # noqa: PLR0911
    """The state of ``comm`` if it exists already (no collective call), else None.

    ``layout``: ``HPCPAR_LAYOUT`` as the caller read it raw (``b""`` when unset), or
    None to read it here. ``comm`` may be the state itself, which a caller that keeps
    it (an intercepted communicator) passes to save the attribute lookup.
    """
    if type(comm) is CommState:
        return comm  # type: ignore[no-any-return]
    if comm is None:
        if _DEFAULT is None:
            return None
        if layout is None:
            layout = os.fsencode(getenv_fast("", _LAYOUT_KEY) or "")
        return _DEFAULT[1] if _DEFAULT[2] == layout else None
    if _KEYVAL is None:
        return None
    if isinstance(comm, Hierarchy):
        cache = comm.comm.Get_attr(_KEYVAL)
        return cache.get(comm.layout or "") if cache else None
    if isinstance(comm, MPI.Intracomm):
        cache = comm.Get_attr(_KEYVAL)
        if cache and len(cache) == 1:  # the usual case: one layout per communicator
            return next(iter(cache.values()))
    return None


def state_for(comm: Any) -> CommState:
    """Return the cached state for ``comm`` (None, a communicator or a Hierarchy).

    Collective the first time for each communicator and layout. For a plain
    communicator the layout is ``HPCPAR_LAYOUT`` as it was at that first use.
    """
    global _KEYVAL, _DEFAULT
    if (
        comm is None
        and _DEFAULT is not None
        and _DEFAULT[0] == (getenv_fast("", _LAYOUT_KEY) or "")
    ):
        return _DEFAULT[1]
    if isinstance(comm, MPI.Intracomm) and _KEYVAL is not None:
        cache = comm.Get_attr(_KEYVAL)
        if cache and "" in cache and len(cache) == 1:
            return cache[""]
    if isinstance(comm, Hierarchy):
        base, layout = comm.comm, comm.layout
    else:
        base, layout = resolve_comm(comm), settings.value("HPCPAR_LAYOUT") or None
    if _KEYVAL is None:
        _KEYVAL = MPI.Comm.Create_keyval(delete_fn=_delete)
    cache = base.Get_attr(_KEYVAL)
    if cache is None:
        cache = {}
        base.Set_attr(_KEYVAL, cache)
    key = layout or ""
    if key not in cache:
        # collective (a duplicate, the layout's communicators): a rank that waits here for
        # one that never comes is waiting in this set-up, not in its previous call
        previous = flight.setting_up("a new communicator", depth=3)
        try:
            cache[key] = CommState(base, layout)
        finally:
            HOT.current = previous
    if comm is None:
        _DEFAULT = (key, cache[key], os.fsencode(key))
    return cache[key]


def _compare_at_exit(comm: MPI.Intracomm) -> None:
    """As the program ends: the guard's last comparison on the world communicators.

    A difference is reported once (by rank 0) and ends the job with status 1, as an
    uncaught ``CollectiveMismatchError`` does.
    """
    if not HOT.guard:
        return
    bases = (default_comm(), MPI.COMM_WORLD) if _KEYVAL is not None else ()
    states = [state for base in bases for state in (base.Get_attr(_KEYVAL) or {}).values()]
    message = compare_at_exit(states, comm)
    if message is None:
        return
    if comm.Get_rank() == 0:
        sys.stderr.write(f"hpcpar: CollectiveMismatchError: {message}\n")
    abort_job(1)


end_of_job(_compare_at_exit)
