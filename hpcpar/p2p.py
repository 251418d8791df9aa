"""Point-to-point on any layout: non-contiguous numpy views and MPI datatypes.

Contiguous arrays go to MPI as they are. Anything else is packed with its plan into a
contiguous buffer first (and unpacked on arrival): mpi4py refuses non-contiguous views
outright, and the numpy packer runs at memory speed. GPU arrays (cupy, or anything with
the CUDA array interface; any layout) travel through host memory, packed on the device
or staged by a 2D copy (``method``; see ``datatypes.choose``). With ``comm=None`` the
messages use hpcpar's own communicator, so both sides must use hpcpar; pass a
communicator to talk to code that calls mpi4py directly (the bytes on the wire are the
packed data).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from .collectives.buffers import is_device_array
from .datatypes import DatatypeError, plan
from .runtime.comm import resolve_comm

__all__ = ["send", "recv", "isend", "irecv", "sendrecv", "P2PRequest"]


def _owner(arr: np.ndarray) -> tuple[np.ndarray, int] | None:
    """The contiguous array that holds a view's memory, and the view's byte offset in it."""
    base = arr
    while isinstance(base.base, np.ndarray):
        base = base.base
    if not (base.flags.c_contiguous or base.flags.f_contiguous):
        return None
    offset = arr.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    return base.reshape(-1, order="A").view(np.uint8), offset


def _typed(arr: np.ndarray, method: str) -> tuple[Any, MPI.Datatype, int] | None:
    """A zero-copy MPI message for a non-contiguous view, when that is the method to use."""
    from .datatypes.choose import send_method
    from .datatypes.ir import shift
    from .datatypes.plan import Plan

    view_plan = plan(arr)
    if method == "auto":
        method = send_method(view_plan)[0]
    if method == "pack":
        return None
    if method != "datatype":
        raise DatatypeError(f"method must be auto, pack or datatype, not {method!r}")
    owner = _owner(arr)
    if owner is None:
        return None
    base, offset = owner
    dt = Plan(shift(view_plan.items, offset), 0, max(base.size, 1)).to_mpi()
    return [base, 1, dt], dt, view_plan.size


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
        return plan(datatype).pack(obj, count=count)
    arr = np.asarray(obj)
    if arr.flags.c_contiguous:
        return arr.reshape(-1).view(np.uint8) if arr.size else np.empty(0, np.uint8)
    return plan(arr).pack(arr)


class _Incoming:
    """Where a message lands: ``obj`` itself when contiguous, else a buffer to unpack."""

    def __init__(self, obj: Any, datatype: Any, count: int, method: str = "auto") -> None:
        self.obj, self.datatype, self.count = obj, datatype, count
        self.device: str | None = None
        if is_device_array(obj):  # arrives in host memory, then goes to the device
            from .datatypes.gpu import require_cupy

            require_cupy(obj)  # before the receive, not after it
            self.device = "datatype" if datatype is not None else _device_method(obj, method)
            self.plan = plan(datatype if datatype is not None else obj)
            self.buffer = np.empty(self.plan.size * count, np.uint8)
            return
        if datatype is not None:
            self.plan = plan(datatype)
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
            self.plan = plan(arr)
            self.buffer = np.empty(self.plan.size, np.uint8)

    def finish(self, status: MPI.Status) -> Any:
        got = status.Get_count(MPI.BYTE)
        if got != self.buffer.size:
            raise DatatypeError(f"received {got} bytes where {self.buffer.size} were expected")
        if self.device is not None:
            from .datatypes import gpu

            if self.device == "datatype":
                import cupy

                gpu.unpack_device(self.plan, cupy.asarray(self.buffer), self.obj, count=self.count)
                cupy.cuda.get_current_stream().synchronize()
            else:
                gpu.host_to_device(self.buffer, self.obj, self.device)
        elif self.plan is not None:
            self.plan.unpack(self.buffer, self.obj, count=self.count)
        return self.obj


class _Truncation:
    """Turn MPI's message-truncated error into a DatatypeError naming the sizes."""

    def __init__(self, expected: int) -> None:
        self.expected = expected

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        if isinstance(exc, MPI.Exception) and exc.Get_error_class() == MPI.ERR_TRUNCATE:
            raise DatatypeError(
                f"a message longer than the {self.expected} bytes expected arrived"
            ) from None
        return False


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

    ``method`` for non-contiguous views: ``"pack"`` (copy into a contiguous buffer),
    ``"datatype"`` (zero copy: MPI walks an equivalent derived datatype), or ``"auto"``
    (the measured table in the profile, else pack; see ``datatypes.explain_send``); for
    GPU arrays ``"staged"`` (a 2D copy into host memory), ``"device"`` (the pack kernel,
    then one copy) or ``"auto"``.
    """
    if datatype is None and isinstance(obj, np.ndarray) and not obj.flags.c_contiguous:
        typed = _typed(obj, method)
        if typed is not None:
            message, dt, _ = typed
            try:
                resolve_comm(comm).Send(message, dest, tag)
            finally:
                dt.Free()
            return
    resolve_comm(comm).Send(_outgoing(obj, datatype, count, method), dest, tag)


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
    status = status if status is not None else MPI.Status()
    if datatype is None and isinstance(obj, np.ndarray) and not obj.flags.c_contiguous:
        if not obj.flags.writeable:
            raise DatatypeError("recv into a read-only array")
        typed = _typed(obj, method)
        if typed is not None:
            message, dt, size = typed
            try:
                with _Truncation(size):
                    resolve_comm(comm).Recv(message, source, tag, status)
            finally:
                dt.Free()
            if status.Get_count(MPI.BYTE) != size:
                raise DatatypeError(
                    f"received {status.Get_count(MPI.BYTE)} bytes where {size} were expected"
                )
            return obj
    incoming = _Incoming(obj, datatype, count, method)
    with _Truncation(incoming.buffer.size):
        resolve_comm(comm).Recv(incoming.buffer, source, tag, status)
    return incoming.finish(status)


class P2PRequest:
    """A pending ``isend``/``irecv``: ``wait()`` completes it (and unpacks a receive)."""

    def __init__(self, request: MPI.Request, keep: Any, incoming: _Incoming | None = None) -> None:
        self._request, self._keep, self._incoming = request, keep, incoming

    def test(self) -> bool:
        """Whether the message has completed (a receive is unpacked by ``wait``)."""
        return bool(self._request.Test())

    def wait(self) -> Any:
        """Complete the message; return the received object (None for a send)."""
        status = MPI.Status()
        with _Truncation(self._incoming.buffer.size if self._incoming else 0):
            self._request.Wait(status)
        return None if self._incoming is None else self._incoming.finish(status)


def isend(
    obj: Any, dest: int, tag: int = 0, *, comm: Any = None, datatype: Any = None, count: int = 1
) -> P2PRequest:
    """Nonblocking ``send``; the data is packed (copied) when the call starts if needed."""
    data = _outgoing(obj, datatype, count)
    return P2PRequest(resolve_comm(comm).Isend(data, dest, tag), data)


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
    incoming = _Incoming(obj, datatype, count)
    return P2PRequest(
        resolve_comm(comm).Irecv(incoming.buffer, source, tag), incoming.buffer, incoming
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
    incoming = _Incoming(recvobj, None, 1)
    status = MPI.Status()
    with _Truncation(incoming.buffer.size):
        resolve_comm(comm).Sendrecv(
            _outgoing(sendobj, None, 1), dest, sendtag, incoming.buffer, source, recvtag, status
        )
    if source == MPI.PROC_NULL:
        return recvobj
    return incoming.finish(status)
