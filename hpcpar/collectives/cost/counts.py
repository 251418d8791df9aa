"""Exact messages and bytes each algorithm sends from one rank (pure; no MPI).

Every function mirrors one algorithm of ``hpcpar/collectives`` in closed form over its
steps: which peers a rank sends to and how many bytes, which bytes it reduces, and
whether each message stays within a node. The collectives' own counters
(``last_stats()``) must equal these numbers exactly; the tests check that for many
layouts and sizes, which is what lets the time model be trusted without timing.

A group (a communicator) is described by ``nodes``: the node index of each of its
members in communicator order; ``me`` is this rank's position in it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property, lru_cache

import numpy as np

from ..channel import even_counts, offsets
from ..multi_leader import slice_counts
from ..pipelined import segment_elements
from ..recursive_doubling import fold, new_rank, real_rank
from ..two_level import LARGE_BYTES, leaders_use_ring

__all__ = ["Counts", "counts_for", "Layout"]


@dataclass
class Counts:
    """What one rank sends and reduces in one collective call."""

    messages_intra: int = 0
    bytes_intra: int = 0
    messages_inter: int = 0
    bytes_inter: int = 0
    reduced_bytes: int = 0
    rounds_intra: int = 0
    rounds_inter: int = 0
    # bytes this rank waits to receive before it can go on (a fold's whole vector);
    # priced on its path, not counted as its messages
    waited_intra: int = 0
    waited_inter: int = 0

    def round(self, same_node: bool, k: int = 1) -> None:
        """Count ``k`` communication rounds on this rank's critical path (latency terms).

        A round costs one latency even when its message is empty: the next round
        waits for it (a ring's blocks travel one hop per round).
        """
        if same_node:
            self.rounds_intra += k
        else:
            self.rounds_inter += k

    @property
    def rounds(self) -> int:
        """All rounds."""
        return self.rounds_intra + self.rounds_inter

    def send(self, nbytes: int, same_node: bool) -> None:
        """Count one message (empty ones are never sent)."""
        if nbytes <= 0:
            return
        if same_node:
            self.messages_intra += 1
            self.bytes_intra += nbytes
        else:
            self.messages_inter += 1
            self.bytes_inter += nbytes

    def __iadd__(self, other: Counts) -> Counts:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def as_tuple(self) -> tuple[int, int, int, int, int]:
        """(messages_intra, bytes_intra, messages_inter, bytes_inter, reduced_bytes)."""
        return (
            self.messages_intra,
            self.bytes_intra,
            self.messages_inter,
            self.bytes_inter,
            self.reduced_bytes,
        )


@dataclass(frozen=True)
class Layout:
    """Which node each rank is on (the whole job), with the derived groups."""

    node_of: tuple[int, ...]

    @property
    def size(self) -> int:
        """Ranks in the job."""
        return len(self.node_of)

    @cached_property
    def node_ranks(self) -> list[list[int]]:
        """Ranks of each node, in rank order."""
        out: list[list[int]] = [[] for _ in range(max(self.node_of) + 1)]
        for r, node in enumerate(self.node_of):
            out[node].append(r)
        return out

    @cached_property
    def local_rank(self) -> list[int]:
        """Each rank's position on its node."""
        out = [0] * self.size
        for ranks in self.node_ranks:
            for i, r in enumerate(ranks):
                out[r] = i
        return out


# ---- flat building blocks on one group ---------------------------------------------------


def _send_blocks(c: Counts, counts: list[int], skipped: int, item: int, same_node: bool) -> None:
    """Every block but one goes to the same neighbour: count them all at once."""
    blocks = np.asarray(counts, dtype=np.int64)
    total = int(blocks.sum()) - int(blocks[skipped])
    messages = int(np.count_nonzero(blocks)) - (1 if blocks[skipped] else 0)
    if same_node:
        c.messages_intra += messages
        c.bytes_intra += total * item
    else:
        c.messages_inter += messages
        c.bytes_inter += total * item


def _ring_reduce_scatter(
    c: Counts, nodes: list[int], me: int, counts: list[int], item: int
) -> None:
    p = len(nodes)
    if p == 1:
        return
    _send_blocks(c, counts, me, item, nodes[(me + 1) % p] == nodes[me])
    c.reduced_bytes += (sum(counts) - counts[(me - 1) % p]) * item
    c.round(nodes[(me + 1) % p] == nodes[me] and nodes[(me - 1) % p] == nodes[me], p - 1)


def _ring_allgather(
    c: Counts, nodes: list[int], me: int, counts: list[int], item: int, shift: int = 0
) -> None:
    p = len(nodes)
    if p == 1:
        return
    _send_blocks(c, counts, (me - shift + 1) % p, item, nodes[(me + 1) % p] == nodes[me])
    c.round(nodes[(me + 1) % p] == nodes[me] and nodes[(me - 1) % p] == nodes[me], p - 1)


def _ring_allreduce(c: Counts, nodes: list[int], me: int, n: int, item: int) -> None:
    p = len(nodes)
    if p == 1:
        return
    counts = even_counts(n, p)
    _ring_reduce_scatter(c, nodes, me, counts, item)
    _ring_allgather(c, nodes, me, counts, item)


def _fold_in(c: Counts, nodes: list[int], me: int, nbytes: int, rem: int) -> None:
    if me < 2 * rem:
        partner = me + 1 if me % 2 == 0 else me - 1
        if me % 2 == 0:
            c.send(nbytes, nodes[partner] == nodes[me])
        else:
            c.reduced_bytes += nbytes
            if nodes[partner] == nodes[me]:
                c.waited_intra += nbytes
            else:
                c.waited_inter += nbytes
        c.round(nodes[partner] == nodes[me])
    elif rem:
        c.round(len(set(nodes[: 2 * rem])) == 1 and nodes[0] == nodes[me])  # waits for partners


def _unfold(c: Counts, nodes: list[int], me: int, nbytes: int, rem: int) -> None:
    if me < 2 * rem:
        partner = me - 1 if me % 2 else me + 1
        if me % 2:
            c.send(nbytes, nodes[partner] == nodes[me])
        c.round(nodes[partner] == nodes[me])


def _rd_allreduce(c: Counts, nodes: list[int], me: int, n: int, item: int) -> None:
    p = len(nodes)
    if p == 1:
        return
    pof2, rem = fold(p)
    _fold_in(c, nodes, me, n * item, rem)
    newrank = new_rank(me, rem)
    if newrank >= 0:
        mask = 1
        while mask < pof2:
            peer = real_rank(newrank ^ mask, rem)
            c.send(n * item, nodes[peer] == nodes[me])
            c.reduced_bytes += n * item
            c.round(nodes[peer] == nodes[me])
            mask <<= 1
    _unfold(c, nodes, me, n * item, rem)


def _rabenseifner_allreduce(c: Counts, nodes: list[int], me: int, n: int, item: int) -> None:
    p = len(nodes)
    if p == 1:
        return
    pof2, rem = fold(p)
    _fold_in(c, nodes, me, n * item, rem)
    newrank = new_rank(me, rem)
    if newrank >= 0:
        lo, hi, mask = 0, n, 1
        kept: list[tuple[int, int]] = []
        while mask < pof2:
            peer = real_rank(newrank ^ mask, rem)
            mid = lo + (hi - lo) // 2
            keep, give = ((lo, mid), (mid, hi)) if newrank & mask == 0 else ((mid, hi), (lo, mid))
            c.send((give[1] - give[0]) * item, nodes[peer] == nodes[me])
            c.reduced_bytes += (keep[1] - keep[0]) * item
            kept.append((peer, keep[1] - keep[0]))
            c.round(nodes[peer] == nodes[me], 2)  # once halving, once doubling
            lo, hi = keep
            mask <<= 1
        for peer, size in reversed(kept):
            c.send(size * item, nodes[peer] == nodes[me])
    _unfold(c, nodes, me, n * item, rem)


def _leaders_allreduce(
    c: Counts, nodes: list[int], me: int, n: int, item: int, commutative: bool
) -> None:
    if leaders_use_ring(len(nodes), n * item, commutative):
        _ring_allreduce(c, nodes, me, n, item)
        return
    inner = _rabenseifner_allreduce if n * item >= LARGE_BYTES else _rd_allreduce
    inner(c, nodes, me, n, item)


def _tree_rounds(c: Counts, nodes: list[int]) -> None:
    """A binomial tree's depth: every rank's critical path has that many rounds."""
    c.round(len(set(nodes)) == 1, (len(nodes) - 1).bit_length())


def _parent_mask(vrank: int, p: int) -> int:
    mask = 1
    while mask < p and not vrank & mask:
        mask <<= 1
    return mask


def _binomial_bcast(c: Counts, nodes: list[int], me: int, nbytes: int, root: int) -> None:
    p = len(nodes)
    vrank = (me - root) % p
    mask = _parent_mask(vrank, p) >> 1
    while mask > 0:
        if vrank + mask < p:
            c.send(nbytes, nodes[(vrank + mask + root) % p] == nodes[me])
        mask >>= 1
    _tree_rounds(c, nodes)


def _binomial_reduce(c: Counts, nodes: list[int], me: int, nbytes: int, root: int) -> None:
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


def _binomial_gather(
    c: Counts, nodes: list[int], me: int, counts: list[int], item: int, root: int
) -> None:
    p = len(nodes)
    vrank = (me - root) % p
    mask = _parent_mask(vrank, p)
    starts = offsets(counts)
    if vrank:
        top = min(vrank + mask, p)
        c.send((starts[top] - starts[vrank]) * item, nodes[(vrank - mask + root) % p] == nodes[me])
    _tree_rounds(c, nodes)


def _binomial_scatter(
    c: Counts, nodes: list[int], me: int, counts: list[int], item: int, root: int
) -> None:
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


def _dissemination(c: Counts, nodes: list[int], me: int) -> None:
    p, k = len(nodes), 1
    while k < p:
        c.send(1, nodes[(me + k) % p] == nodes[me])
        c.round(nodes[(me + k) % p] == nodes[me])
        k <<= 1


# ---- the groups of a layout ---------------------------------------------------------------


@dataclass(frozen=True)
class _Groups:
    flat: list[int]
    node: list[int]
    local: int
    leaders: list[int] | None
    node_index: int
    rail: list[int]
    rail_me: int
    node_ranks: list[list[int]]


@lru_cache(maxsize=4096)
def _groups(layout: Layout, rank: int) -> _Groups:
    node_ranks = layout.node_ranks
    my_node = layout.node_of[rank]
    local = layout.local_rank[rank]
    rail_members = [ranks[local] for ranks in node_ranks if len(ranks) > local]
    return _Groups(
        flat=list(layout.node_of),
        node=[my_node] * len(node_ranks[my_node]),
        local=local,
        leaders=list(range(len(node_ranks))) if local == 0 else None,
        node_index=my_node,
        rail=[layout.node_of[r] for r in rail_members],
        rail_me=sum(1 for ranks in node_ranks[:my_node] if len(ranks) > local),
        node_ranks=node_ranks,
    )


# ---- per collective -------------------------------------------------------------------------


def _allreduce(
    c: Counts, g: _Groups, algorithm: str, rank: int, n: int, item: int, commutative: bool
) -> None:
    if algorithm == "ring":
        _ring_allreduce(c, g.flat, rank, n, item)
    elif algorithm == "recursive_doubling":
        _rd_allreduce(c, g.flat, rank, n, item)
    elif algorithm == "rabenseifner":
        _rabenseifner_allreduce(c, g.flat, rank, n, item)
    elif algorithm == "two_level":
        _binomial_reduce(c, g.node, g.local, n * item, 0)
        if g.leaders is not None:
            _leaders_allreduce(c, g.leaders, g.node_index, n, item, commutative)
        _binomial_bcast(c, g.node, g.local, n * item, 0)
    elif algorithm == "multi_leader":
        slices = min(len(r) for r in g.node_ranks)
        counts = slice_counts(n, len(g.node), slices)
        _ring_reduce_scatter(c, g.node, g.local, counts, item)
        if g.local < slices:
            _leaders_allreduce(c, g.rail, g.rail_me, counts[g.local], item, commutative)
        _ring_allgather(c, g.node, g.local, counts, item)
    elif algorithm == "pipelined":
        step = segment_elements(item)
        for start in range(0, max(n, 1), step):
            m = min(step, n - start) if n else 0
            _binomial_reduce(c, g.node, g.local, m * item, 0)
            if g.leaders is not None:
                _leaders_allreduce(c, g.leaders, g.node_index, m, item, commutative)
            _binomial_bcast(c, g.node, g.local, m * item, 0)
    else:
        raise ValueError(f"no count model for allreduce algorithm {algorithm!r}")


def _reduce(
    c: Counts,
    g: _Groups,
    algorithm: str,
    rank: int,
    n: int,
    item: int,
    root: int,
    commutative: bool,
) -> None:
    nbytes = n * item
    if algorithm == "binomial":
        if commutative or root == 0:
            _binomial_reduce(c, g.flat, rank, nbytes, root)
            return
        _binomial_reduce(c, g.flat, rank, nbytes, 0)
        if rank == 0:
            c.send(nbytes, g.flat[root] == g.flat[0])
        return
    # two_level
    root_node = g.flat[root]
    root_leader = g.node_ranks[root_node][0]
    leader0 = g.node_ranks[0][0]
    _binomial_reduce(c, g.node, g.local, nbytes, 0)
    if g.leaders is not None:
        _binomial_reduce(c, g.leaders, g.node_index, nbytes, 0)
        if root_node != 0 and rank == leader0:
            c.send(nbytes, False)
    if root != root_leader and rank == root_leader:
        c.send(nbytes, True)


def _bcast(c: Counts, g: _Groups, algorithm: str, rank: int, n: int, item: int, root: int) -> None:
    nbytes = n * item
    p = len(g.flat)
    if algorithm == "binomial":
        _binomial_bcast(c, g.flat, rank, nbytes, root)
        return
    if algorithm == "scatter_allgather":
        if p > 1:
            counts = even_counts(n, p)
            _binomial_scatter(c, g.flat, rank, counts, item, root)
            _ring_allgather(c, g.flat, rank, counts, item, shift=root)
        return
    root_node = g.flat[root]
    root_leader = g.node_ranks[root_node][0]
    if root != root_leader and rank == root:
        c.send(nbytes, True)
    if algorithm == "two_level":
        if g.leaders is not None:
            _binomial_bcast(c, g.leaders, g.node_index, nbytes, root_node)
        _binomial_bcast(c, g.node, g.local, nbytes, 0)
        return
    step = segment_elements(item)  # pipelined
    for start in range(0, max(n, 1), step):
        m = (min(step, n - start) if n else 0) * item
        if g.leaders is not None:
            _binomial_bcast(c, g.leaders, g.node_index, m, root_node)
        _binomial_bcast(c, g.node, g.local, m, 0)


def _rd_allgather(c: Counts, nodes: list[int], me: int, counts: list[int], item: int) -> None:
    p = len(nodes)
    if p == 1:
        return
    pof2, rem = fold(p)
    starts = offsets(counts)

    def span_bytes(first_new: int, last_new: int) -> int:
        lo = first_new * 2 if first_new < rem else first_new + rem
        return (starts[real_rank(last_new, rem) + 1] - starts[lo]) * item

    if me < 2 * rem and me % 2 == 0:
        c.send(counts[me] * item, nodes[me + 1] == nodes[me])
    newrank = new_rank(me, rem)
    if newrank >= 0:
        mask = 1
        while mask < pof2:
            mine_lo = newrank & ~(mask - 1)
            peer = real_rank(newrank ^ mask, rem)
            c.send(span_bytes(mine_lo, mine_lo + mask - 1), nodes[peer] == nodes[me])
            mask <<= 1
    _unfold(c, nodes, me, starts[-1] * item, rem)


def _allgather(
    c: Counts, g: _Groups, algorithm: str, rank: int, counts: list[int], item: int
) -> None:
    if algorithm == "ring":
        _ring_allgather(c, g.flat, rank, counts, item)
    elif algorithm == "recursive_doubling":
        _rd_allgather(c, g.flat, rank, counts, item)
    else:  # two_level
        node_counts = [[counts[r] for r in ranks] for ranks in g.node_ranks]
        _binomial_gather(c, g.node, g.local, node_counts[g.node_index], item, 0)
        if g.leaders is not None:
            _ring_allgather(c, g.leaders, g.node_index, [sum(x) for x in node_counts], item)
        _binomial_bcast(c, g.node, g.local, sum(counts) * item, 0)


def _reduce_scatter(
    c: Counts, g: _Groups, algorithm: str, rank: int, counts: list[int], item: int
) -> None:
    if algorithm == "ring":
        _ring_reduce_scatter(c, g.flat, rank, counts, item)
        return
    node_counts = [[counts[r] for r in ranks] for ranks in g.node_ranks]  # two_level
    _binomial_reduce(c, g.node, g.local, sum(counts) * item, 0)
    if g.leaders is not None:
        _ring_reduce_scatter(c, g.leaders, g.node_index, [sum(x) for x in node_counts], item)
    _binomial_scatter(c, g.node, g.local, node_counts[g.node_index], item, 0)


def _alltoall(
    c: Counts, g: _Groups, algorithm: str, rank: int, send_counts: list[int], item: int
) -> None:
    p = len(g.flat)
    if algorithm == "pairwise":
        for step in range(1, p):
            dest = (rank + step) % p
            c.send(send_counts[dest] * item, g.flat[dest] == g.flat[rank])
            c.round(g.flat[dest] == g.flat[rank])
        return
    block, k = send_counts[0], 1  # bruck
    while k < p and block:
        rows = sum(1 for i in range(p) if i & k)
        c.send(rows * block * item, g.flat[(rank + k) % p] == g.flat[rank])
        c.round(g.flat[(rank + k) % p] == g.flat[rank])
        k <<= 1


def _barrier(c: Counts, g: _Groups, algorithm: str, rank: int) -> None:
    if algorithm == "dissemination":
        _dissemination(c, g.flat, rank)
        return
    _binomial_gather(c, g.node, g.local, [1] * len(g.node), 1, 0)
    if g.leaders is not None:
        _dissemination(c, g.leaders, g.node_index)
    _binomial_bcast(c, g.node, g.local, 1, 0)


def counts_for(
    collective: str,
    algorithm: str,
    layout: Layout,
    rank: int,
    count: int,
    itemsize: int,
    *,
    root: int = 0,
    counts: list[int] | None = None,
    commutative: bool = True,
) -> Counts | None:
    """Messages and bytes ``rank`` sends in one call; None for ``mpi`` (inside the library).

    Args:
        collective: ``allreduce``, ``reduce``, ``bcast``, ``allgather``,
            ``reduce_scatter``, ``alltoall``, ``alltoallv`` or ``barrier``.
        algorithm: An algorithm of that collective.
        layout: The node of every rank.
        rank: The rank whose sends are counted.
        count: Elements in the call's buffer on this rank (allreduce, reduce, bcast:
            the vector; allgather: ignored when ``counts`` is given; reduce_scatter: the
            full vector; alltoall: the whole send buffer).
        itemsize: Bytes per element.
        root: The root of reduce and bcast.
        counts: Per-rank blocks (allgather, reduce_scatter) or this rank's send counts
            (alltoallv).
        commutative: Whether the op is commutative (reduce routes through rank 0 if not).
    """
    if algorithm == "mpi":
        return None
    g = _groups(layout, rank)
    c = Counts()
    p = layout.size
    if collective == "allreduce":
        _allreduce(c, g, algorithm, rank, count, itemsize, commutative)
    elif collective == "reduce":
        _reduce(c, g, algorithm, rank, count, itemsize, root, commutative)
    elif collective == "bcast":
        _bcast(c, g, algorithm, rank, count, itemsize, root)
    elif collective == "allgather":
        _allgather(c, g, algorithm, rank, counts if counts is not None else [count] * p, itemsize)
    elif collective == "reduce_scatter":
        _reduce_scatter(
            c, g, algorithm, rank, counts if counts is not None else even_counts(count, p), itemsize
        )
    elif collective == "alltoall":
        _alltoall(c, g, algorithm, rank, [count // p] * p, itemsize)
    elif collective == "alltoallv":
        _alltoall(c, g, "pairwise", rank, list(counts or []), itemsize)
    elif collective == "barrier":
        _barrier(c, g, algorithm, rank)
    else:
        raise ValueError(f"unknown collective {collective!r}")
    return c
