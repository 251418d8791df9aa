"""Pipelined hierarchical allreduce and bcast: segments flow through the levels (HAN-style).

The buffer is cut into segments; while segment i crosses the network between leaders,
segment i+1 is being reduced within the nodes and segment i-1 broadcast within them.
Each stage uses its own tag so the stages of different segments never match each
other's messages.
"""

from __future__ import annotations

import os

import numpy as np

from . import binomial
from .call import Call
from .schedule import Schedule, concurrently
from .two_level import leaders_allreduce

__all__ = ["allreduce", "bcast", "segment_elements", "DEFAULT_SEGMENT_BYTES"]

DEFAULT_SEGMENT_BYTES = 256 * 1024


def segment_elements(itemsize: int, segment_bytes: int | None = None) -> int:
    """Elements per segment (``HPCPAR_SEGMENT_BYTES`` or 256 KiB by default)."""
    if segment_bytes is None:
        segment_bytes = int(os.environ.get("HPCPAR_SEGMENT_BYTES", DEFAULT_SEGMENT_BYTES))
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
