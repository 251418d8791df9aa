"""The ``mpi`` algorithm: the MPI library's own collective, always valid, and the baseline.

Predefined ops on the types MPI knows go to the library as they are. Anything else
(bool sums, float16, structured dtypes, numpy ufuncs, Python functions) runs as a
user-defined MPI op over a contiguous byte type, applied to whole buffers by numpy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from .call import Call
from .ops import ReduceOp
from .schedule import Schedule

__all__ = [
    "native_mpi_op",
    "blocking_allreduce",
    "allreduce",
    "reduce",
    "bcast",
    "allgatherv",
    "reduce_scatter",
    "alltoallv",
    "barrier",
    "buffer_spec",
]

_NATIVE_KINDS = {
    "SUM": "iufc",
    "PROD": "iufc",
    "MIN": "iuf",
    "MAX": "iuf",
    "LAND": "iufb",
    "LOR": "iufb",
    "LXOR": "iufb",
    "BAND": "iub",
    "BOR": "iub",
    "BXOR": "iub",
}
_NATIVE_SIZES = {"i": (1, 2, 4, 8), "u": (1, 2, 4, 8), "f": (4, 8), "c": (8, 16), "b": (1,)}
_generic_ops: dict[bool, MPI.Op] = {}
_dispatch: dict[int, tuple[np.dtype, Any]] = {}
_byte_types: dict[int, MPI.Datatype] = {}


_native_ops: dict[tuple[int, Any], tuple[Any, Any]] = {}  # (id(op), dtype) -> (op, MPI op)


def native_mpi_op(op: Any, dtype: np.dtype) -> Any:
    """The MPI op the library reduces ``dtype`` with for ``op``, or None (cached).

    One dictionary lookup per call: the library path of ``allreduce`` runs it every time.
    The cache entry holds ``op``, so its id cannot be reused by another object.
    """
    native = _native_ops.get((id(op), dtype))
    if native is None or native[0] is not op:
        from .ops import resolve_op

        rop = resolve_op(op, dtype)
        native = (op, rop.mpi_op if is_native(rop, dtype) else None)
        _native_ops[(id(op), dtype)] = native
    return native[1]


def blocking_allreduce(comm: MPI.Intracomm, x: np.ndarray, out: np.ndarray, mpi_op: Any) -> None:
    """The library's own blocking Allreduce of ``x`` into ``out`` (in place when the same)."""
    if out is x:
        comm.Allreduce(MPI.IN_PLACE, out, mpi_op)
    else:
        comm.Allreduce(x, out, mpi_op)


def is_native(op: ReduceOp, dtype: np.dtype) -> bool:
    """Whether the MPI library can reduce ``dtype`` with ``op`` by itself."""
    kinds = _NATIVE_KINDS.get(op.name) if op.mpi_op is not None else None
    return bool(kinds) and dtype.kind in kinds and dtype.itemsize in _NATIVE_SIZES[dtype.kind]


def _byte_type(itemsize: int) -> MPI.Datatype:
    if itemsize not in _byte_types:
        _byte_types[itemsize] = MPI.BYTE.Create_contiguous(itemsize).Commit()
    return _byte_types[itemsize]


def buffer_spec(buf: np.ndarray) -> list[Any]:
    """An mpi4py buffer spec moving ``buf`` as opaque elements of its itemsize."""
    return [buf.reshape(-1).view(np.uint8), buf.size, _byte_type(buf.itemsize)]


def _apply(inbuf: Any, inoutbuf: Any, datatype: MPI.Datatype) -> None:
    # MPI: inoutbuf = inbuf op inoutbuf, inbuf from the lower ranks.
    dtype, combine = _dispatch[datatype.handle]
    a = np.frombuffer(inbuf, dtype=dtype)
    b = np.frombuffer(inoutbuf, dtype=dtype)
    combine(a, b, b)


