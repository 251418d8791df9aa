"""Two-level algorithms: within each node, then across node leaders, then within nodes.

The classic hierarchical scheme (MPICH's SMP-aware collectives, Open MPI's HAN): only
one rank per node talks to the network. Works on any layout, even and uneven; keeps
rank order (for non-commutative ops) when every node holds a contiguous run of ranks.
"""

from __future__ import annotations

import numpy as np

from ..call import Call
from ..channel import Channel, offsets
from ..registry import ORDER_ANY, ORDER_CONTIGUOUS, ORDER_NONE, Algorithm, Shape
from ..schedule import Schedule
from ..tally import Counts, Groups, one_per_node
from . import binomial, dissemination, rabenseifner, recursive_doubling, ring

__all__ = [
    "allreduce",
    "leaders_allreduce",
    "leaders_use_ring",
    "count_leaders_allreduce",
    "reduce",
    "bcast",
    "allgather",
    "reduce_scatter",
    "barrier",
    "LARGE_BYTES",
    "ALGORITHMS",
]

# Above this many bytes the leaders use Rabenseifner's bandwidth-optimal allreduce.
LARGE_BYTES = 64 * 1024
# ... or, when they are not a power of two and the op commutes, the ring once each of its
# blocks is at least this large (per leader: its extra latencies are then paid for).
RING_BLOCK_BYTES = 32 * 1024


def leaders_use_ring(p: int, nbytes: int, commutative: bool) -> bool:
    """Whether ``p`` leaders allreduce ``nbytes`` with the ring rather than Rabenseifner.

    Rabenseifner on a count that is not a power of two folds the extra ranks in and out:
    their partners receive and send the whole vector before and after the halving, so
    at 3 leaders the slowest one moves 3x the vector over its link where the ring moves
    4/3x (MPICH's node-aware allreduce folds the same way). The ring pays 2(p-1)
    latencies against 2 log2(p) + 2, so it is taken only for blocks of at least
    ``RING_BLOCK_BYTES``; it combines in ring order, so only for commutative ops.
    """
    return (
        commutative
        and p > 2
        and p & (p - 1) != 0
        and nbytes >= max(LARGE_BYTES, p * RING_BLOCK_BYTES)
    )


def leaders_allreduce(ch: Channel, buf: np.ndarray, op: object) -> Schedule:
    """Allreduce among leaders (or rails): latency- or bandwidth-optimal by size."""
    if leaders_use_ring(ch.size, buf.nbytes, bool(getattr(op, "commutative", False))):
        yield from ring.allreduce(ch, buf, op)
        return
    inner = rabenseifner if buf.nbytes >= LARGE_BYTES else recursive_doubling
    yield from inner.allreduce(ch, buf, op)


def allreduce(call: Call, buf: np.ndarray, op: object) -> Schedule:
    """Node reduce to the leader, allreduce among leaders, node bcast."""
    yield from binomial.reduce(call.node, buf, op, root=0)
    if call.leaders is not None:
        yield from leaders_allreduce(call.leaders, buf, op)
    yield from binomial.bcast(call.node, buf, root=0)


def reduce(call: Call, buf: np.ndarray, op: object, root: int) -> Schedule:
    """Node reduce to leaders, leaders reduce to the root's node, then on to the root."""
    state = call.state
    root_node = state.node_of[root]
    root_leader = state.leader_ranks[root_node]
    yield from binomial.reduce(call.node, buf, op, root=0)
    if call.leaders is not None:
        yield from binomial.reduce(call.leaders, buf, op, root=0)
        if root_node != 0:  # rank order is kept only with leader 0 as the tree's root
            if state.rank == state.leader_ranks[0]:
                yield call.flat.isend(buf, root_leader)
            elif state.rank == root_leader:
                yield call.flat.irecv(buf, state.leader_ranks[0])
    if root != root_leader:
        if state.rank == root_leader:
            yield call.flat.isend(buf, root)
        elif state.rank == root:
            yield call.flat.irecv(buf, root_leader)


