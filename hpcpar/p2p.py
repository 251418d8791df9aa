"""Point-to-point on any layout: non-contiguous numpy views and MPI datatypes.

Contiguous arrays go to MPI as they are (mpi4py refuses non-contiguous views outright).
Anything else goes one of two ways (``method``; ``datatypes.choose.send_method`` picks
from the measured table): packed with its plan into a contiguous buffer (and unpacked
on arrival), or zero copy as hpcpar's own MPI datatype of the layout, made once per
layout and built the way the MPI library walks fastest (``Plan.to_mpi``), also in
place of a caller's datatype. ``send_init``/``recv_init`` do all of that once and
leave each step the copy and MPI's persistent request. GPU arrays (cupy, or anything with
the CUDA array interface; any layout) travel through host memory, packed on the device
or staged by a 2D copy (``method``; see ``datatypes.choose``). With ``comm=None`` the
messages use hpcpar's own communicator, so both sides must use hpcpar; pass a
communicator to talk to code that calls mpi4py directly (the bytes on the wire are the
packed data).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from mpi4py import MPI

from .collectives.buffers import is_device_array
from .collectives.schedule import PendingRequestWarning
from .datatypes import DatatypeError, plan
from .datatypes.choose import send_method
from .datatypes.ir import shift
from .datatypes.plan import Plan, bytes_of, shared_plan
from .datatypes.views import unpack_view_once
from .runtime import flight
from .runtime.comm import resolve_comm
from .runtime.orphans import adopt, progress_adopted

_BYTE = np.dtype(np.uint8)

__all__ = [
    "send",
    "recv",
    "isend",
    "irecv",
    "sendrecv",
    "send_init",
    "recv_init",
    "P2PRequest",
    "PersistentRequest",
]


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


def _typed(obj: Any, p: Plan, datatype: Any, count: int, method: str, writable: bool) -> Any:
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
        from .datatypes.choose import device_send_method

        return device_send_method(plan(obj))[0]
    if method not in ("staged", "device"):
        raise DatatypeError(
            f"method for a GPU array must be auto, staged or device, not {method!r}"
        )
    return method


def _outgoing(obj: Any, datatype: Any, count: int, method: str = "auto") -> np.ndarray:
    """The bytes to send: the array itself when contiguous, else its packed copy."""
    if is_device_array(obj):
        from .datatypes import gpu

        if datatype is not None:
            return gpu.pack_device(plan(datatype), obj, count=count).get()
        return gpu.device_to_host(obj, _device_method(obj, method))
    if datatype is not None:
        return shared_plan(datatype).pack(obj, count=count)
    arr = np.asarray(obj)
    if arr.flags.c_contiguous:
        return arr.reshape(-1).view(np.uint8) if arr.size else np.empty(0, np.uint8)
    return shared_plan(arr).pack(arr)


class _Incoming:
    """Where a message lands: ``obj`` itself when contiguous, else a buffer to unpack."""

    def __init__(
        self, obj: Any, datatype: Any, count: int, method: str = "auto", known: Any = None
    ) -> None:
        self.obj, self.datatype, self.count = obj, datatype, count
        self.device: str | None = None
        self.typed: np.ndarray | None = None  # a view's landing buffer, in its own type
        if is_device_array(obj):  # arrives in host memory, then goes to the device
            from .datatypes.gpu import require_cupy

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
        got = status.Get_count(MPI.BYTE)
        if got != self.buffer.nbytes:
            raise DatatypeError(f"received {got} bytes where {self.buffer.nbytes} were expected")
        if self.device is not None:
            from .datatypes import gpu

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


class _Truncation:
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


def _receive(comm: Any, buf: Any, source: int, tag: int, status: MPI.Status, expected: int) -> None:
    """``comm.Recv`` into ``buf`` (``_Truncation`` without a context manager: cheaper)."""
    try:
        resolve_comm(comm).Recv(buf, source, tag, status)
    except MPI.Exception as exc:
        _refuse_truncated(exc, expected)
        raise


def send(
    obj: Any,
    dest: int,
    tag: int = 0,
    *,
    comm: Any = None,
    datatype: Any = None,
    count: int = 1,
    method: str = "auto",
) -> None:
    """Send an array (any layout) or ``count`` elements of ``datatype`` from the buffer ``obj``.

    ``method`` for non-contiguous views and for datatypes: ``"pack"`` (copy into a
    contiguous buffer), ``"datatype"`` (zero copy: MPI walks hpcpar's own datatype of
    the layout, made once per layout), or ``"auto"`` (the measured table in the profile;
    without one: up to 4 KiB and single blocks as datatypes, larger irregular layouts
    packed, larger regular ones as datatypes unless the node has more ranks than cores;
    see ``datatypes.explain_send``); for GPU arrays
    ``"staged"`` (a 2D copy into host memory), ``"device"`` (the pack kernel, then one
    copy) or ``"auto"``.
    """
    entry = flight.point("send", "p2p", dest, obj if datatype is None else count)
    try:
        p = _host_plan(obj, datatype)
        if p is not None:
            typed = _typed(obj, p, datatype, count, method, writable=False)
            if typed is not None:
                resolve_comm(comm).Send(typed, dest, tag)
            elif datatype is None:
                resolve_comm(comm).Send(p.pack(obj), dest, tag)
            else:
                resolve_comm(comm).Send(p.pack(obj, count=count), dest, tag)
            return
        resolve_comm(comm).Send(_outgoing(obj, datatype, count, method), dest, tag)
    finally:
        flight.leave(entry)


def _host_plan(obj: Any, datatype: Any) -> Plan | None:
    """The plan of a non-contiguous host view or of ``datatype`` (host buffer), else None."""
    if datatype is None:
        if isinstance(obj, np.ndarray) and not obj.flags.c_contiguous:
            return shared_plan(obj)
        return None
    return None if is_device_array(obj) else shared_plan(datatype)


def recv(
    obj: Any,
    source: int = MPI.ANY_SOURCE,
    tag: int = MPI.ANY_TAG,
    *,
    comm: Any = None,
    datatype: Any = None,
    count: int = 1,
    status: MPI.Status | None = None,
    method: str = "auto",
) -> Any:
    """Receive into an array (any layout), or into ``count`` elements of ``datatype`` in ``obj``.

    ``method`` as for ``send`` (either side may use either method: the bytes on the wire
    are the same).

    Returns:
        ``obj``, filled.

    Raises:
        DatatypeError: the message's size is not what ``obj`` holds.
    """
    entry = flight.point("recv", "p2p", source, obj if datatype is None else count)
    try:
        return _recv(obj, source, tag, comm, datatype, count, status, method)
    finally:
        flight.leave(entry)


def _recv(
    obj: Any, source: int, tag: int, comm: Any, datatype: Any, count: int, status: Any, method: str
) -> Any:
    status = status if status is not None else MPI.Status()
    if datatype is None and isinstance(obj, np.ndarray) and not obj.flags.writeable:
        raise DatatypeError("recv into a read-only array")
    view_plan = _host_plan(obj, datatype)
    if view_plan is not None:
        typed = _typed(obj, view_plan, datatype, count, method, writable=True)
        if typed is not None:
            size = view_plan.size * count
            _receive(comm, typed, source, tag, status, size)
            if status.Get_count(MPI.BYTE) != size:
                raise DatatypeError(
                    f"received {status.Get_count(MPI.BYTE)} bytes where {size} were expected"
                )
            return obj
    incoming = _Incoming(obj, datatype, count, method, view_plan)
    _receive(comm, incoming.buffer, source, tag, status, incoming.buffer.nbytes)
    return incoming.finish(status)


class P2PRequest:
    """A pending ``isend``/``irecv``: ``wait()`` completes it (and unpacks a receive).

    Dropped unfinished, it warns and is completed in the background
    (``hpcpar.runtime.orphans``): its buffers stay alive until MPI is done with them.
    """

    def __init__(
        self, request: MPI.Request, keep: Any, incoming: _Incoming | None = None, entry: Any = None
    ) -> None:
        self._request, self._keep, self._incoming = request, keep, incoming
        self._entry = entry  # its flight-record entry
        self._status = MPI.Status()
        self._arrived = False  # the message has completed (a receive may still need unpacking)
        self._done = False
        self._result: Any = None

    def test(self) -> bool:
        """Whether the message has completed (a receive is unpacked by ``wait``)."""
        if not self._arrived:
            progress_adopted()
            with _Truncation(self._expected()):
                self._arrived = bool(self._request.Test(self._status))
        return self._arrived

    def wait(self) -> Any:
        """Complete the message; return the received object (None for a send)."""
        if self._done:
            return self._result
        if not self._arrived:
            progress_adopted()
            if self._entry is not None:
                flight.CURRENT[0] = self._entry
            with _Truncation(self._expected()):
                self._request.Wait(self._status)
            self._arrived = True
        self._done = True
        flight.finish(self._entry)
        if self._incoming is not None:
            self._result = self._incoming.finish(self._status)
        return self._result

    def _expected(self) -> int:
        return self._incoming.buffer.nbytes if self._incoming is not None else 0

    def progress(self) -> bool:
        """Complete without blocking if the message has arrived (for an adopted request)."""
        if self.test():
            self.wait()
        return self._done

    def describe(self) -> str:
        """What the request is, for warnings."""
        return "irecv" if self._incoming is not None else "isend"

    def __del__(self) -> None:
        if getattr(self, "_done", True) or self._request == MPI.REQUEST_NULL:
            return
        adopt(self)  # kept alive (resurrected: __del__ runs once) until it completes
        warnings.warn(
            f"hpcpar: {self.describe()} request dropped before completion; call wait() on it. "
            "hpcpar completes it in the background",
            PendingRequestWarning,
            stacklevel=2,
        )


def isend(
    obj: Any, dest: int, tag: int = 0, *, comm: Any = None, datatype: Any = None, count: int = 1
) -> P2PRequest:
    """Nonblocking ``send``; the data is packed (copied) when the call starts if needed."""
    entry = flight.point("isend", "p2p", dest, obj if datatype is None else count, current=False)
    data = _outgoing(obj, datatype, count)
    return P2PRequest(resolve_comm(comm).Isend(data, dest, tag), data, entry=entry)


def irecv(
    obj: Any,
    source: int = MPI.ANY_SOURCE,
    tag: int = MPI.ANY_TAG,
    *,
    comm: Any = None,
    datatype: Any = None,
    count: int = 1,
) -> P2PRequest:
    """Nonblocking ``recv``; ``wait()`` unpacks into ``obj`` and returns it."""
    entry = flight.point("irecv", "p2p", source, obj if datatype is None else count, current=False)
    incoming = _Incoming(obj, datatype, count)
    return P2PRequest(
        resolve_comm(comm).Irecv(incoming.buffer, source, tag), incoming.buffer, incoming, entry
    )


def sendrecv(
    sendobj: Any,
    dest: int,
    recvobj: Any,
    source: int,
    sendtag: int = 0,
    recvtag: int = MPI.ANY_TAG,
    *,
    comm: Any = None,
) -> Any:
    """Send ``sendobj`` to ``dest`` and receive into ``recvobj`` from ``source`` (any layouts)."""
    entry = flight.point("sendrecv", "p2p", (dest, source), sendobj)
    try:
        incoming = _Incoming(recvobj, None, 1)
        status = MPI.Status()
        with _Truncation(incoming.buffer.nbytes):
            resolve_comm(comm).Sendrecv(
                _outgoing(sendobj, None, 1), dest, sendtag, incoming.buffer, source, recvtag, status
            )
        if source == MPI.PROC_NULL:
            return recvobj
        return incoming.finish(status)
    finally:
        flight.leave(entry)


class PersistentRequest:
    """A persistent send or receive (``send_init``, ``recv_init``): start and wait each step.

    Everything a ``send`` or ``recv`` works out per call (the plan, the method, the
    buffer checks, the packed buffer, the MPI datatype) is done when it is made; each
    step then packs with ``Plan.packer`` (or not at all: zero copy), starts MPI's own
    persistent request, and on ``wait`` unpacks with ``Plan.unpacker``. It holds the
    arrays it was made with: each start sends their values at that moment, each wait
    writes into them. ``free()`` (or a ``with`` block) releases the MPI request.
    """

    def __init__(
        self, request: MPI.Prequest, before: Any, after: Any, expected: int | None, keep: Any
    ) -> None:
        self._request, self._before, self._after = request, before, after
        self._expected, self._keep = expected, keep
        self._status = MPI.Status()
        self._started = False
        self._arrived = False  # this step's message completed in test()

    def start(self) -> None:
        """Start the step's message (a send packs its array first)."""
        if self._before is not None:
            self._before()
        self._request.Start()
        self._started, self._arrived = True, False

    def wait(self) -> None:
        """Complete the step's message (a receive then unpacks into its array).

        Without a ``start`` since the last ``wait`` it returns at once, as MPI's does.
        """
        if not self._started:
            return
        self._started = False
        if not self._arrived:
            with _Truncation(self._expected or 0):
                self._request.Wait(self._status)
        if self._expected is None:
            return
        got = self._status.Get_count(MPI.BYTE)
        if got != self._expected and self._status.Get_source() != MPI.PROC_NULL:
            raise DatatypeError(f"received {got} bytes where {self._expected} were expected")
        if self._after is not None and self._status.Get_source() != MPI.PROC_NULL:
            self._after()

    def test(self) -> bool:
        """Whether the step's message has completed (``wait`` still has to be called).

        The request is completed here when it has (MPI's ``Request_get_status`` would
        leave it active, and MPICH's later wait then loses the message's status).
        """
        if self._started and not self._arrived:
            with _Truncation(self._expected or 0):
                self._arrived = bool(self._request.Test(self._status))
        return self._arrived or not self._started

    def free(self) -> None:
        """Release the MPI request (not while a step is in flight)."""
        if self._request != MPI.REQUEST_NULL:
            self._request.Free()

    def progress(self) -> bool:
        """Finish a started step without blocking once it has arrived, then release it."""
        if not self.test():
            return False
        self.wait()
        self.free()
        return True

    def describe(self) -> str:
        """What the request is, for warnings."""
        return "persistent " + ("send" if self._expected is None else "receive")

    def __del__(self) -> None:
        if not getattr(self, "_started", False):
            return
        adopt(self)  # a step in flight: kept alive (resurrected) until it completes
        warnings.warn(
            f"hpcpar: {self.describe()} dropped with a step in flight; call wait() on it. "
            "hpcpar completes it in the background",
            PendingRequestWarning,
            stacklevel=2,
        )

    def __enter__(self) -> PersistentRequest:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.free()


