"""Which algorithms each collective has, and what each may be trusted with.

Every entry adapts an algorithm module to one calling convention per collective:

- allreduce(call, buf, op); reduce(call, buf, op, root); bcast(call, buf, root)
- allgather(call, out, counts); reduce_scatter(call, buf, op, counts)
- alltoall(call, send, recv, block); alltoallv(call, send, scounts, recv, rcounts)
- barrier(call)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import (
    alltoall_algorithms,
    binomial,
    dissemination,
    mpi_library,
    multi_leader,
    pipelined,
    rabenseifner,
    recursive_doubling,
    ring,
    scatter_allgather,
    two_level,
)
from .call import Call
from .names import COLLECTIVES
from .schedule import Schedule

__all__ = ["Algorithm", "ALGORITHMS", "ORDER_ANY", "ORDER_CONTIGUOUS", "ORDER_NONE", "COLLECTIVES"]

ORDER_ANY = "any"  # reduces in rank order on every layout
ORDER_CONTIGUOUS = "contiguous"  # in rank order when each node holds a contiguous run of ranks
ORDER_NONE = "none"  # reorders: commutative ops only


@dataclass(frozen=True)
class Algorithm:
    """One algorithm of one collective.

    Attributes:
        name: As passed in ``algorithm=``.
        run: Makes the schedule (see the module docstring for the signature).
        order: Whether it keeps rank order (matters only for reductions).
        hierarchical: Whether it uses the node/leader/rail levels.
    """

    name: str
    run: Callable[..., Schedule]
    order: str = ORDER_ANY
    hierarchical: bool = False


def _flat(func: Callable[..., Schedule]) -> Callable[..., Schedule]:
    def run(call: Call, *args: Any) -> Schedule:
        return func(call.flat, *args)

    return run


def _binomial_reduce(call: Call, buf: Any, op: Any, root: int) -> Schedule:
    # Rank order is kept only with rank 0 as the tree's root; forward from there.
    if op.commutative or root == 0:
        yield from binomial.reduce(call.flat, buf, op, root)
        return
    yield from binomial.reduce(call.flat, buf, op, 0)
    if call.flat.rank == 0:
        yield call.flat.isend(buf, root)
    elif call.flat.rank == root:
        yield call.flat.irecv(buf, 0)


def _pairwise_alltoall(call: Call, send: Any, recv: Any, block: int) -> Schedule:
    counts = [block] * call.flat.size
    return alltoall_algorithms.pairwise(call.flat, send, counts, recv, counts)


def _mpi_alltoall(call: Call, send: Any, recv: Any, block: int) -> Schedule:
    counts = [block] * call.flat.size
    return mpi_library.alltoallv(call, send, counts, recv, counts)


def _table(*algorithms: Algorithm) -> dict[str, Algorithm]:
    return {a.name: a for a in algorithms}


ALGORITHMS: dict[str, dict[str, Algorithm]] = {
    "allreduce": _table(
        Algorithm("mpi", mpi_library.allreduce),
        Algorithm("ring", _flat(ring.allreduce), ORDER_NONE),
        Algorithm("recursive_doubling", _flat(recursive_doubling.allreduce)),
        Algorithm("rabenseifner", _flat(rabenseifner.allreduce)),
        Algorithm("two_level", two_level.allreduce, ORDER_CONTIGUOUS, True),
        Algorithm("multi_leader", multi_leader.allreduce, ORDER_NONE, True),
        Algorithm("pipelined", pipelined.allreduce, ORDER_CONTIGUOUS, True),
    ),
    "reduce": _table(
        Algorithm("mpi", mpi_library.reduce),
        Algorithm("binomial", _binomial_reduce),
        Algorithm("two_level", two_level.reduce, ORDER_CONTIGUOUS, True),
    ),
    "bcast": _table(
        Algorithm("mpi", mpi_library.bcast),
        Algorithm("binomial", _flat(binomial.bcast)),
        Algorithm("scatter_allgather", _flat(scatter_allgather.bcast)),
        Algorithm("two_level", two_level.bcast, ORDER_ANY, True),
        Algorithm("pipelined", pipelined.bcast, ORDER_ANY, True),
    ),
    "allgather": _table(
        Algorithm("mpi", mpi_library.allgatherv),
        Algorithm("ring", _flat(ring.allgather)),
        Algorithm("recursive_doubling", _flat(recursive_doubling.allgather)),
        Algorithm("two_level", two_level.allgather, ORDER_ANY, True),
    ),
    "reduce_scatter": _table(
        Algorithm("mpi", mpi_library.reduce_scatter),
        Algorithm("ring", _flat(ring.reduce_scatter), ORDER_NONE),
        Algorithm("two_level", two_level.reduce_scatter, ORDER_NONE, True),
    ),
    "alltoall": _table(
        Algorithm("mpi", _mpi_alltoall),
        Algorithm("pairwise", _pairwise_alltoall),
        Algorithm("bruck", _flat(alltoall_algorithms.bruck)),
    ),
    "alltoallv": _table(
        Algorithm("mpi", mpi_library.alltoallv),
        Algorithm("pairwise", _flat(alltoall_algorithms.pairwise)),
    ),
    "barrier": _table(
        Algorithm("mpi", mpi_library.barrier),
        Algorithm("dissemination", _flat(dissemination.barrier)),
        Algorithm("two_level", two_level.barrier, ORDER_ANY, True),
    ),
}

assert tuple(ALGORITHMS) == COLLECTIVES
