"""What a point-to-point message is made of: spans, MPI datatypes of a layout, and buffers.

A contiguous array goes to MPI as it is; a non-contiguous view or a caller's datatype is
either packed with its plan (``outgoing``, ``Incoming``) or walked by MPI as hpcpar's
own datatype of the layout (``mpi_typed``, ``view_type``), made once per layout.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from ..datatypes import DatatypeError, plan
from ..datatypes.choose import send_method
from ..datatypes.ir import shift
from ..datatypes.plan import Plan, bytes_of, shared_plan
from ..datatypes.views import unpack_view_once
from ..runtime.comm import resolve_comm
from ..runtime.devices import is_device_array

__all__ = ["view_type", "mpi_typed", "outgoing", "Incoming", "Truncation", "receive", "host_plan"]

_BYTE = np.dtype(np.uint8)


def _span(arr: np.ndarray, lo: int, hi: int, writable: bool) -> MPI.buffer:
    """The bytes ``lo`` to ``hi`` around a view's first element, as one buffer for MPI.

    The first element's address comes from a one-element view of it, several times
    cheaper than numpy's ``__array_interface__``, which on a small view costs more than
    the message. The view's own bounds contain the span, and the caller keeps the view,
    which keeps its memory, alive while MPI uses the span.
    """
    first = _FIRST.get(arr.ndim)
    if first is None:
        first = _FIRST[arr.ndim] = (0,) * (arr.ndim - 1) + (slice(0, 1),)
    start = MPI.buffer(arr[first]).address
    return MPI.buffer.fromaddress(start + lo, hi - lo, readonly=not writable)


_FIRST: dict[int, tuple[Any, ...]] = {}  # index of a one-element view of the first element


def _method(p: Plan, count: int, method: str) -> str:
    if method == "auto":
        return send_method(p, count)[0]
    if method not in ("pack", "datatype"):
        raise DatatypeError(f"method must be auto, pack or datatype, not {method!r}")
    return method


class _OwnedType:
    """A committed MPI datatype kept with a plan's layout, freed when the layout goes."""

    def __init__(self, dt: MPI.Datatype) -> None:
        self.dt = dt

    def __del__(self, _ready: Any = MPI.Is_initialized, _done: Any = MPI.Is_finalized) -> None:
        # the functions are bound early: at exit this module's globals may be gone
        if _ready() and not _done():
            self.dt.Free()


def view_type(p: Plan) -> tuple[MPI.Datatype, int, int]:
    """The view's layout as an MPI datatype starting at its lowest byte, and its span.

    Made once per layout (kept with the plan's derived data): building and committing
    a derived datatype for every send cost more than the send of a small message.
    """
    known = p._memo.get("mpi type")
    if known is None:
        lo, hi = p.true_bounds
        dt = Plan(shift(p.items, -lo), 0, max(hi - lo, 1)).to_mpi()
        known = p._memo["mpi type"] = (_OwnedType(dt), lo, hi)
    return known[0].dt, known[1], known[2]


def _rebuilt_type(p: Plan) -> MPI.Datatype:
    """The plan's own MPI datatype (``to_mpi``), made once per layout.

    It has the user's datatype's type map, lower bound and extent, built the way the
    MPI library walks fastest (``mpitype._words_vector``), which for long vectors of
    small blocks is several times faster than the caller's own vector (``hpcpar bench
    datatypes``, its send cases).
    """
    known = p._memo.get("mpi type, rebuilt")
    if known is None:
        known = p._memo["mpi type, rebuilt"] = _OwnedType(p.to_mpi())
    return known.dt


def mpi_typed(obj: Any, p: Plan, datatype: Any, count: int, method: str, writable: bool) -> Any:
    """``[buffer, count, MPI type]`` for MPI to walk directly, when that is the method, else None.

    ``p`` is the plan of the view (``datatype`` None) or of ``datatype``; the buffer is
    checked to hold every byte the message reaches, as packing would.
    """
    if _method(p, count, method) == "pack":
        return None
    if datatype is not None:
        flags = obj.flags if type(obj) is np.ndarray else None
        whole = flags is not None and flags.c_contiguous and (flags.writeable or not writable)
        if whole and p._holds(obj.nbytes, 0, count):  # MPI takes the array as it is
            return [obj, count, _rebuilt_type(p)]
        area = bytes_of(obj, "buf", writable=writable)
        p._bounds(area, 0, count, "buf")
        return [area, count, _rebuilt_type(p)]
    if obj.size == 0:
        return None
    dt, lo, hi = view_type(p)
    return [_span(obj, lo, hi, writable), 1, dt]


def _device_method(obj: Any, method: str) -> str:
    """``staged`` or ``device`` for a GPU array (``auto``: the measured table, else a rule)."""
    if method == "auto":
        from ..datatypes.choose import device_send_method

        return device_send_method(plan(obj))[0]
    if method not in ("staged", "device"):
        raise DatatypeError(
            f"method for a GPU array must be auto, staged or device, not {method!r}"
        )
    return method


