"""Van de Geijn's bcast for large messages: binomial scatter, then ring allgather.

Each rank moves about 2(p-1)/p of the message instead of log2(p) full copies.
"""

from __future__ import annotations

import numpy as np

from ..call import on_flat
from ..channel import Channel, even_counts
from ..registry import Algorithm, Shape
from ..schedule import Schedule
from ..tally import Counts, Groups
from . import binomial, ring

__all__ = ["bcast", "count_bcast", "ALGORITHMS"]


def bcast(ch: Channel, buf: np.ndarray, root: int) -> Schedule:
    """Copy the root's ``buf`` into every rank's ``buf``."""
    if ch.size == 1:
        return
    counts = even_counts(buf.size, ch.size)  # block i belongs to vrank i
    yield from binomial.scatter(ch, buf, counts, root)
    yield from ring.allgather(ch, buf, counts, shift=root)


def count_bcast(c: Counts, g: Groups, rank: int, s: Shape) -> None:
    """What ``bcast`` sends from ``rank``: its share of the scatter and of the ring."""
    p = len(g.flat)
    if p > 1:
        counts = even_counts(s.count, p)
        binomial.count_scatter(c, g.flat, rank, counts, s.itemsize, s.root)
        ring.count_allgather(c, g.flat, rank, counts, s.itemsize, shift=s.root)


ALGORITHMS = (
    Algorithm(
        name="scatter_allgather",
        collective="bcast",
        run=on_flat(bcast),
        label="SA",
        counts=count_bcast,
        classic=True,
        summary="binomial scatter, then ring allgather (van de Geijn): for large messages",
    ),
)
