"""Binomial trees: bcast, reduce, gather and scatter in ceil(log2 p) rounds.

Ranks are renumbered relative to the root (``vrank``). The reduce combines a subtree of
consecutive vranks with the next one, lower first, so it keeps rank order when the root
is rank 0; the collectives layer routes non-commutative reductions through root 0.
"""

from __future__ import annotations

import numpy as np

from .channel import Channel, combine, offsets
from .schedule import Schedule

__all__ = ["bcast", "reduce", "gather", "scatter"]


def _parent_mask(vrank: int, p: int) -> int:
    """The lowest set bit of vrank (the round it receives in), or the first power >= p."""
    mask = 1
    while mask < p and not vrank & mask:
        mask <<= 1
    return mask


def bcast(ch: Channel, buf: np.ndarray, root: int) -> Schedule:
    """Copy the root's ``buf`` into every rank's ``buf``."""
    p = ch.size
    vrank = (ch.rank - root) % p
    mask = _parent_mask(vrank, p)
    if vrank:
        yield ch.irecv(buf, (vrank - mask + root) % p)
    sends = []
    mask >>= 1
    while mask > 0:
        if vrank + mask < p:
            sends += ch.isend(buf, (vrank + mask + root) % p)
        mask >>= 1
    yield sends


def reduce(ch: Channel, buf: np.ndarray, op: object, root: int) -> Schedule:
    """Reduce every rank's ``buf`` into the root's ``buf`` (others' ``buf`` is scratch)."""
    p = ch.size
    vrank = (ch.rank - root) % p
    tmp = np.empty_like(buf)
    mask = 1
    while mask < p:
        if vrank & mask:
            yield ch.isend(buf, (vrank - mask + root) % p)
            return
        child = vrank | mask
        if child < p:
            yield ch.irecv(tmp, (child + root) % p)
            combine(ch, op, buf, tmp, buf)
        mask <<= 1


def gather(ch: Channel, buf: np.ndarray, counts: list[int], root: int) -> Schedule:
    """Collect every rank's block into the root's ``buf``.

    ``buf`` holds the blocks in vrank order (block i belongs to rank ``(i + root) % p``);
    on entry each rank's own block is in place.
    """
    p = ch.size
    vrank = (ch.rank - root) % p
    starts = offsets(counts)
    mask = _parent_mask(vrank, p)
    receives = []
    child_mask = 1
    while child_mask < mask:  # all children at once: their blocks do not overlap
        child = vrank | child_mask
        if child < p:
            top = min(child + child_mask, p)
            receives += ch.irecv(buf[starts[child] : starts[top]], (child + root) % p)
        child_mask <<= 1
    yield receives
    if vrank:
        top = min(vrank + mask, p)
        yield ch.isend(buf[starts[vrank] : starts[top]], (vrank - mask + root) % p)


def scatter(ch: Channel, buf: np.ndarray, counts: list[int], root: int) -> Schedule:
    """Hand block i of the root's ``buf`` (vrank order) to rank ``(i + root) % p``.

    Each rank ends with its own block (and its subtree's) in place in ``buf``.
    """
    p = ch.size
    vrank = (ch.rank - root) % p
    starts = offsets(counts)
    mask = _parent_mask(vrank, p)
    if vrank:
        top = min(vrank + mask, p)
        yield ch.irecv(buf[starts[vrank] : starts[top]], (vrank - mask + root) % p)
    sends = []
    mask >>= 1
    while mask > 0:
        child = vrank + mask
        if child < p:
            top = min(child + mask, p)
            sends += ch.isend(buf[starts[child] : starts[top]], (child + root) % p)
        mask >>= 1
    yield sends
