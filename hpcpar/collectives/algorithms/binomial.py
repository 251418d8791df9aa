"""Binomial trees: bcast, reduce, gather and scatter in ceil(log2 p) rounds.

Ranks are renumbered relative to the root (``vrank``). The reduce combines a subtree of
consecutive vranks with the next one, lower first, so it keeps rank order when the root
is rank 0; a non-commutative reduction to another root goes through rank 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..call import Call, on_flat
from ..channel import Channel, combine, offsets
from ..registry import Algorithm, Shape
from ..schedule import Schedule
from ..tally import Counts

__all__ = [
    "bcast",
    "reduce",
    "gather",
    "scatter",
    "count_bcast",
    "count_reduce",
    "count_gather",
    "count_scatter",
    "ALGORITHMS",
]


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


def _reduce_call(call: Call, buf: Any, op: Any, root: int) -> Schedule:
    # Rank order is kept only with rank 0 as the tree's root; forward from there.
    if op.commutative or root == 0:
        yield from reduce(call.flat, buf, op, root)
        return
    yield from reduce(call.flat, buf, op, 0)
    if call.flat.rank == 0:
        yield call.flat.isend(buf, root)
    elif call.flat.rank == root:
        yield call.flat.irecv(buf, 0)


# ---- exact counts ----------------------------------------------------------------------


def _tree_rounds(c: Counts, nodes: list[int]) -> None:
    """A binomial tree's depth: every rank's critical path has that many rounds."""
    c.round(len(set(nodes)) == 1, (len(nodes) - 1).bit_length())


def count_bcast(c: Counts, nodes: list[int], me: int, nbytes: int, root: int) -> None:
    """What ``bcast`` of ``nbytes`` sends from position ``me`` of the group ``nodes``."""
    p = len(nodes)
    vrank = (me - root) % p
    mask = _parent_mask(vrank, p) >> 1
    while mask > 0:
        if vrank + mask < p:
            c.send(nbytes, nodes[(vrank + mask + root) % p] == nodes[me])
        mask >>= 1
    _tree_rounds(c, nodes)


def count_reduce(c: Counts, nodes: list[int], me: int, nbytes: int, root: int) -> None:
    """What ``reduce`` of ``nbytes`` sends and reduces from position ``me``."""
    p = len(nodes)
    vrank = (me - root) % p
    _tree_rounds(c, nodes)
    mask = 1
    while mask < p:
        if vrank & mask:
            c.send(nbytes, nodes[(vrank - mask + root) % p] == nodes[me])
            return
        if vrank | mask < p:
            c.reduced_bytes += nbytes
        mask <<= 1


def count_gather(
    c: Counts, nodes: list[int], me: int, counts: list[int], item: int, root: int
) -> None:
    """What ``gather`` sends from position ``me`` (blocks of ``counts`` elements)."""
    p = len(nodes)
    vrank = (me - root) % p
    mask = _parent_mask(vrank, p)
    starts = offsets(counts)
    if vrank:
        top = min(vrank + mask, p)
        c.send((starts[top] - starts[vrank]) * item, nodes[(vrank - mask + root) % p] == nodes[me])
    _tree_rounds(c, nodes)


def count_scatter(
    c: Counts, nodes: list[int], me: int, counts: list[int], item: int, root: int
) -> None:
    """What ``scatter`` sends from position ``me`` (blocks of ``counts`` elements)."""
    p = len(nodes)
    vrank = (me - root) % p
    starts = offsets(counts)
    mask = _parent_mask(vrank, p) >> 1
    while mask > 0:
        child = vrank + mask
        if child < p:
            top = min(child + mask, p)
            c.send((starts[top] - starts[child]) * item, nodes[(child + root) % p] == nodes[me])
        mask >>= 1
    _tree_rounds(c, nodes)


def _count_reduce_call(c: Counts, g: Any, rank: int, s: Shape) -> None:
    if s.commutative or s.root == 0:
        count_reduce(c, g.flat, rank, s.nbytes, s.root)
        return
    count_reduce(c, g.flat, rank, s.nbytes, 0)
    if rank == 0:
        c.send(s.nbytes, g.flat[s.root] == g.flat[0])


ALGORITHMS = (
    Algorithm(
        name="binomial",
        collective="reduce",
        run=_reduce_call,
        label="BN",
        counts=_count_reduce_call,
        classic=True,
        summary="a binomial tree: ceil(log2 p) rounds of the whole vector",
    ),
    Algorithm(
        name="binomial",
        collective="bcast",
        run=on_flat(bcast),
        label="BN",
        counts=lambda c, g, rank, s: count_bcast(c, g.flat, rank, s.nbytes, s.root),
        classic=True,
        summary="a binomial tree: ceil(log2 p) rounds of the whole message",
    ),
)
