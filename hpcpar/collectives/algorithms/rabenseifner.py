"""Rabenseifner's allreduce: recursive-halving reduce-scatter, recursive-doubling allgather.

Bandwidth like the ring (about 2(p-1)/p of the data per rank) with only 2*log2(p)
latency terms. Non-powers of two are folded as in recursive doubling. The halving runs
with growing distance, so each step combines two adjacent blocks of ranks, lower first:
rank order is kept and non-commutative ops are safe.
"""

from __future__ import annotations

import numpy as np

from ..call import on_flat
from ..channel import Channel, combine
from ..registry import Algorithm
from ..schedule import Schedule
from ..tally import Counts
from .recursive_doubling import (
    count_fold_in,
    count_unfold,
    fold,
    fold_in,
    folded_senders,
    new_rank,
    real_rank,
    unfold,
)

__all__ = ["allreduce", "count_allreduce", "ALGORITHMS"]


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
        lo, hi = 0, buf.size
        steps: list[tuple[int, int, int, int, int]] = []
        mask = 1
        while mask < pof2:  # reduce-scatter by recursive halving
            peer = real_rank(me ^ mask, rem)
            mid = lo + (hi - lo) // 2
            keep, give = ((lo, mid), (mid, hi)) if me & mask == 0 else ((mid, hi), (lo, mid))
            incoming = tmp[keep[0] : keep[1]]
            yield ch.irecv(incoming, peer) + ch.isend(buf[give[0] : give[1]], peer)
            mine = buf[keep[0] : keep[1]]
            if peer < r:
                combine(ch, op, incoming, mine, mine)
            else:
                combine(ch, op, mine, incoming, mine)
            steps.append((peer, keep[0], keep[1], give[0], give[1]))
            lo, hi = keep
            mask <<= 1
        for peer, keep_lo, keep_hi, give_lo, give_hi in reversed(steps):  # allgather
            yield ch.irecv(buf[give_lo:give_hi], peer) + ch.isend(buf[keep_lo:keep_hi], peer)
    yield from unfold(ch, buf, rem)


def count_allreduce(c: Counts, nodes: list[int], me: int, n: int, item: int) -> None:
    """What ``allreduce`` of ``n`` elements sends and reduces from position ``me``."""
    p = len(nodes)
    if p == 1:
        return
    pof2, rem = fold(p)
    count_fold_in(c, nodes, me, n * item, rem)
    newrank = new_rank(me, rem)
    if newrank >= 0:
        lo, hi, mask = 0, n, 1
        kept: list[tuple[int, int]] = []
        while mask < pof2:
            peer = real_rank(newrank ^ mask, rem)
            mid = lo + (hi - lo) // 2
            keep, give = ((lo, mid), (mid, hi)) if newrank & mask == 0 else ((mid, hi), (lo, mid))
            c.send((give[1] - give[0]) * item, nodes[peer] == nodes[me])
            c.reduced_bytes += (keep[1] - keep[0]) * item
            kept.append((peer, keep[1] - keep[0]))
            c.round(nodes[peer] == nodes[me], 2)  # once halving, once doubling
            lo, hi = keep
            mask <<= 1
        for peer, size in reversed(kept):
            c.send(size * item, nodes[peer] == nodes[me])
    count_unfold(c, nodes, me, n * item, rem)


ALGORITHMS = (
    Algorithm(
        name="rabenseifner",
        collective="allreduce",
        run=on_flat(allreduce),
        label="RB",
        counts=lambda c, g, rank, s: count_allreduce(c, g.flat, rank, s.count, s.itemsize),
        classic=True,
        folds=True,
        senders=folded_senders,
        summary="recursive halving then doubling: ring bandwidth in 2 log2(p) steps",
    ),
)
