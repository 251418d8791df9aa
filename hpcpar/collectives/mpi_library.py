"""Handing buffers and ops to the MPI library: native ops, byte types, user-defined ops.

Predefined ops on the types MPI knows go to the library as they are. Anything else
(bool sums, float16, structured dtypes, numpy ufuncs, Python functions) runs as a
user-defined MPI op over a contiguous byte type, applied to whole buffers by numpy
(``Reduction``). The ``mpi`` algorithm (``algorithms/mpi.py``) and the fast paths use
these.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from .ops import ReduceOp

__all__ = [
    "native_mpi_op",
    "blocking_allreduce",
    "is_native",
    "byte_type",
    "buffer_spec",
    "Reduction",
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


def byte_type(itemsize: int) -> MPI.Datatype:
    """A committed contiguous type of ``itemsize`` bytes (one per size, kept)."""
    if itemsize not in _byte_types:
        _byte_types[itemsize] = MPI.BYTE.Create_contiguous(itemsize).Commit()
    return _byte_types[itemsize]


def buffer_spec(buf: np.ndarray) -> list[Any]:
    """An mpi4py buffer spec moving ``buf`` as opaque elements of its itemsize."""
    return [buf.reshape(-1).view(np.uint8), buf.size, byte_type(buf.itemsize)]


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


class Reduction:
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
        self.spec = self.spec_for(buf)
        self.op = _generic_op(op.commutative)

    def __enter__(self) -> tuple[Any, MPI.Op]:
        return self.spec, self.op

    def spec_for(self, other: np.ndarray) -> Any:
        """The buffer spec of ``other`` (the same dtype) with this reduction's element type.

        A call with a send and a receive buffer needs one element type for both: MPI
        (and mpi4py's check) wants their datatypes to match.
        """
        if self.element is None:
            return other
        return [other.reshape(-1).view(np.uint8), other.size, self.element]

    def __exit__(self, *exc: object) -> None:
        if self.element is not None:
            del _dispatch[self.element.handle]
            self.element.Free()
