"""Blocking and nonblocking point-to-point calls: send, recv, isend, irecv, sendrecv."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from mpi4py import MPI

from ..collectives.schedule import PendingRequestWarning
from ..datatypes import DatatypeError
from ..runtime import flight
from ..runtime.comm import resolve_comm
from ..runtime.orphans import adopt, progress_adopted
from ..runtime.switches import HOT
from .buffers import Incoming, Truncation, host_plan, mpi_typed, outgoing, receive

__all__ = ["send", "recv", "isend", "irecv", "sendrecv", "P2PRequest"]


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
        p = host_plan(obj, datatype)
        if p is not None:
            typed = mpi_typed(obj, p, datatype, count, method, writable=False)
            if typed is not None:
                resolve_comm(comm).Send(typed, dest, tag)
            elif datatype is None:
                resolve_comm(comm).Send(p.pack(obj), dest, tag)
            else:
                resolve_comm(comm).Send(p.pack(obj, count=count), dest, tag)
            return
        resolve_comm(comm).Send(outgoing(obj, datatype, count, method), dest, tag)
    finally:
        flight.leave(entry)


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
    view_plan = host_plan(obj, datatype)
    if view_plan is not None:
        typed = mpi_typed(obj, view_plan, datatype, count, method, writable=True)
        if typed is not None:
            size = view_plan.size * count
            receive(comm, typed, source, tag, status, size)
            if status.Get_count(MPI.BYTE) != size:
                raise DatatypeError(
                    f"received {status.Get_count(MPI.BYTE)} bytes where {size} were expected"
                )
            return obj
    incoming = Incoming(obj, datatype, count, method, view_plan)
    receive(comm, incoming.buffer, source, tag, status, incoming.buffer.nbytes)
    return incoming.finish(status)


class P2PRequest:
    """A pending ``isend``/``irecv``: ``wait()`` completes it (and unpacks a receive).

    Dropped unfinished, it warns and is completed in the background
    (``hpcpar.runtime.orphans``): its buffers stay alive until MPI is done with them.
    """

    def __init__(
        self, request: MPI.Request, keep: Any, incoming: Incoming | None = None, entry: Any = None
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
            with Truncation(self._expected()):
                self._arrived = bool(self._request.Test(self._status))
        return self._arrived

    def wait(self) -> Any:
        """Complete the message; return the received object (None for a send)."""
        if self._done:
            return self._result
        if not self._arrived:
            progress_adopted()
            if self._entry is not None:
                HOT.current = self._entry
            with Truncation(self._expected()):
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
    data = outgoing(obj, datatype, count)
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
    incoming = Incoming(obj, datatype, count)
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
        incoming = Incoming(recvobj, None, 1)
        status = MPI.Status()
        with Truncation(incoming.buffer.nbytes):
            resolve_comm(comm).Sendrecv(
                outgoing(sendobj, None, 1), dest, sendtag, incoming.buffer, source, recvtag, status
            )
        if source == MPI.PROC_NULL:
            return recvobj
        return incoming.finish(status)
    finally:
        flight.leave(entry)
