"""Alltoall algorithms: pairwise exchange (any sizes) and Bruck's (small, equal blocks)."""

from __future__ import annotations

import numpy as np

from .channel import Channel, offsets
from .schedule import Schedule

__all__ = ["pairwise", "bruck"]


def pairwise(
    ch: Channel, send: np.ndarray, send_counts: list[int], recv: np.ndarray, recv_counts: list[int]
) -> Schedule:
    """p-1 rounds; in round s send to rank+s and receive from rank-s."""
    p, r = ch.size, ch.rank
    so, ro = offsets(send_counts), offsets(recv_counts)
    recv[ro[r] : ro[r + 1]] = send[so[r] : so[r + 1]]
    for step in range(1, p):
        dest, source = (r + step) % p, (r - step) % p
        yield ch.irecv(recv[ro[source] : ro[source + 1]], source) + ch.isend(
            send[so[dest] : so[dest + 1]], dest
        )


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
