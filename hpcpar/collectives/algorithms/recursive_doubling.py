"""Recursive doubling: log2(p) exchange steps, for small messages; any p, rank order kept.

Non-power-of-two sizes fold the first 2*rem ranks in pairs (the even one hands its data
to the odd one and waits), run on the remaining power of two, then unfold. Each
surviving rank stands for a contiguous block of ranks, and partners are combined lower
block first, so non-commutative ops are reduced in rank order.
"""

from __future__ import annotations

import numpy as np

from ..call import on_flat
from ..channel import Channel, combine, offsets
from ..registry import Algorithm
from ..schedule import Schedule
from ..tally import Counts, Layout

__all__ = [
    "fold",
    "fold_in",
    "unfold",
    "real_rank",
    "new_rank",
    "allreduce",
    "allgather",
    "count_fold_in",
    "count_unfold",
    "count_allreduce",
    "count_allgather",
    "folded_senders",
    "ALGORITHMS",
]


def fold(p: int) -> tuple[int, int]:
    """Return (largest power of two <= p, number of folded pairs)."""
    pof2 = 1 << (p.bit_length() - 1)
    return pof2, p - pof2


def real_rank(newrank: int, rem: int) -> int:
    """The rank that stands for ``newrank`` after folding ``rem`` pairs."""
    return newrank * 2 + 1 if newrank < rem else newrank + rem


def new_rank(rank: int, rem: int) -> int:
    """This rank's place among the survivors, or -1 if it was folded away."""
    if rank < 2 * rem:
        return rank // 2 if rank % 2 else -1
    return rank - rem


def fold_in(ch: Channel, buf: np.ndarray, tmp: np.ndarray, op: object, rem: int) -> Schedule:
    """The first 2*rem ranks pair up: the even one's data is reduced into the odd one's."""
    r = ch.rank
    if r < 2 * rem:
        if r % 2 == 0:
            yield ch.isend(buf, r + 1)
        else:
            yield ch.irecv(tmp, r - 1)
            combine(ch, op, tmp, buf, buf)


def allreduce(ch: Channel, buf: np.ndarray, op: object) -> Schedule:
    """Reduce ``buf`` over all ranks of ``ch`` in place."""
    p, r = ch.size, ch.rank
    if p == 1:
        return
    pof2, rem = fold(p)
    tmp = np.empty_like(buf)
    yield from fold_in(ch, buf, tmp, op, rem)
    me = new_rank(r, rem)
    if me >= 0:
        mask = 1
        while mask < pof2:
            peer = real_rank(me ^ mask, rem)
            yield ch.exchange(buf, tmp, peer)
            if peer < r:
                combine(ch, op, tmp, buf, buf)
            else:
                combine(ch, op, buf, tmp, buf)
            mask <<= 1
    yield from unfold(ch, buf, rem)


def unfold(ch: Channel, buf: np.ndarray, rem: int) -> Schedule:
    """Hand the result back to the ranks folded away at the start."""
    r = ch.rank
    if r < 2 * rem:
        yield ch.isend(buf, r - 1) if r % 2 else ch.irecv(buf, r + 1)


def allgather(ch: Channel, buf: np.ndarray, counts: list[int]) -> Schedule:
    """Fill every rank's block of ``buf`` (laid out by ``counts`` in rank order)."""
    p, r = ch.size, ch.rank
    if p == 1:
        return
    pof2, rem = fold(p)
    starts = offsets(counts)

    def span(first_new: int, last_new: int) -> slice:
        # Survivors first_new..last_new stand for a contiguous run of ranks.
        lo = first_new * 2 if first_new < rem else first_new + rem
        hi = real_rank(last_new, rem)
        return slice(starts[lo], starts[hi + 1])

    if r < 2 * rem:  # fold: the even rank's block travels with its odd partner
        block = buf[starts[r] : starts[r + 1]]
        yield (
            ch.isend(block, r + 1)
            if r % 2 == 0
            else ch.irecv(buf[starts[r - 1] : starts[r]], r - 1)
        )
    me = new_rank(r, rem)
    if me >= 0:
        mask = 1
        while mask < pof2:
            mine_lo = me & ~(mask - 1)
            peer_lo = mine_lo ^ mask
            peer = real_rank(me ^ mask, rem)
            yield ch.irecv(buf[span(peer_lo, peer_lo + mask - 1)], peer) + ch.isend(
                buf[span(mine_lo, mine_lo + mask - 1)], peer
            )
            mask <<= 1
    yield from unfold(ch, buf, rem)


