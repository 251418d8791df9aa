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

from . import ring
from .call import Call
from .channel import even_counts, offsets
from .schedule import Schedule
from .two_level import leaders_allreduce

__all__ = ["allreduce", "slice_counts"]


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