def _host_only(obj: Any, what: str) -> None:
    if is_device_array(obj):
        raise DatatypeError(f"{what} of GPU arrays is not supported: use send/recv or isend/irecv")


def send_init(
    obj: Any,
    dest: int,
    tag: int = 0,
    *,
    comm: Any = None,
    datatype: Any = None,
    count: int = 1,
    method: str = "auto",
) -> PersistentRequest:
    """A persistent ``send`` of ``obj`` (any layout, or ``count`` elements of ``datatype``).

    The same choices as ``send`` (``method``), made once. The receiver may use ``recv``,
    ``irecv`` or ``recv_init``: the bytes on the wire are the same.
    """
    _host_only(obj, "send_init")
    mpi_comm = resolve_comm(comm)
    p = _host_plan(obj, datatype)
    if p is None:  # contiguous: MPI sends the array itself
        data = _outgoing(obj, None, 1)
        return PersistentRequest(mpi_comm.Send_init(data, dest, tag), None, None, None, data)
    typed = _typed(obj, p, datatype, count, method, writable=False)
    if typed is not None:
        request = mpi_comm.Send_init(typed, dest, tag)
        return PersistentRequest(request, None, None, None, (typed, obj))
    out = np.empty(p.size * count, np.uint8)
    own = plan(obj if datatype is None else datatype)  # its packer remembers the buffers
    packer = own.packer(obj, out, count=1 if datatype is None else count)
    return PersistentRequest(mpi_comm.Send_init(out, dest, tag), packer, None, None, out)