# ---- exact counts ----------------------------------------------------------------------


def count_fold_in(c: Counts, nodes: list[int], me: int, nbytes: int, rem: int) -> None:
    """The fold: even ranks of the first ``2 rem`` send, odd ones wait and reduce."""
    if me < 2 * rem:
        partner = me + 1 if me % 2 == 0 else me - 1
        if me % 2 == 0:
            c.send(nbytes, nodes[partner] == nodes[me])
        else:
            c.reduced_bytes += nbytes
            c.wait(nbytes, nodes[partner] == nodes[me])
        c.round(nodes[partner] == nodes[me])
    elif rem:
        c.round(len(set(nodes[: 2 * rem])) == 1 and nodes[0] == nodes[me])  # waits for partners


def count_unfold(c: Counts, nodes: list[int], me: int, nbytes: int, rem: int) -> None:
    """The unfold: odd ranks of the first ``2 rem`` hand the result back."""
    if me < 2 * rem:
        partner = me - 1 if me % 2 else me + 1
        if me % 2:
            c.send(nbytes, nodes[partner] == nodes[me])
        c.round(nodes[partner] == nodes[me])


def count_allreduce(c: Counts, nodes: list[int], me: int, n: int, item: int) -> None:
    """What ``allreduce`` of ``n`` elements sends and reduces from position ``me``."""
    p = len(nodes)
    if p == 1:
        return
    pof2, rem = fold(p)
    count_fold_in(c, nodes, me, n * item, rem)
    newrank = new_rank(me, rem)
    if newrank >= 0:
        mask = 1
        while mask < pof2:
            peer = real_rank(newrank ^ mask, rem)
            c.send(n * item, nodes[peer] == nodes[me])
            c.reduced_bytes += n * item
            c.round(nodes[peer] == nodes[me])
            mask <<= 1
    count_unfold(c, nodes, me, n * item, rem)


def count_allgather(c: Counts, nodes: list[int], me: int, counts: list[int], item: int) -> None:
    """What ``allgather`` sends from position ``me`` of the group ``nodes``."""
    p = len(nodes)
    if p == 1:
        return
    pof2, rem = fold(p)
    starts = offsets(counts)

    def span_bytes(first_new: int, last_new: int) -> int:
        lo = first_new * 2 if first_new < rem else first_new + rem
        return (starts[real_rank(last_new, rem) + 1] - starts[lo]) * item

    if me < 2 * rem and me % 2 == 0:
        c.send(counts[me] * item, nodes[me + 1] == nodes[me])
    newrank = new_rank(me, rem)
    if newrank >= 0:
        mask = 1
        while mask < pof2:
            mine_lo = newrank & ~(mask - 1)
            peer = real_rank(newrank ^ mask, rem)
            c.send(span_bytes(mine_lo, mine_lo + mask - 1), nodes[peer] == nodes[me])
            mask <<= 1
    count_unfold(c, nodes, me, starts[-1] * item, rem)


def folded_senders(layout: Layout, rank: int) -> int:
    """The ranks of the node not folded away: they alone exchange while the others wait."""
    node = layout.node_ranks[layout.node_of[rank]]
    _, rem = fold(layout.size)
    return max(1, sum(1 for r in node if new_rank(r, rem) >= 0))


ALGORITHMS = (
    Algorithm(
        name="recursive_doubling",
        collective="allreduce",
        run=on_flat(allreduce),
        label="RD",
        counts=lambda c, g, rank, s: count_allreduce(c, g.flat, rank, s.count, s.itemsize),
        classic=True,
        folds=True,
        senders=folded_senders,
        summary="log2(p) exchanges of the whole vector: latency-optimal for small messages",
    ),
    Algorithm(
        name="recursive_doubling",
        collective="allgather",
        run=on_flat(allgather),
        label="RD",
        counts=lambda c, g, rank, s: count_allgather(c, g.flat, rank, list(s.counts), s.itemsize),
        classic=True,
        folds=True,
        senders=folded_senders,
        summary="log2(p) exchanges of doubling blocks",
    ),
)
