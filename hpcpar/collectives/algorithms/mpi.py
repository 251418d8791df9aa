"""The ``mpi`` algorithm: the MPI library's own collective, always valid, and the baseline.

Blocking calls use the library's blocking collective (which MPI libraries tune better
than the nonblocking one), nonblocking calls its ``I`` form. Nothing is counted: the
messages are the library's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from ..call import Call
from ..mpi_library import Reduction, buffer_spec, byte_type
from ..ops import ReduceOp
from ..registry import LIBRARY, Algorithm
from ..schedule import Schedule

__all__ = [
    "allreduce",
    "reduce",
    "bcast",
    "allgatherv",
    "reduce_scatter",
    "alltoall",
    "alltoallv",
    "barrier",
    "ALGORITHMS",
]


def allreduce(call: Call, buf: np.ndarray, op: ReduceOp) -> Schedule:
    """MPI_Allreduce (or MPI_Iallreduce) in place."""
    call.stats.inside_mpi = True
    comm = call.state.private
    with Reduction(buf, op) as (spec, mpi_op):
        if call.blocking:
            comm.Allreduce(MPI.IN_PLACE, spec, mpi_op)
        else:
            yield [comm.Iallreduce(MPI.IN_PLACE, spec, mpi_op)]


def reduce(call: Call, buf: np.ndarray, op: ReduceOp, root: int) -> Schedule:
    """MPI_Reduce (or MPI_Ireduce) in place at the root."""
    call.stats.inside_mpi = True
    comm = call.state.private
    with Reduction(buf, op) as (spec, mpi_op):
        send, recv = (MPI.IN_PLACE, spec) if comm.Get_rank() == root else (spec, None)
        if call.blocking:
            comm.Reduce(send, recv, mpi_op, root)
        else:
            yield [comm.Ireduce(send, recv, mpi_op, root)]


def bcast(call: Call, buf: np.ndarray, root: int) -> Schedule:
    """MPI_Bcast (or MPI_Ibcast)."""
    call.stats.inside_mpi = True
    if call.blocking:
        call.state.private.Bcast(buffer_spec(buf), root)
    else:
        yield [call.state.private.Ibcast(buffer_spec(buf), root)]


def allgatherv(call: Call, out: np.ndarray, counts: list[int]) -> Schedule:
    """MPI_Iallgatherv in place (each rank's block already in ``out``)."""
    call.stats.inside_mpi = True
    element = byte_type(out.itemsize)
    spec = [out.reshape(-1).view(np.uint8), (counts, None), element]
    if call.blocking:
        call.state.private.Allgatherv(MPI.IN_PLACE, spec)
    else:
        yield [call.state.private.Iallgatherv(MPI.IN_PLACE, spec)]


def reduce_scatter(call: Call, buf: np.ndarray, op: ReduceOp, counts: list[int]) -> Schedule:
    """MPI_Ireduce_scatter in place: this rank's block of ``buf`` ends reduced."""
    rank = call.state.private.Get_rank()
    start = sum(counts[:rank])
    # Not in place: MPICH 5.0.2 asserts (overlapping memcpy) on in-place reduce-scatter
    # when one rank's block is the whole vector.
    block = np.empty(counts[rank], dtype=buf.dtype)
    yield from reduce_scatter_into(call, buf, op, counts, block)
    buf[start : start + counts[rank]] = block


def reduce_scatter_into(
    call: Call, send: np.ndarray, op: ReduceOp, counts: list[int], block: np.ndarray
) -> Schedule:
    """MPI_Ireduce_scatter from ``send`` (left as it is) into this rank's ``block``."""
    call.stats.inside_mpi = True
    comm = call.state.private
    reduction = Reduction(send, op)
    with reduction as (send_spec, mpi_op):
        recv_spec = reduction.spec_for(block)
        if call.blocking:
            comm.Reduce_scatter(send_spec, recv_spec, counts, mpi_op)
        else:
            yield [comm.Ireduce_scatter(send_spec, recv_spec, counts, mpi_op)]


def alltoallv(
    call: Call, send: np.ndarray, send_counts: list[int], recv: np.ndarray, recv_counts: list[int]
) -> Schedule:
    """MPI_Alltoallv (or MPI_Ialltoallv)."""
    call.stats.inside_mpi = True
    element = byte_type(send.itemsize)
    specs = (
        [send.reshape(-1).view(np.uint8), (send_counts, None), element],
        [recv.reshape(-1).view(np.uint8), (recv_counts, None), element],
    )
    if call.blocking:
        call.state.private.Alltoallv(*specs)
    else:
        yield [call.state.private.Ialltoallv(*specs)]


def barrier(call: Call) -> Schedule:
    """MPI_Barrier (or MPI_Ibarrier)."""
    call.stats.inside_mpi = True
    if call.blocking:
        call.state.private.Barrier()
    else:
        yield [call.state.private.Ibarrier()]


def alltoall(call: Call, send: Any, recv: Any, block: int) -> Schedule:
    """MPI_Alltoallv with equal blocks (or MPI_Ialltoallv)."""
    counts = [block] * call.flat.size
    return alltoallv(call, send, counts, recv, counts)


def _record(collective: str, run: Any) -> Algorithm:
    return Algorithm(
        name=LIBRARY,
        collective=collective,
        run=run,
        label="MPI",
        summary="the MPI library's own call",
    )


ALGORITHMS = (
    _record("allreduce", allreduce),
    _record("reduce", reduce),
    _record("bcast", bcast),
    _record("allgather", allgatherv),
    _record("reduce_scatter", reduce_scatter),
    _record("alltoall", alltoall),
    _record("alltoallv", alltoallv),
    _record("barrier", barrier),
)
