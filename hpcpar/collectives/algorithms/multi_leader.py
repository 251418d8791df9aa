"""Multi-leader (split-rail) allreduce: every rank of a node drives its own network share.

Within each node a reduce-scatter leaves local rank k holding slice k of the node's
sum; then each rail (the ranks with local rank k, one per node) allreduces its slice
concurrently with the other rails; an allgather within the node puts the slices back
together. With uneven nodes the vector is cut into as many slices as the smallest node
has ranks, so every rail that carries a slice spans every node; the extra ranks of
larger nodes contribute their data but own no slice (Horovod handles the remainder
the same way).
"""

from __future__ import annotations

import numpy as np

from ..call import Call
from ..channel import even_counts, offsets
from ..registry import ORDER_NONE, Algorithm, Shape
from ..schedule import Schedule
from ..tally import Counts, Groups, Layout
from . import ring
from .two_level import count_leaders_allreduce, leaders_allreduce

__all__ = ["allreduce", "slice_counts", "ALGORITHMS"]


def slice_counts(n: int, local_size: int, slices: int) -> list[int]:
    """Elements of each local rank's slice: ``slices`` owners, the rest own none."""
    return even_counts(n, slices) + [0] * (local_size - slices)


def allreduce(call: Call, buf: np.ndarray, op: object) -> Schedule:
    """Node reduce-scatter, one allreduce per rail on its slice, node allgather."""
    node = call.node
    counts = slice_counts(buf.size, node.size, call.min_node_size)
    yield from ring.reduce_scatter(node, buf, op, counts)
    if node.rank < call.min_node_size:
        starts = offsets(counts)
        yield from leaders_allreduce(call.rail, buf[starts[node.rank] : starts[node.rank + 1]], op)
    yield from ring.allgather(node, buf, counts)


def _count_allreduce(c: Counts, g: Groups, rank: int, s: Shape) -> None:
    slices = min(len(r) for r in g.node_ranks)
    counts = slice_counts(s.count, len(g.node), slices)
    ring.count_reduce_scatter(c, g.node, g.local, counts, s.itemsize)
    if g.local < slices:
        count_leaders_allreduce(c, g.rail, g.rail_me, counts[g.local], s.itemsize, s.commutative)
    ring.count_allgather(c, g.node, g.local, counts, s.itemsize)


def _rails(layout: Layout, rank: int) -> int:
    # every rail that carries a slice crosses the link at once
    return min(len(r) for r in layout.node_ranks)


ALGORITHMS = (
    Algorithm(
        name="multi_leader",
        collective="allreduce",
        run=allreduce,
        label="ML",
        counts=_count_allreduce,
        order=ORDER_NONE,
        hierarchical=True,
        senders=_rails,
        summary="node reduce-scatter, one allreduce per rail, node allgather",
    ),
)
