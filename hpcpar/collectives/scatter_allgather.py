"""Van de Geijn's bcast for large messages: binomial scatter, then ring allgather.

Each rank moves about 2(p-1)/p of the message instead of log2(p) full copies.
"""

from __future__ import annotations

import numpy as np

from . import binomial, ring
from .channel import Channel, even_counts
from .schedule import Schedule

__all__ = ["bcast"]


def bcast(ch: Channel, buf: np.ndarray, root: int) -> Schedule:
    """Copy the root's ``buf`` into every rank's ``buf``."""
    if ch.size == 1:
        return
    counts = even_counts(buf.size, ch.size)  # block i belongs to vrank i
    yield from binomial.scatter(ch, buf, counts, root)
    yield from ring.allgather(ch, buf, counts, shift=root)
