"""Ring algorithms: reduce-scatter, allgather, and allreduce as the two in sequence.

Bandwidth-optimal for large messages (each rank sends 2(p-1)/p of the data) at the
price of 2(p-1) latency terms. The reduce-scatter combines in ring order, so it needs a
commutative op.
"""

from __future__ import annotations

import numpy as np

from .channel import Channel, combine, even_counts, offsets
from .schedule import Schedule

__all__ = ["reduce_scatter", "allgather", "allreduce"]


def reduce_scatter(ch: Channel, buf: np.ndarray, op: object, counts: list[int]) -> Schedule:
    """Leave block ``ch.rank`` of ``buf`` (blocks laid out by ``counts``) fully reduced."""
    p, r = ch.size, ch.rank
    starts = offsets(counts)
    tmp = np.empty(max(counts, default=0), dtype=buf.dtype)
    right, left = (r + 1) % p, (r - 1) % p
    for step in range(p - 1):
        send_block, recv_block = (r - step - 1) % p, (r - step - 2) % p
        send = buf[starts[send_block] : starts[send_block + 1]]
        mine = buf[starts[recv_block] : starts[recv_block + 1]]
        incoming = tmp[: counts[recv_block]]
        yield ch.irecv(incoming, left) + ch.isend(send, right)
        combine(ch, op, incoming, mine, mine)


def allgather(ch: Channel, buf: np.ndarray, counts: list[int], shift: int = 0) -> Schedule:
    """Fill every block of ``buf``; block ``(q - shift) % p`` comes from rank ``q``."""
    p, r = ch.size, ch.rank
    starts = offsets(counts)
    right, left = (r + 1) % p, (r - 1) % p
    for step in range(p - 1):
        send_block, recv_block = (r - shift - step) % p, (r - shift - step - 1) % p
        yield ch.irecv(buf[starts[recv_block] : starts[recv_block + 1]], left) + ch.isend(
            buf[starts[send_block] : starts[send_block + 1]], right
        )


def allreduce(ch: Channel, buf: np.ndarray, op: object) -> Schedule:
    """Reduce ``buf`` over all ranks of ``ch`` in place: reduce-scatter, then allgather."""
    if ch.size == 1:
        return
    counts = even_counts(buf.size, ch.size)
    yield from reduce_scatter(ch, buf, op, counts)
    yield from allgather(ch, buf, counts)
