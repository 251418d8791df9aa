"""Ring algorithms: reduce-scatter, allgather, and allreduce as the two in sequence.

Bandwidth-optimal for large messages (each rank sends 2(p-1)/p of the data) at the
price of 2(p-1) latency terms. The reduce-scatter combines in ring order, so it needs a
commutative op.
"""

from __future__ import annotations

import numpy as np

from ..call import on_flat
from ..channel import Channel, combine, even_counts, offsets
from ..registry import ORDER_NONE, Algorithm
from ..schedule import Schedule
from ..tally import Counts, Layout, send_blocks, whole_node

__all__ = [
    "reduce_scatter",
    "allgather",
    "allreduce",
    "count_reduce_scatter",
    "count_allgather",
    "count_allreduce",
    "ALGORITHMS",
]


def reduce_scatter(ch: Channel, buf: np.ndarray, op: object, counts: list[int]) -> Schedule:
    """Leave block ``ch.rank`` of ``buf`` (blocks laid out by ``counts``) fully reduced."""
    p, r = ch.size, ch.rank
    starts = offsets(counts)
    tmp = np.empty(max(counts, default=0), dtype=buf.dtype)
    right, left = (r + 1) % p, (r - 1) % p
    for step in range(p - 1):
        send_block, recv_block = (r - step - 1) % p, (r - step - 2) % p
        send = buf[starts[send_block] : starts[send_block + 1]]
        mine = buf[starts[recv_block] : starts[recv_block + 1]]
        incoming = tmp[: counts[recv_block]]
        yield ch.irecv(incoming, left) + ch.isend(send, right)
        combine(ch, op, incoming, mine, mine)


def allgather(ch: Channel, buf: np.ndarray, counts: list[int], shift: int = 0) -> Schedule:
    """Fill every block of ``buf``; block ``(q - shift) % p`` comes from rank ``q``."""
    p, r = ch.size, ch.rank
    starts = offsets(counts)
    right, left = (r + 1) % p, (r - 1) % p
    for step in range(p - 1):
        send_block, recv_block = (r - shift - step) % p, (r - shift - step - 1) % p
        yield ch.irecv(buf[starts[recv_block] : starts[recv_block + 1]], left) + ch.isend(
            buf[starts[send_block] : starts[send_block + 1]], right
        )


def allreduce(ch: Channel, buf: np.ndarray, op: object) -> Schedule:
    """Reduce ``buf`` over all ranks of ``ch`` in place: reduce-scatter, then allgather."""
    if ch.size == 1:
        return
    counts = even_counts(buf.size, ch.size)
    yield from reduce_scatter(ch, buf, op, counts)
    yield from allgather(ch, buf, counts)


# ---- exact counts ----------------------------------------------------------------------


def count_reduce_scatter(
    c: Counts, nodes: list[int], me: int, counts: list[int], item: int
) -> None:
    """What ``reduce_scatter`` sends and reduces from position ``me`` of the group ``nodes``."""
    p = len(nodes)
    if p == 1:
        return
    send_blocks(c, counts, me, item, nodes[(me + 1) % p] == nodes[me])
    c.reduced_bytes += (sum(counts) - counts[(me - 1) % p]) * item
    c.round(nodes[(me + 1) % p] == nodes[me] and nodes[(me - 1) % p] == nodes[me], p - 1)


def count_allgather(
    c: Counts, nodes: list[int], me: int, counts: list[int], item: int, shift: int = 0
) -> None:
    """What ``allgather`` sends from position ``me`` of the group ``nodes``."""
    p = len(nodes)
    if p == 1:
        return
    send_blocks(c, counts, (me - shift + 1) % p, item, nodes[(me + 1) % p] == nodes[me])
    c.round(nodes[(me + 1) % p] == nodes[me] and nodes[(me - 1) % p] == nodes[me], p - 1)


def count_allreduce(c: Counts, nodes: list[int], me: int, n: int, item: int) -> None:
    """What ``allreduce`` of ``n`` elements sends and reduces from position ``me``."""
    p = len(nodes)
    if p == 1:
        return
    counts = even_counts(n, p)
    count_reduce_scatter(c, nodes, me, counts, item)
    count_allgather(c, nodes, me, counts, item)


def _senders(layout: Layout, rank: int) -> int:
    # one ring edge leaves each node when the nodes hold contiguous runs of ranks
    return 1 if layout.contiguous else whole_node(layout, rank)


ALGORITHMS = (
    Algorithm(
        name="ring",
        collective="allreduce",
        run=on_flat(allreduce),
        label="RG",
        counts=lambda c, g, rank, s: count_allreduce(c, g.flat, rank, s.count, s.itemsize),
        order=ORDER_NONE,
        classic=True,
        senders=_senders,
        summary="reduce-scatter then allgather around a ring: bandwidth-optimal, 2(p-1) steps",
    ),
    Algorithm(
        name="ring",
        collective="allgather",
        run=on_flat(allgather),
        label="RG",
        counts=lambda c, g, rank, s: count_allgather(c, g.flat, rank, list(s.counts), s.itemsize),
        classic=True,
        senders=_senders,
        summary="p-1 steps around a ring, one block each",
    ),
    Algorithm(
        name="ring",
        collective="reduce_scatter",
        run=on_flat(reduce_scatter),
        label="RG",
        counts=lambda c, g, rank, s: count_reduce_scatter(
            c, g.flat, rank, list(s.counts), s.itemsize
        ),
        order=ORDER_NONE,
        classic=True,
        senders=_senders,
        summary="p-1 steps around a ring, reducing one block each",
    ),
)