def recv_init(
    obj: Any,
    source: int = MPI.ANY_SOURCE,
    tag: int = MPI.ANY_TAG,
    *,
    comm: Any = None,
    datatype: Any = None,
    count: int = 1,
    method: str = "auto",
) -> PersistentRequest:
    """A persistent ``recv`` into ``obj`` (any layout, or ``count`` elements of ``datatype``).

    Raises:
        DatatypeError: ``obj`` is read-only or too small, at once (not at the first wait).
    """
    _host_only(obj, "recv_init")
    if isinstance(obj, np.ndarray) and not obj.flags.writeable:
        raise DatatypeError("recv_init into a read-only array")
    mpi_comm = resolve_comm(comm)
    p = _host_plan(obj, datatype)
    if p is None:  # contiguous: MPI receives into the array itself
        if not isinstance(obj, np.ndarray):
            raise DatatypeError(f"recv needs a numpy array to fill, not {type(obj).__name__}")
        data = obj.reshape(-1).view(np.uint8) if obj.size else np.empty(0, np.uint8)
        request = mpi_comm.Recv_init(data, source, tag)
        return PersistentRequest(request, None, None, data.size, data)
    size = p.size * count
    typed = _typed(obj, p, datatype, count, method, writable=True)
    if typed is not None:
        request = mpi_comm.Recv_init(typed, source, tag)
        return PersistentRequest(request, None, None, size, (typed, obj))
    buffer = np.empty(size, np.uint8)
    own = plan(obj if datatype is None else datatype)  # its unpacker remembers the buffers
    # the unpacker is made by unpacking once: from obj's own packed values, so that
    # making it leaves obj as it was
    own.pack(obj, out=buffer, count=count)
    unpacker = own.unpacker(buffer, obj, count=count)
    return PersistentRequest(mpi_comm.Recv_init(buffer, source, tag), None, unpacker, size, buffer)
