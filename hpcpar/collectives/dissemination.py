"""Dissemination barrier: ceil(log2 p) rounds, any p (Hensgen, Finkel and Manber)."""

from __future__ import annotations

import numpy as np

from .channel import Channel
from .schedule import Schedule

__all__ = ["barrier"]


def barrier(ch: Channel) -> Schedule:
    """In round k, signal rank+2^k and wait for rank-2^k."""
    p, r = ch.size, ch.rank
    token, inbox = np.zeros(1, np.uint8), np.zeros(1, np.uint8)
    k = 1
    while k < p:
        yield ch.irecv(inbox, (r - k) % p) + ch.isend(token, (r + k) % p)
        k <<= 1
