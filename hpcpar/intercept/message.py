"""mpi4py's message forms read into the numpy views hpcpar's collectives run on.

A message is what mpi4py accepts as a buffer argument: an object with the buffer
protocol (or DLPack on the host), ``[buf, TYPE]``, ``[buf, count, TYPE]``,
``[buf, (count, displ), TYPE]`` and the vector forms ``[buf, counts, displs, TYPE]``,
``[buf, (counts, displs), TYPE]``, ``[buf, counts, TYPE]``; ``TYPE`` an MPI datatype
or a typecode. Each reader returns a 1-D numpy view of exactly the elements the MPI
library would read or write, or raises ``Passthrough`` naming why the call is left to
the library (a derived datatype, a GPU buffer, a form it does not read). The decision
depends only on what the ranks of a correct program pass alike (types, forms, ops),
never on one rank's values, so all ranks of a call take the same route.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI
from mpi4py.util.dtlib import to_numpy_dtype

__all__ = ["Derived", "Passthrough", "Vector", "derived", "is_derived", "message", "pair", "vector"]

IN_PLACE = MPI.IN_PLACE
_types: dict[Any, np.dtype | None] = {}


class Passthrough(Exception):
    """This call goes to the MPI library unchanged; ``str()`` says why."""


def _dtype_of(datatype: Any) -> np.dtype:
    """The numpy dtype of a predefined MPI datatype or typecode (cached)."""
    key = datatype.py2f() if isinstance(datatype, MPI.Datatype) else datatype
    found = _types.get(key, False)
    if found is False:
        found = None
        try:
            if isinstance(datatype, str):
                datatype = MPI.Datatype.fromcode(datatype)
            if (
                isinstance(datatype, MPI.Datatype)
                and datatype != MPI.DATATYPE_NULL
                and datatype.combiner == MPI.COMBINER_NAMED
            ):
                found = to_numpy_dtype(datatype)
        except (ValueError, KeyError, TypeError, MPI.Exception):
            found = None
        _types[key] = found
    if found is None:
        raise Passthrough(f"datatype {_name(datatype)}")
    return found


def _name(datatype: Any) -> str:
    if isinstance(datatype, MPI.Datatype):
        try:
            return datatype.Get_name() or "derived"
        except MPI.Exception:
            return "derived"
    return repr(datatype)


def _memory(obj: Any, writable: bool, dtype: np.dtype | None) -> tuple[np.ndarray, np.dtype]:
    """The bytes of ``obj`` as a flat uint8 view, and its element type.

    ``dtype``: the type the message names (None: the buffer's own). Raises Passthrough
    where it cannot: a GPU buffer, or a buffer without the buffer protocol whose type
    is not given.
    """
    if type(obj) is not np.ndarray:
        if hasattr(obj, "__cuda_array_interface__"):
            raise Passthrough("a GPU buffer")
        try:
            obj = np.asarray(memoryview(obj))
        except (TypeError, ValueError, NotImplementedError):
            device = getattr(obj, "__dlpack_device__", None)
            if device is None or dtype is None:
                raise Passthrough(f"a {type(obj).__name__} buffer") from None
            if device()[0] != 1:  # kDLCPU
                raise Passthrough("a GPU buffer") from None
            obj = np.frombuffer(MPI.buffer(obj), dtype=np.uint8)
    if not (obj.flags.c_contiguous or obj.flags.f_contiguous):
        raise Passthrough("a non-contiguous buffer")  # mpi4py refuses it: the same error
    if writable and not obj.flags.writeable:
        raise Passthrough("a read-only receive buffer")
    if obj.dtype.kind == "O":
        raise Passthrough("an object array")
    if dtype is None:
        dtype = obj.dtype
    return obj.reshape(-1, order="A").view(np.uint8), dtype


def _split(spec: Any) -> tuple[Any, Any, Any, Any]:
    """``(buf, count, displ, datatype)`` of a simple message; None where not given."""
    if not isinstance(spec, (list, tuple)):
        return spec, None, None, None
    if len(spec) == 2:
        buf, second = spec
        if isinstance(second, (MPI.Datatype, str)):
            return buf, None, None, second
        count, displ = _count_displ(second)
        return buf, count, displ, None
    if len(spec) == 3:
        buf, second, datatype = spec
        count, displ = _count_displ(second)
        return buf, count, displ, datatype
    if len(spec) == 4:
        buf, count, displ, datatype = spec
        return buf, _int(count), _int(displ), datatype
    raise Passthrough("a message form")


def _int(value: Any) -> int:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    raise Passthrough("a message form")


def _count_displ(value: Any) -> tuple[int | None, int | None]:
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return _int(value[0]), _int(value[1])
    return _int(value), None


def message(spec: Any, *, writable: bool, blocks: int = 1) -> np.ndarray:
    """The 1-D view of the elements a simple message names, read as mpi4py reads it.

    ``blocks``: the number of equal blocks the message holds (the ranks, for the send
    and receive buffers of ``Alltoall`` and the receive buffer of ``Allgather``); an
    explicit count is then the count of one block, and an inferred one the buffer's
    elements divided by ``blocks``.
    """
    if spec is None or spec is IN_PLACE or spec is MPI.BOTTOM:
        raise Passthrough("a message form")
    buf, count, displ, datatype = _split(spec)
    if buf is None or buf is MPI.BOTTOM:
        raise Passthrough("MPI.BOTTOM")
    dtype = None if datatype is None else _dtype_of(datatype)
    raw, dtype = _memory(buf, writable, dtype)
    size = dtype.itemsize
    start = (displ or 0) * size
    if count is None:
        entries = (raw.nbytes - start) // size
        if (raw.nbytes - start) % size or entries % blocks:
            raise Passthrough("a buffer that is not a whole number of blocks")
        count = entries // blocks
    total = count * blocks
    if count < 0 or start < 0 or start + total * size > raw.nbytes:
        raise Passthrough("a count beyond the buffer")
    return raw[start : start + total * size].view(dtype)


def _elements(raw: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if raw.nbytes % dtype.itemsize:
        raise Passthrough("a buffer that is not a whole number of elements")
    return raw.view(dtype)


def is_derived(spec: Any) -> bool:
    """Whether a simple message names a derived datatype (``[buf, count, TYPE]``...)."""
    if not isinstance(spec, (list, tuple)) or len(spec) < 2:
        return False
    datatype = spec[-1]
    return (
        isinstance(datatype, MPI.Datatype)
        and datatype != MPI.DATATYPE_NULL
        and datatype.combiner != MPI.COMBINER_NAMED
    )


class Derived:
    """A message of a derived datatype: its buffer's bytes and the datatype's plan."""

    __slots__ = ("count", "origin", "plan", "raw")

    def __init__(self, raw: np.ndarray, plan: Any, count: int, origin: int) -> None:
        self.raw, self.plan, self.count, self.origin = raw, plan, count, origin

    @property
    def nbytes(self) -> int:
        """The bytes the message packs to."""
        return int(self.count * self.plan.nbytes)

    def pack(self) -> np.ndarray:
        """The message's elements packed into contiguous bytes."""
        return self.plan.pack(self.raw, count=self.count, origin=self.origin)

    def unpack(self, packed: np.ndarray) -> None:
        """Put packed bytes back where the datatype places them."""
        self.plan.unpack(packed, self.raw, count=self.count, origin=self.origin)


def derived(spec: Any, *, writable: bool, blocks: int = 1) -> Derived:
    """A message of a derived datatype as its bytes and plan (``hpcpar.datatypes``).

    The count is read as ``message`` reads it; a datatype with a negative lower bound,
    or one that does not fit the buffer, is left to the library.
    """
    from ..datatypes import DatatypeError, plan

    buf, count, displ, datatype = _split(spec)
    lower, extent = datatype.Get_extent()
    if lower < 0 or extent <= 0:
        raise Passthrough("a derived datatype with a negative lower bound")
    raw, _ = _memory(buf, writable, np.dtype(np.uint8))
    origin = (displ or 0) * extent
    if count is None:
        entries, rest = divmod(raw.nbytes - origin, extent)
        if rest or entries % blocks:
            raise Passthrough("a buffer that is not a whole number of blocks")
        count = entries // blocks
    total = count * blocks
    if count < 0 or (
        total
        and origin
        + (total - 1) * extent
        + datatype.Get_true_extent()[0]
        + datatype.Get_true_extent()[1]
        > raw.nbytes
    ):
        raise Passthrough("a count beyond the buffer")
    try:
        return Derived(raw, plan(datatype), total, origin)
    except DatatypeError as why:
        raise Passthrough(f"datatype: {why}") from None


class Vector:
    """A vector message: the whole buffer as elements, with per-rank counts and displs."""

    __slots__ = ("array", "counts", "displs")

    def __init__(self, array: np.ndarray, counts: list[int], displs: list[int]) -> None:
        self.array, self.counts, self.displs = array, counts, displs

    def packed(self) -> bool:
        """Whether the blocks lie back to back from the start, in rank order."""
        at = 0
        for count, displ in zip(self.counts, self.displs, strict=True):
            if displ != at:
                return False
            at += count
        return True

    def block(self, i: int) -> np.ndarray:
        """Rank ``i``'s block."""
        return self.array[self.displs[i] : self.displs[i] + self.counts[i]]


def _ints(value: Any, size: int) -> list[int]:
    if isinstance(value, (np.ndarray, list, tuple)):
        values = [_int(v) for v in value]
        if len(values) == size:
            return values
    raise Passthrough("a message form")


def _is_type(value: Any) -> bool:
    return isinstance(value, (MPI.Datatype, str))


def vector(spec: Any, size: int, *, writable: bool) -> Vector:
    """A vector message on ``size`` ranks, read as mpi4py reads it.

    ``[buf, counts, displs, TYPE]``, ``[buf, (counts, displs), TYPE]``,
    ``[buf, counts, TYPE]``, ``[buf, (counts, displs)]``, ``[buf, counts]``,
    ``[buf, TYPE]`` or a buffer; ``counts`` a sequence, one integer for every rank, or
    None (the buffer split evenly); ``displs`` a sequence, an integer stride, or None
    (the blocks back to back).
    """
    buf, counts_spec, displs_spec, datatype = _vector_parts(spec)
    if buf is None or buf is MPI.BOTTOM or (datatype is not None and not _is_type(datatype)):
        raise Passthrough("a message form")
    dtype = None if datatype is None else _dtype_of(datatype)
    raw, dtype = _memory(buf, writable, dtype)
    array = _elements(raw, dtype)
    if counts_spec is None:
        counts = [array.size // size + (array.size % size > i) for i in range(size)]
    elif isinstance(counts_spec, (int, np.integer)):
        counts = [_int(counts_spec)] * size
    else:
        counts = _ints(counts_spec, size)
    if displs_spec is None:
        displs = [sum(counts[:i]) for i in range(size)]
    elif isinstance(displs_spec, (int, np.integer)):
        displs = [_int(displs_spec) * i for i in range(size)]
    else:
        displs = _ints(displs_spec, size)
    for count, displ in zip(counts, displs, strict=True):
        if count < 0 or displ < 0 or displ + count > array.size:
            raise Passthrough("a count beyond the buffer")
    return Vector(array, counts, displs)


def _vector_parts(spec: Any) -> tuple[Any, Any, Any, Any]:
    """``(buf, counts, displs, datatype)`` of a vector message; None where not given."""
    if not isinstance(spec, (list, tuple)):
        return spec, None, None, None
    counts = displs = datatype = None
    if len(spec) == 2:
        buf, counts = spec
        if _is_type(counts):
            counts, datatype = None, counts
        elif isinstance(counts, tuple):
            counts, displs = _two(counts)
    elif len(spec) == 3:
        buf, counts, datatype = spec
        if isinstance(counts, tuple):
            counts, displs = _two(counts)
    elif len(spec) == 4:
        buf, counts, displs, datatype = spec
    else:
        raise Passthrough("a message form")
    return buf, counts, displs, datatype


def _two(value: tuple[Any, ...]) -> tuple[Any, Any]:
    if len(value) != 2:
        raise Passthrough("a message form")
    return value[0], value[1]


def pair(a: np.ndarray, b: np.ndarray) -> None:
    """Raise Passthrough unless send and receive views hold the same element type.

    Also when they overlap (not ``IN_PLACE``): MPI calls that an error, and the library
    raises it.
    """
    if a.dtype != b.dtype:
        raise Passthrough("different send and receive types")
    if np.may_share_memory(a, b):
        raise Passthrough("send and receive buffers overlap")
