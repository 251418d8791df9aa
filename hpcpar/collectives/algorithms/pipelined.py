"""Pipelined hierarchical allreduce and bcast: segments flow through the levels (HAN-style).

The buffer is cut into segments; while segment i crosses the network between leaders,
segment i+1 is being reduced within the nodes and segment i-1 broadcast within them.
Each stage uses its own tag so the stages of different segments never match each
other's messages.
"""

from __future__ import annotations

import numpy as np

from ...runtime import settings
from ..call import Call
from ..registry import ORDER_CONTIGUOUS, Algorithm, Shape
from ..schedule import Schedule, concurrently
from ..tally import Counts, Groups, Layout, groups_of, one_per_node
from . import binomial
from .two_level import count_leaders_allreduce, count_root_hop, leaders_allreduce

__all__ = ["allreduce", "bcast", "segment_elements", "DEFAULT_SEGMENT_BYTES", "ALGORITHMS"]

DEFAULT_SEGMENT_BYTES = 256 * 1024


def segment_elements(itemsize: int, segment_bytes: int | None = None) -> int:
    """Elements per segment (``HPCPAR_SEGMENT_BYTES`` or 256 KiB by default)."""
    if segment_bytes is None:
        segment_bytes = settings.value("HPCPAR_SEGMENT_BYTES")
    return max(1, segment_bytes // max(1, itemsize))


def _segments(buf: np.ndarray, segment_bytes: int | None) -> list[np.ndarray]:
    step = segment_elements(buf.itemsize, segment_bytes)
    return [buf[i : i + step] for i in range(0, max(buf.size, 1), step)]


def allreduce(
    call: Call, buf: np.ndarray, op: object, segment_bytes: int | None = None
) -> Schedule:
    """Node reduce, leaders allreduce and node bcast, overlapped across segments."""
    segs = _segments(buf, segment_bytes)
    node_in, node_out = call.node.retag(1), call.node.retag(2)
    leaders = call.leaders.retag(3) if call.leaders is not None else None
    for t in range(len(segs) + 2):
        stages = []
        if t < len(segs):
            stages.append(binomial.reduce(node_in, segs[t], op, root=0))
        if 0 <= t - 1 < len(segs) and leaders is not None:
            stages.append(leaders_allreduce(leaders, segs[t - 1], op))
        if 0 <= t - 2 < len(segs):
            stages.append(binomial.bcast(node_out, segs[t - 2], root=0))
        yield from concurrently(*stages)


def bcast(call: Call, buf: np.ndarray, root: int, segment_bytes: int | None = None) -> Schedule:
    """Root to its leader, leaders bcast, node bcast, overlapped across segments."""
    state = call.state
    root_node = state.node_of[root]
    root_leader = state.leader_ranks[root_node]
    if root != root_leader:  # the first hop is not pipelined: one message either way
        if state.rank == root:
            yield call.flat.isend(buf, root_leader)
        elif state.rank == root_leader:
            yield call.flat.irecv(buf, root)
    segs = _segments(buf, segment_bytes)
    node = call.node.retag(1)
    leaders = call.leaders.retag(2) if call.leaders is not None else None
    for t in range(len(segs) + 1):
        stages = []
        if t < len(segs) and leaders is not None:
            stages.append(binomial.bcast(leaders, segs[t], root=root_node))
        if 0 <= t - 1 < len(segs):
            stages.append(binomial.bcast(node, segs[t - 1], root=0))
        yield from concurrently(*stages)


# ---- exact counts, and the stages the cost model overlaps ----------------------------


def _segment_sizes(s: Shape) -> list[int]:
    step = segment_elements(s.itemsize)
    return [
        min(step, s.count - start) if s.count else 0 for start in range(0, max(s.count, 1), step)
    ]


def _count_allreduce(c: Counts, g: Groups, rank: int, s: Shape) -> None:
    for m in _segment_sizes(s):
        binomial.count_reduce(c, g.node, g.local, m * s.itemsize, 0)
        if g.leaders is not None:
            count_leaders_allreduce(c, g.leaders, g.node_index, m, s.itemsize, s.commutative)
        binomial.count_bcast(c, g.node, g.local, m * s.itemsize, 0)


def _count_bcast(c: Counts, g: Groups, rank: int, s: Shape) -> None:
    count_root_hop(c, g, rank, s)
    for m in _segment_sizes(s):
        if g.leaders is not None:
            binomial.count_bcast(c, g.leaders, g.node_index, m * s.itemsize, g.flat[s.root])
        binomial.count_bcast(c, g.node, g.local, m * s.itemsize, 0)


def _stages(layout: Layout, rank: int, s: Shape, reduce: bool) -> tuple[list[Counts], int]:
    """One segment's stages (node in, leaders, node out) and the number of segments."""
    g = groups_of(layout, rank)
    step = segment_elements(s.itemsize)
    m = min(s.count, step)
    stages = [Counts() for _ in range(3)]
    if reduce:
        binomial.count_reduce(stages[0], g.node, g.local, m * s.itemsize, 0)
        if g.leaders is not None:
            count_leaders_allreduce(
                stages[1], g.leaders, g.node_index, m, s.itemsize, s.commutative
            )
    elif g.leaders is not None:  # bcast: leaders, then within the node
        root_node = layout.node_of[s.root]
        binomial.count_bcast(stages[1], g.leaders, g.node_index, m * s.itemsize, root_node)
    binomial.count_bcast(stages[2], g.node, g.local, m * s.itemsize, 0)
    return stages, max(1, -(-s.count // step))


def _segment_bytes(itemsize: int) -> int:
    return segment_elements(itemsize) * itemsize


ALGORITHMS = (
    Algorithm(
        name="pipelined",
        collective="allreduce",
        run=allreduce,
        label="PL",
        counts=_count_allreduce,
        order=ORDER_CONTIGUOUS,
        hierarchical=True,
        senders=one_per_node,
        stages=lambda layout, rank, s: _stages(layout, rank, s, True),
        segment_bytes=_segment_bytes,
        summary="two-level in segments, the levels overlapped (HPCPAR_SEGMENT_BYTES)",
    ),
    Algorithm(
        name="pipelined",
        collective="bcast",
        run=bcast,
        label="PL",
        counts=_count_bcast,
        hierarchical=True,
        senders=one_per_node,
        stages=lambda layout, rank, s: _stages(layout, rank, s, False),
        segment_bytes=_segment_bytes,
        summary="two-level in segments, the levels overlapped (HPCPAR_SEGMENT_BYTES)",
    ),
)
