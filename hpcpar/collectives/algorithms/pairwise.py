"""Pairwise exchange alltoall(v): p-1 rounds, any block sizes."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..call import Call, on_flat
from ..channel import Channel, offsets
from ..registry import Algorithm, Shape
from ..schedule import Schedule
from ..tally import Counts, Groups

__all__ = ["pairwise", "count_pairwise", "ALGORITHMS"]


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


def _alltoall(call: Call, send: Any, recv: Any, block: int) -> Schedule:
    counts = [block] * call.flat.size
    return pairwise(call.flat, send, counts, recv, counts)


def count_pairwise(c: Counts, g: Groups, rank: int, s: Shape) -> None:
    """What rank sends: its block for every other rank, one round each."""
    p = len(g.flat)
    for step in range(1, p):
        dest = (rank + step) % p
        c.send(s.counts[dest] * s.itemsize, g.flat[dest] == g.flat[rank])
        c.round(g.flat[dest] == g.flat[rank])


ALGORITHMS = (
    Algorithm(
        name="pairwise",
        collective="alltoall",
        run=_alltoall,
        label="PW",
        counts=count_pairwise,
        classic=True,
        summary="p-1 rounds: send to rank+s, receive from rank-s",
    ),
    Algorithm(
        name="pairwise",
        collective="alltoallv",
        run=on_flat(pairwise),
        label="PW",
        counts=count_pairwise,
        classic=True,
        summary="p-1 rounds: send to rank+s, receive from rank-s",
    ),
)
