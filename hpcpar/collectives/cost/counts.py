"""Exact messages and bytes an algorithm sends from one rank, from its own record (pure).

Each algorithm's module gives its counts in closed form over its steps (which peers a
rank sends to and how many bytes, which bytes it reduces, whether each message stays
within a node). The collectives' own counters (``last_stats()``) must equal these
numbers exactly; the tests check that for many layouts and sizes, which is what lets
the time model be trusted without timing.
"""

from __future__ import annotations

from ..algorithms import ALGORITHMS
from ..channel import even_counts
from ..registry import Shape
from ..tally import Counts, Layout, groups_of

__all__ = ["counts_for", "shape_of"]


def shape_of(
    collective: str,
    layout: Layout,
    count: int,
    itemsize: int,
    *,
    root: int = 0,
    counts: list[int] | None = None,
    commutative: bool = True,
) -> Shape:
    """A call's shape as the count formulas see it (per-rank blocks filled in)."""
    p = layout.size
    if collective == "allgather":
        blocks = list(counts) if counts is not None else [count] * p
    elif collective == "reduce_scatter":
        blocks = list(counts) if counts is not None else even_counts(count, p)
    elif collective == "alltoall":
        blocks = [count // p] * p
    else:
        blocks = list(counts or [])
    return Shape(count, itemsize, root, tuple(blocks), commutative)


def counts_for(
    collective: str,
    algorithm: str,
    layout: Layout,
    rank: int,
    count: int,
    itemsize: int,
    *,
    root: int = 0,
    counts: list[int] | None = None,
    commutative: bool = True,
) -> Counts | None:
    """Messages and bytes ``rank`` sends in one call; None for the library's own call.

    Args:
        collective: ``allreduce``, ``reduce``, ``bcast``, ``allgather``,
            ``reduce_scatter``, ``alltoall``, ``alltoallv`` or ``barrier``.
        algorithm: An algorithm of that collective.
        layout: The node of every rank.
        rank: The rank whose sends are counted.
        count: Elements in the call's buffer on this rank (allreduce, reduce, bcast:
            the vector; allgather: ignored when ``counts`` is given; reduce_scatter: the
            full vector; alltoall: the whole send buffer).
        itemsize: Bytes per element.
        root: The root of reduce and bcast.
        counts: Per-rank blocks (allgather, reduce_scatter) or this rank's send counts
            (alltoallv).
        commutative: Whether the op is commutative (reduce routes through rank 0 if not).

    Raises:
        ValueError: an unknown collective or algorithm.
    """
    record = ALGORITHMS.get(collective, {}).get(algorithm)
    if record is None:
        raise ValueError(f"no algorithm {algorithm!r} of collective {collective!r}")
    if record.counts is None:
        return None
    shape = shape_of(
        collective, layout, count, itemsize, root=root, counts=counts, commutative=commutative
    )
    c = Counts()
    record.counts(c, groups_of(layout, rank), rank, shape)
    return c
