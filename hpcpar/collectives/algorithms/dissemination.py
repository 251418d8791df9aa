"""Dissemination barrier: ceil(log2 p) rounds, any p (Hensgen, Finkel and Manber)."""

from __future__ import annotations

import numpy as np

from ..call import on_flat
from ..channel import Channel
from ..registry import Algorithm
from ..schedule import Schedule
from ..tally import Counts

__all__ = ["barrier", "count_barrier", "ALGORITHMS"]


def barrier(ch: Channel) -> Schedule:
    """In round k, signal rank+2^k and wait for rank-2^k."""
    p, r = ch.size, ch.rank
    token, inbox = np.zeros(1, np.uint8), np.zeros(1, np.uint8)
    k = 1
    while k < p:
        yield ch.irecv(inbox, (r - k) % p) + ch.isend(token, (r + k) % p)
        k <<= 1


def count_barrier(c: Counts, nodes: list[int], me: int) -> None:
    """What ``barrier`` sends from position ``me`` of the group ``nodes``: a byte a round."""
    p, k = len(nodes), 1
    while k < p:
        c.send(1, nodes[(me + k) % p] == nodes[me])
        c.round(nodes[(me + k) % p] == nodes[me])
        k <<= 1


ALGORITHMS = (
    Algorithm(
        name="dissemination",
        collective="barrier",
        run=on_flat(barrier),
        label="DS",
        counts=lambda c, g, rank, s: count_barrier(c, g.flat, rank),
        classic=True,
        summary="ceil(log2 p) rounds of one-byte messages, any p",
    ),
)