def bcast(call: Call, buf: np.ndarray, root: int) -> Schedule:
    """Root to its node's leader, binomial among leaders, binomial within each node."""
    state = call.state
    root_node = state.node_of[root]
    root_leader = state.leader_ranks[root_node]
    if root != root_leader:
        if state.rank == root:
            yield call.flat.isend(buf, root_leader)
        elif state.rank == root_leader:
            yield call.flat.irecv(buf, root)
    if call.leaders is not None:
        yield from binomial.bcast(call.leaders, buf, root=root_node)
    yield from binomial.bcast(call.node, buf, root=0)


def _by_node(
    state: object, buf: np.ndarray, counts: list[int]
) -> tuple[np.ndarray, list[int], list[list[int]]]:
    """Rank blocks regrouped node by node (node order, rank order within a node).

    Returns the regrouped copy, the block starts in rank order, and each node's counts.
    """
    node_ranks: list[list[int]] = state.node_ranks  # type: ignore[attr-defined]
    starts = offsets(counts)
    order = [r for ranks in node_ranks for r in ranks]
    staged = (
        np.concatenate([buf[starts[r] : starts[r + 1]] for r in order]) if buf.size else buf.copy()
    )
    return staged, starts, [[counts[r] for r in ranks] for ranks in node_ranks]


def allgather(call: Call, out: np.ndarray, counts: list[int]) -> Schedule:
    """Node gather to leaders, leaders allgather of node blocks, node bcast, reorder."""
    state = call.state
    staged, starts, node_counts = _by_node(state, out, counts)
    node_totals = [sum(c) for c in node_counts]
    my_node = state.node_of[state.rank]
    base = sum(node_totals[:my_node])
    mine = staged[base : base + node_totals[my_node]]
    yield from binomial.gather(call.node, mine, node_counts[my_node], root=0)
    if call.leaders is not None:
        yield from ring.allgather(call.leaders, staged, node_totals)
    yield from binomial.bcast(call.node, staged, root=0)
    pos = 0
    for ranks in state.node_ranks:  # back to rank order
        for r in ranks:
            out[starts[r] : starts[r + 1]] = staged[pos : pos + counts[r]]
            pos += counts[r]


def reduce_scatter(call: Call, buf: np.ndarray, op: object, counts: list[int]) -> Schedule:
    """Node reduce, leaders reduce-scatter of node shares, node scatter."""
    state = call.state
    staged, starts, node_counts = _by_node(state, buf, counts)
    yield from binomial.reduce(call.node, staged, op, root=0)
    node_totals = [sum(c) for c in node_counts]
    if call.leaders is not None:
        yield from ring.reduce_scatter(call.leaders, staged, op, node_totals)
    my_node = state.node_of[state.rank]
    base = sum(node_totals[:my_node])
    share = staged[base : base + node_totals[my_node]]
    yield from binomial.scatter(call.node, share, node_counts[my_node], root=0)
    local = call.node.rank
    offset = sum(node_counts[my_node][:local])
    r = state.rank
    buf[starts[r] : starts[r + 1]] = share[offset : offset + counts[r]]


def barrier(call: Call) -> Schedule:
    """Node gather of a token, dissemination among leaders, node bcast."""
    token = np.zeros(call.node.size, np.uint8)
    yield from binomial.gather(call.node, token, [1] * call.node.size, root=0)
    if call.leaders is not None:
        yield from dissemination.barrier(call.leaders)
    yield from binomial.bcast(call.node, token[:1], root=0)


# ---- exact counts ----------------------------------------------------------------------


def count_leaders_allreduce(
    c: Counts, nodes: list[int], me: int, n: int, item: int, commutative: bool
) -> None:
    """What ``leaders_allreduce`` of ``n`` elements sends and reduces from position ``me``."""
    if leaders_use_ring(len(nodes), n * item, commutative):
        ring.count_allreduce(c, nodes, me, n, item)
        return
    inner = rabenseifner if n * item >= LARGE_BYTES else recursive_doubling
    inner.count_allreduce(c, nodes, me, n, item)


def _count_allreduce(c: Counts, g: Groups, rank: int, s: Shape) -> None:
    binomial.count_reduce(c, g.node, g.local, s.nbytes, 0)
    if g.leaders is not None:
        count_leaders_allreduce(c, g.leaders, g.node_index, s.count, s.itemsize, s.commutative)
    binomial.count_bcast(c, g.node, g.local, s.nbytes, 0)