def _generic_op(commutative: bool) -> MPI.Op:
    # MPI allows few user-defined ops, so two serve every call: each call brings its
    # own element datatype, and the datatype says which numpy op to apply.
    if commutative not in _generic_ops:
        _generic_ops[commutative] = MPI.Op.Create(_apply, commute=commutative)
    return _generic_ops[commutative]


class _Reduction:
    """The buffer spec and MPI op to reduce ``buf`` with, for the span of one call.

    Predefined ops on native types go straight to the library; anything else gets an
    element datatype of its own that tells the generic user op which numpy op to run.
    """

    __slots__ = ("element", "op", "spec")

    def __init__(self, buf: np.ndarray, op: ReduceOp) -> None:
        if is_native(op, buf.dtype):
            self.spec, self.op, self.element = buf, op.mpi_op, None
            return
        self.element = MPI.BYTE.Create_contiguous(buf.itemsize).Commit()
        _dispatch[self.element.handle] = (buf.dtype, op.combine)
        self.spec = [buf.reshape(-1).view(np.uint8), buf.size, self.element]
        self.op = _generic_op(op.commutative)

    def __enter__(self) -> tuple[Any, MPI.Op]:
        return self.spec, self.op

    def __exit__(self, *exc: object) -> None:
        if self.element is not None:
            del _dispatch[self.element.handle]
            self.element.Free()


_reduction = _Reduction


def allreduce(call: Call, buf: np.ndarray, op: ReduceOp) -> Schedule:
    """MPI_Allreduce (or MPI_Iallreduce) in place."""
    call.stats.inside_mpi = True
    comm = call.state.private
    with _reduction(buf, op) as (spec, mpi_op):
        if call.blocking:
            comm.Allreduce(MPI.IN_PLACE, spec, mpi_op)
        else:
            yield [comm.Iallreduce(MPI.IN_PLACE, spec, mpi_op)]


def reduce(call: Call, buf: np.ndarray, op: ReduceOp, root: int) -> Schedule:
    """MPI_Reduce (or MPI_Ireduce) in place at the root."""
    call.stats.inside_mpi = True
    comm = call.state.private
    with _reduction(buf, op) as (spec, mpi_op):
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
    byte_type = _byte_type(out.itemsize)
    spec = [out.reshape(-1).view(np.uint8), (counts, None), byte_type]
    if call.blocking:
        call.state.private.Allgatherv(MPI.IN_PLACE, spec)
    else:
        yield [call.state.private.Iallgatherv(MPI.IN_PLACE, spec)]


def reduce_scatter(call: Call, buf: np.ndarray, op: ReduceOp, counts: list[int]) -> Schedule:
    """MPI_Ireduce_scatter in place: this rank's block of ``buf`` ends reduced."""
    call.stats.inside_mpi = True
    comm = call.state.private
    rank = comm.Get_rank()
    start = sum(counts[:rank])
    # Not in place: MPICH 5.0.2 asserts (overlapping memcpy) on in-place reduce-scatter
    # when one rank's block is the whole vector.
    block = np.empty(counts[rank], dtype=buf.dtype)
    with _reduction(buf, op) as (send_spec, mpi_op), _reduction(block, op) as (recv_spec, _):
        if call.blocking:
            comm.Reduce_scatter(send_spec, recv_spec, counts, mpi_op)
        else:
            yield [comm.Ireduce_scatter(send_spec, recv_spec, counts, mpi_op)]
    buf[start : start + counts[rank]] = block


def alltoallv(
    call: Call, send: np.ndarray, send_counts: list[int], recv: np.ndarray, recv_counts: list[int]
) -> Schedule:
    """MPI_Alltoallv (or MPI_Ialltoallv)."""
    call.stats.inside_mpi = True
    byte_type = _byte_type(send.itemsize)
    specs = (
        [send.reshape(-1).view(np.uint8), (send_counts, None), byte_type],
        [recv.reshape(-1).view(np.uint8), (recv_counts, None), byte_type],
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
