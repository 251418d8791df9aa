"""MPI requests for intercepted nonblocking and persistent collectives.

An intercepted ``Iallreduce`` returns a real ``MPI.Request``: a subclass whose handle is
an MPI generalized request (``MPI_Grequest_start``) that hpcpar completes when its own
nonblocking collective finishes. ``req.Wait()``/``req.Test()`` drive hpcpar's request
directly in the calling thread. Because the handle is a request the library knows,
``MPI.Request.Waitall``, ``Testany`` and the rest also work on lists that mix these with
the library's requests: while such a request is pending, a helper thread advances it
(every 0.2 ms) and completes its generalized request, which is what the library's wait
is waiting for. That needs ``MPI_THREAD_MULTIPLE`` (mpi4py's default); at a lower
thread level the nonblocking and persistent forms go to the library unchanged.

A persistent request (``Allreduce_init``) is a ``MPI.Prequest`` subclass whose
``Start()`` starts the nonblocking form and puts its generalized request in the handle.
"""

from __future__ import annotations

import atexit
import ctypes
import threading
import time
from collections.abc import Callable
from typing import Any

from mpi4py import MPI

__all__ = ["Request", "Prequest", "threads_allow"]

_HANDLE_SIZE = MPI._sizeof(MPI.Request)
_POLL = 0.0002
_pending: set[Any] = set()
_wake = threading.Condition()
_thread: threading.Thread | None = None
_stopping = False


def threads_allow() -> bool:
    """Whether the helper thread may call MPI (the job runs at ``MPI_THREAD_MULTIPLE``)."""
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


class _Pending:
    """What one started intercepted collective needs until it completes."""

    __slots__ = ("after", "done", "grequest", "lock", "work")

    def __init__(self, work: Any, after: Callable[[], None] | None) -> None:
        self.work, self.after = work, after
        self.grequest = MPI.Grequest.Start()
        self.lock = threading.Lock()
        self.done = False

    def advance(self, block: bool) -> bool:
        """Move hpcpar's request on (to its end when ``block``); True once complete."""
        if self.done:
            return True
        if block:
            self.work.wait()
        elif not self.work.test():
            return False
        if self.after is not None:
            self.after()
        self.done = True
        self.grequest.Complete()
        return True


def _adopt(request: MPI.Request, pending: _Pending) -> None:
    """Put ``pending``'s generalized request into ``request``'s handle and watch it."""
    ctypes.memmove(MPI._addressof(request), MPI._addressof(pending.grequest), _HANDLE_SIZE)
    request._hpcpar = pending  # type: ignore[attr-defined]
    with _wake:
        _pending.add(pending)
        _start_thread()
        _wake.notify()


def _drive(request: MPI.Request, block: bool) -> bool:
    pending = getattr(request, "_hpcpar", None)
    if pending is None:
        return True
    with pending.lock:
        done = pending.advance(block)
    if done:
        with _wake:
            _pending.discard(pending)
        request._hpcpar = None  # type: ignore[attr-defined]
    return done


class _Driven:
    """Wait/Test that drive hpcpar's request before the library sees the handle."""

    def Wait(self, status: Any = None) -> bool:
        _drive(self, True)  # type: ignore[arg-type]
        return MPI.Request.Wait(self, status)  # type: ignore[arg-type]

    def Test(self, status: Any = None) -> bool:
        if not _drive(self, False):  # type: ignore[arg-type]
            return False
        return MPI.Request.Test(self, status)  # type: ignore[arg-type]

    def wait(self, status: Any = None) -> Any:
        self.Wait(status)

    def test(self, status: Any = None) -> tuple[bool, Any]:
        return self.Test(status), None

    def Get_status(self, status: Any = None) -> bool:
        if not _drive(self, False):  # type: ignore[arg-type]
            return False
        return MPI.Request.Get_status(self, status)  # type: ignore[arg-type]

    def Cancel(self) -> None:
        return None

    def Free(self) -> None:
        _drive(self, True)  # type: ignore[arg-type]
        if self != MPI.REQUEST_NULL:  # type: ignore[comparison-overlap]
            MPI.Request.Free(self)  # type: ignore[arg-type]


class Request(_Driven, MPI.Request):
    """An intercepted nonblocking collective (a generalized request hpcpar completes)."""

    @classmethod
    def started(cls, work: Any, after: Callable[[], None] | None) -> Request:
        """A request for hpcpar's started request ``work`` (``after`` runs once it is done)."""
        request = cls()
        _adopt(request, _Pending(work, after))
        return request


class Prequest(_Driven, MPI.Prequest):
    """An intercepted persistent collective: each ``Start()`` runs it once more."""

    _hpcpar_start: Callable[[], tuple[Any, Callable[[], None] | None]]

    @classmethod
    def bound(cls, start: Callable[[], tuple[Any, Callable[[], None] | None]]) -> Prequest:
        """An inactive persistent request; each ``Start()`` calls ``start()``."""
        request = cls()
        request._hpcpar_start = start
        request._hpcpar = None  # type: ignore[attr-defined]
        return request

    def Start(self) -> None:
        """Start the collective once more (MPI reads the buffers now)."""
        if getattr(self, "_hpcpar", None) is not None:
            raise MPI.Exception(MPI.ERR_REQUEST)  # started twice without a wait
        work, after = self._hpcpar_start()
        _adopt(self, _Pending(work, after))

    def Free(self) -> None:
        """Finish a started collective and release the request."""
        _drive(self, True)
        if self != MPI.REQUEST_NULL:
            MPI.Request.Free(self)
        self._hpcpar_start = _freed


def _freed() -> tuple[Any, Any]:
    raise MPI.Exception(MPI.ERR_REQUEST)


def _start_thread() -> None:
    global _thread
    if _thread is None:
        _thread = threading.Thread(target=_progress, name="hpcpar-intercept", daemon=True)
        _thread.start()
        atexit.register(_stop)


def _progress() -> None:
    """Advance pending requests that no thread is waiting on, and complete them."""
    while True:
        with _wake:
            while not _pending and not _stopping:
                _wake.wait()
            if _stopping:
                return
            pending = list(_pending)
        for item in pending:
            if item.lock.acquire(blocking=False):
                try:
                    if item.advance(False):
                        with _wake:
                            _pending.discard(item)
                finally:
                    item.lock.release()
        time.sleep(_POLL)


def _stop() -> None:
    global _stopping
    with _wake:
        _stopping = True
        _wake.notify_all()
    if _thread is not None:
        _thread.join(timeout=5)
