"""Bruck's alltoall: ceil(log2 p) rounds of packed blocks, for small equal blocks."""

from __future__ import annotations

import numpy as np

from ..call import on_flat
from ..channel import Channel
from ..registry import Algorithm, Shape
from ..schedule import Schedule
from ..tally import Counts, Groups

__all__ = ["bruck", "count_bruck", "ALGORITHMS"]


def bruck(ch: Channel, send: np.ndarray, recv: np.ndarray, block: int) -> Schedule:
    """ceil(log2 p) rounds of packed blocks; all blocks ``block`` elements long."""
    p, r = ch.size, ch.rank
    if block == 0:
        return
    blocks = send.reshape(p, block)
    work = np.concatenate([blocks[r:], blocks[:r]])  # row i: for rank (r + i) % p
    k = 1
    while k < p:
        rows = [i for i in range(p) if i & k]
        outgoing = np.ascontiguousarray(work[rows])
        incoming = np.empty_like(outgoing)
        yield ch.irecv(incoming, (r - k) % p) + ch.isend(outgoing, (r + k) % p)
        work[rows] = incoming
        k <<= 1
    # row i now holds the block from rank (r - i) % p
    out = recv.reshape(p, block)
    for i in range(p):
        out[(r - i) % p] = work[i]


def count_bruck(c: Counts, g: Groups, rank: int, s: Shape) -> None:
    """What rank sends: in round k, the rows of its blocks whose index has bit k set."""
    p = len(g.flat)
    block, k = s.counts[0], 1
    while k < p and block:
        rows = sum(1 for i in range(p) if i & k)
        c.send(rows * block * s.itemsize, g.flat[(rank + k) % p] == g.flat[rank])
        c.round(g.flat[(rank + k) % p] == g.flat[rank])
        k <<= 1


ALGORITHMS = (
    Algorithm(
        name="bruck",
        collective="alltoall",
        run=on_flat(bruck),
        label="BR",
        counts=count_bruck,
        classic=True,
        summary="ceil(log2 p) rounds of packed blocks: for small equal blocks",
    ),
)
