"""What an algorithm is: the record each algorithm module fills in, and the table of them.

An algorithm module (``hpcpar/collectives/algorithms/``) describes itself completely:
for each collective it serves, a record with its schedule, its properties, its exact
message and byte counts, what the cost model must know of it, and its short label. The
selector, the cost model, ``explain()``, the simulator and the counters read these
records; no other module names an algorithm. ``register`` adds records (the built-in
ones are registered by ``hpcpar.collectives.algorithms``; another package can add its
own the same way).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import CollectiveError
from .names import COLLECTIVES

__all__ = [
    "Algorithm",
    "Shape",
    "ORDER_ANY",
    "ORDER_CONTIGUOUS",
    "ORDER_NONE",
    "LIBRARY",
    "TABLE",
    "register",
]

ORDER_ANY = "any"  # reduces in rank order on every layout
ORDER_CONTIGUOUS = "contiguous"  # in rank order when each node holds a contiguous run of ranks
ORDER_NONE = "none"  # reorders: commutative ops only
LIBRARY = "mpi"  # the MPI library's own call: always valid, the baseline, the default


@dataclass(frozen=True)
class Shape:
    """What the count formulas see of one call.

    Attributes:
        count: Elements in the call's buffer on this rank (allreduce, reduce, bcast:
            the vector; reduce_scatter: the full vector).
        itemsize: Bytes per element.
        root: The root of reduce and bcast.
        counts: Per-rank blocks (allgather, reduce_scatter, alltoall) or this rank's
            send counts (alltoallv).
        commutative: Whether the op is commutative.
    """

    count: int
    itemsize: int
    root: int = 0
    counts: tuple[int, ...] = ()
    commutative: bool = True

    @property
    def nbytes(self) -> int:
        """The vector's bytes."""
        return self.count * self.itemsize


@dataclass(frozen=True, kw_only=True)
class Algorithm:
    """One algorithm of one collective, as its module describes it (fields by keyword).

    Attributes:
        name: As passed in ``algorithm=``.
        collective: The collective it serves.
        run: Makes the schedule, in the collective's calling convention:
            allreduce(call, buf, op); reduce(call, buf, op, root); bcast(call, buf, root);
            allgather(call, out, counts); reduce_scatter(call, buf, op, counts);
            alltoall(call, send, recv, block); alltoallv(call, send, scounts, recv,
            rcounts); barrier(call).
        label: Two or three letters for the simulator's tables.
        counts: ``counts(c, groups, rank, shape)`` adds to the ``Counts`` ``c`` exactly
            what ``rank`` sends, reduces and waits for (``collectives.tally``); None for the
            library's call, whose messages hpcpar cannot see.
        order: ``ORDER_ANY``, ``ORDER_CONTIGUOUS`` or ``ORDER_NONE`` (reductions only).
        hierarchical: Whether it uses the node, leader and rail levels.
        classic: A flat textbook algorithm an MPI library may run itself; the model
            prices the library's call as the best of these when a profile has no table.
        folds: Folds a rank count that is not a power of two (the folded ranks sit idle
            while the others exchange).
        senders: ``senders(layout, rank)``: how many ranks of ``rank``'s node drive the
            network link at once (inter-node bytes are multiplied by it); None: all.
        stages: For pipelined algorithms, ``stages(layout, rank, shape)`` returns the
            ``Counts`` of one segment's stages and the number of segments; the model
            overlaps the stages of successive segments.
        segment_bytes: For pipelined algorithms, bytes per segment for an itemsize.
        summary: One line for ``hpcpar explain`` and the docs.
    """

    name: str
    collective: str
    run: Callable[..., Any]
    label: str
    counts: Callable[..., None] | None = None
    order: str = ORDER_ANY
    hierarchical: bool = False
    classic: bool = False
    folds: bool = False
    senders: Callable[[Any, int], int] | None = None
    stages: Callable[..., tuple[list[Any], int]] | None = None
    segment_bytes: Callable[[int], int] | None = None
    summary: str = ""


# collective -> name -> record; filled in place (lookups on the hot path stay one dict get)
TABLE: dict[str, dict[str, Algorithm]] = {name: {} for name in COLLECTIVES}


def register(*algorithms: Algorithm) -> None:
    """Add algorithm records to the table (a record with a known name replaces it).

    Raises:
        CollectiveError: an unknown collective, a record of the library's call with
            counts, or one of another algorithm without them.
    """
    for record in algorithms:
        if record.collective not in TABLE:
            raise CollectiveError(
                f"algorithm {record.name!r}: unknown collective {record.collective!r}"
            )
        if (record.counts is None) != (record.name == LIBRARY):
            raise CollectiveError(
                f"algorithm {record.name!r} of {record.collective}: every algorithm but "
                f"{LIBRARY!r} must give its exact counts"
            )
        TABLE[record.collective][record.name] = record