def _count_reduce(c: Counts, g: Groups, rank: int, s: Shape) -> None:
    root_node = g.flat[s.root]
    root_leader = g.node_ranks[root_node][0]
    leader0 = g.node_ranks[0][0]
    binomial.count_reduce(c, g.node, g.local, s.nbytes, 0)
    if g.leaders is not None:
        binomial.count_reduce(c, g.leaders, g.node_index, s.nbytes, 0)
        if root_node != 0 and rank == leader0:
            c.send(s.nbytes, False)
    if s.root != root_leader and rank == root_leader:
        c.send(s.nbytes, True)


def count_root_hop(c: Counts, g: Groups, rank: int, s: Shape) -> None:
    """The root's message to its node's leader, when the root is not the leader."""
    root_leader = g.node_ranks[g.flat[s.root]][0]
    if s.root != root_leader and rank == s.root:
        c.send(s.nbytes, True)


def _count_bcast(c: Counts, g: Groups, rank: int, s: Shape) -> None:
    count_root_hop(c, g, rank, s)
    if g.leaders is not None:
        binomial.count_bcast(c, g.leaders, g.node_index, s.nbytes, g.flat[s.root])
    binomial.count_bcast(c, g.node, g.local, s.nbytes, 0)


def _count_allgather(c: Counts, g: Groups, rank: int, s: Shape) -> None:
    node_counts = [[s.counts[r] for r in ranks] for ranks in g.node_ranks]
    binomial.count_gather(c, g.node, g.local, node_counts[g.node_index], s.itemsize, 0)
    if g.leaders is not None:
        totals = [sum(x) for x in node_counts]
        ring.count_allgather(c, g.leaders, g.node_index, totals, s.itemsize)
    binomial.count_bcast(c, g.node, g.local, sum(s.counts) * s.itemsize, 0)


def _count_reduce_scatter(c: Counts, g: Groups, rank: int, s: Shape) -> None:
    node_counts = [[s.counts[r] for r in ranks] for ranks in g.node_ranks]
    binomial.count_reduce(c, g.node, g.local, sum(s.counts) * s.itemsize, 0)
    if g.leaders is not None:
        totals = [sum(x) for x in node_counts]
        ring.count_reduce_scatter(c, g.leaders, g.node_index, totals, s.itemsize)
    binomial.count_scatter(c, g.node, g.local, node_counts[g.node_index], s.itemsize, 0)


def _count_barrier(c: Counts, g: Groups, rank: int, s: Shape) -> None:
    binomial.count_gather(c, g.node, g.local, [1] * len(g.node), 1, 0)
    if g.leaders is not None:
        dissemination.count_barrier(c, g.leaders, g.node_index)
    binomial.count_bcast(c, g.node, g.local, 1, 0)


def _record(collective: str, run: object, counts: object, order: str, summary: str) -> Algorithm:
    return Algorithm(
        name="two_level",
        collective=collective,
        run=run,  # type: ignore[arg-type]
        label="2L",
        counts=counts,  # type: ignore[arg-type]
        order=order,
        hierarchical=True,
        senders=one_per_node,
        summary=summary,
    )


ALGORITHMS = (
    _record(
        "allreduce",
        allreduce,
        _count_allreduce,
        ORDER_CONTIGUOUS,
        "node reduce, allreduce among node leaders, node bcast",
    ),
    _record(
        "reduce",
        reduce,
        _count_reduce,
        ORDER_CONTIGUOUS,
        "node reduce, leaders reduce, on to the root",
    ),
    _record(
        "bcast",
        bcast,
        _count_bcast,
        ORDER_ANY,
        "to the root's leader, bcast among leaders, node bcast",
    ),
    _record(
        "allgather",
        allgather,
        _count_allgather,
        ORDER_ANY,
        "node gather, leaders allgather node blocks, node bcast",
    ),
    _record(
        "reduce_scatter",
        reduce_scatter,
        _count_reduce_scatter,
        ORDER_NONE,
        "node reduce, leaders reduce-scatter node shares, node scatter",
    ),
    _record(
        "barrier",
        barrier,
        _count_barrier,
        ORDER_ANY,
        "node gather, dissemination among leaders, node bcast",
    ),
)
