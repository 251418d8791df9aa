"""Persistent point-to-point: ``send_init`` and ``recv_init`` make every choice once.

The point-to-point counterpart of ``hpcpar.collectives.persistent``.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from mpi4py import MPI

from ..collectives.schedule import PendingRequestWarning
from ..datatypes import DatatypeError, plan
from ..runtime.comm import resolve_comm
from ..runtime.devices import is_device_array
from ..runtime.orphans import adopt
from .buffers import Truncation, host_plan, mpi_typed, outgoing

__all__ = ["send_init", "recv_init", "PersistentRequest"]


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
            with Truncation(self._expected or 0):
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
            with Truncation(self._expected or 0):
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
    p = host_plan(obj, datatype)
    if p is None:  # contiguous: MPI sends the array itself
        data = outgoing(obj, None, 1)
        return PersistentRequest(mpi_comm.Send_init(data, dest, tag), None, None, None, data)
    typed = mpi_typed(obj, p, datatype, count, method, writable=False)
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
    p = host_plan(obj, datatype)
    if p is None:  # contiguous: MPI receives into the array itself
        if not isinstance(obj, np.ndarray):
            raise DatatypeError(f"recv needs a numpy array to fill, not {type(obj).__name__}")
        data = obj.reshape(-1).view(np.uint8) if obj.size else np.empty(0, np.uint8)
        request = mpi_comm.Recv_init(data, source, tag)
        return PersistentRequest(request, None, None, data.size, data)
    size = p.size * count
    typed = mpi_typed(obj, p, datatype, count, method, writable=True)
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
