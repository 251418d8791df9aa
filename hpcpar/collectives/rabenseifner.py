"""Rabenseifner's allreduce: recursive-halving reduce-scatter, recursive-doubling allgather.

Bandwidth like the ring (about 2(p-1)/p of the data per rank) with only 2*log2(p)
latency terms. Non-powers of two are folded as in recursive doubling. The halving runs
with growing distance, so each step combines two adjacent blocks of ranks, lower first:
rank order is kept and non-commutative ops are safe.
"""

from __future__ import annotations

import numpy as np

from .channel import Channel, combine
from .recursive_doubling import fold, fold_in, new_rank, real_rank, unfold
from .schedule import Schedule

__all__ = ["allreduce"]


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
