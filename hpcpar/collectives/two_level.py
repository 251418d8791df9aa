"""Two-level algorithms: within each node, then across node leaders, then within nodes.

The classic hierarchical scheme (MPICH's SMP-aware collectives, Open MPI's HAN): only
one rank per node talks to the network. Works on any layout, even and uneven; keeps
rank order (for non-commutative ops) when every node holds a contiguous run of ranks.
"""

from __future__ import annotations

import numpy as np

from . import binomial, rabenseifner, recursive_doubling, ring
from .call import Call
from .channel import Channel, offsets
from .schedule import Schedule

__all__ = [
    "allreduce",
    "leaders_allreduce",
    "leaders_use_ring",
    "reduce",
    "bcast",
    "allgather",
    "reduce_scatter",
    "barrier",
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
    from . import ring

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
    from . import ring

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
    from . import dissemination

    token = np.zeros(call.node.size, np.uint8)
    yield from binomial.gather(call.node, token, [1] * call.node.size, root=0)
    if call.leaders is not None:
        yield from dissemination.barrier(call.leaders)
    yield from binomial.bcast(call.node, token[:1], root=0)