def outgoing(obj: Any, datatype: Any, count: int, method: str = "auto") -> np.ndarray:
    """The bytes to send: the array itself when contiguous, else its packed copy."""
    if is_device_array(obj):
        from ..datatypes import gpu

        if datatype is not None:
            return gpu.pack_device(plan(datatype), obj, count=count).get()
        return gpu.device_to_host(obj, _device_method(obj, method))
    if datatype is not None:
        return shared_plan(datatype).pack(obj, count=count)
    arr = np.asarray(obj)
    if arr.flags.c_contiguous:
        return arr.reshape(-1).view(np.uint8) if arr.size else np.empty(0, np.uint8)
    return shared_plan(arr).pack(arr)


class Incoming:
    """Where a message lands: ``obj`` itself when contiguous, else a buffer to unpack."""

    def __init__(
        self, obj: Any, datatype: Any, count: int, method: str = "auto", known: Any = None
    ) -> None:
        self.obj, self.datatype, self.count = obj, datatype, count
        self.device: str | None = None
        self.typed: np.ndarray | None = None  # a view's landing buffer, in its own type
        if is_device_array(obj):  # arrives in host memory, then goes to the device
            from ..datatypes.gpu import require_cupy

            require_cupy(obj)  # before the receive, not after it
            self.device = "datatype" if datatype is not None else _device_method(obj, method)
            self.plan = plan(datatype if datatype is not None else obj)
            self.buffer = np.empty(self.plan.size * count, np.uint8)
            return
        if datatype is not None:
            self.plan = known if known is not None else shared_plan(datatype)
            self.plan._check(count)  # refused before the message is received, not after
            self.plan._bounds(bytes_of(obj, "buf", writable=True), 0, count, "buf")
            self.buffer = np.empty(self.plan.size * count, np.uint8)
            return
        arr = obj
        if not isinstance(arr, np.ndarray):
            raise DatatypeError(f"recv needs a numpy array to fill, not {type(obj).__name__}")
        if not arr.flags.writeable:
            raise DatatypeError("recv into a read-only array")
        if arr.flags.c_contiguous:
            self.plan = None
            self.buffer = arr.reshape(-1).view(np.uint8) if arr.size else np.empty(0, np.uint8)
        else:
            self.plan = known if known is not None else shared_plan(arr)
            self.typed = np.empty(arr.shape, arr.dtype)
            # its bytes, as MPI.BYTE (mpi4py maps no record or void type to an MPI one),
            # in its own shape (a flat view costs more)
            self.buffer = self.typed.view(_BYTE)

    def finish(self, status: MPI.Status) -> Any:
        """Check the arrived size, unpack into ``obj`` where needed, and return it."""
        got = status.Get_count(MPI.BYTE)
        if got != self.buffer.nbytes:
            raise DatatypeError(f"received {got} bytes where {self.buffer.nbytes} were expected")
        if self.device is not None:
            from ..datatypes import gpu

            if self.device == "datatype":
                import cupy

                gpu.unpack_device(self.plan, cupy.asarray(self.buffer), self.obj, count=self.count)
                cupy.cuda.get_current_stream().synchronize()
            else:
                gpu.host_to_device(self.buffer, self.obj, self.device)
        elif self.typed is not None:  # a view: one copy from its own type, nothing to check
            unpack_view_once(self.plan, self.typed, self.obj)
        elif self.plan is not None:
            self.plan._unpack(self.buffer, self.obj, self.count, 0, remember=False)
        return self.obj


class Truncation:
    """Turn MPI's message-truncated error into a DatatypeError naming the sizes."""

    def __init__(self, expected: int) -> None:
        self.expected = expected

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        _refuse_truncated(exc, self.expected)
        return False


def _refuse_truncated(exc: Any, expected: int) -> None:
    if isinstance(exc, MPI.Exception) and exc.Get_error_class() == MPI.ERR_TRUNCATE:
        raise DatatypeError(
            f"a message longer than the {expected} bytes expected arrived"
        ) from None


def receive(comm: Any, buf: Any, source: int, tag: int, status: MPI.Status, expected: int) -> None:
    """``comm.Recv`` into ``buf`` (``Truncation`` without a context manager: cheaper)."""
    try:
        resolve_comm(comm).Recv(buf, source, tag, status)
    except MPI.Exception as exc:
        _refuse_truncated(exc, expected)
        raise


def host_plan(obj: Any, datatype: Any) -> Plan | None:
    """The plan of a non-contiguous host view or of ``datatype`` (host buffer), else None."""
    if datatype is None:
        if isinstance(obj, np.ndarray) and not obj.flags.c_contiguous:
            return shared_plan(obj)
        return None
    return None if is_device_array(obj) else shared_plan(datatype)
