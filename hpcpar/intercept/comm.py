"""Communicator classes whose buffer collectives go through hpcpar.

``Intracomm`` (and ``Cartcomm``, ``Graphcomm``, ``Distgraphcomm``) subclass mpi4py's
classes, which mpi4py allows; an instance made from a communicator shares its MPI
handle, so it *is* that communicator to the library and to every other object holding
the handle. Only the buffer collectives are overridden; everything else (point-to-point,
pickle-based lower-case calls, RMA, I/O, neighbourhood collectives, attributes) is
mpi4py's own method. Methods that make communicators return these classes again, so a
program's ``Dup``/``Split``/``Create_cart`` communicators stay intercepted.

hpcpar itself runs on a plain ``MPI.Intracomm`` view of the same handle (``_plain``):
its private duplicate and hierarchy are made from that view, so none of hpcpar's own
calls is intercepted again, and its state is cached on the handle (MPI attribute
caching), so it is found from every object of the communicator and freed with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from ..collectives.errors import CollectiveError, explain_mpi_error
from ..collectives.fastpath import REREAD, decided, fast_allreduce
from ..collectives.guard import verify
from ..collectives.registry import LIBRARY
from ..collectives.state import fast_state
from ..runtime.flight import fast_entry
from ..runtime.orphans import ADOPTED, progress_adopted
from ..runtime.switches import HOT
from . import record
from .calls import Call, prepare
from .message import IN_PLACE, Passthrough
from .requests import Prequest, Request, threads_allow

__all__ = ["Intracomm", "Cartcomm", "Graphcomm", "Distgraphcomm", "wrap", "configure"]

_SKIP: frozenset[str] = frozenset()
_ALLREDUCE = True  # "Allreduce" not in _SKIP
_NONBLOCKING = True
_FAST = record.FAST_ALLREDUCE
_SUM = MPI.SUM
_NDARRAY = np.ndarray
_BASE = MPI.Intracomm


def configure(skip: frozenset[str]) -> None:
    """Set the collectives left to the library (``HPCPAR_INTERCEPT_SKIP``)."""
    global _SKIP, _ALLREDUCE, _NONBLOCKING
    _SKIP = skip
    _ALLREDUCE = "Allreduce" not in skip
    _NONBLOCKING = threads_allow()


def _plain(comm: Any) -> MPI.Intracomm:
    """A plain ``MPI.Intracomm`` for ``comm``'s handle, kept on the object."""
    try:
        return comm._hpcpar_plain  # type: ignore[no-any-return]
    except AttributeError:
        plain = comm._hpcpar_plain = MPI.Intracomm(comm)
        return plain


# ---- the three forms of one collective -----------------------------------------------


def _prepared(
    comm: Any, shown: str, name: str, args: tuple[Any, ...], threads: bool
) -> Call | None:
    """The ``Call`` hpcpar runs for ``comm.<name>(*args)``; None (noted) when the library takes it.

    ``shown``: the name the record gives the call; ``threads``: the form needs the
    helper thread (nonblocking and persistent forms).
    """
    if name in _SKIP:
        reason = "HPCPAR_INTERCEPT_SKIP"
    elif threads and not _NONBLOCKING:
        reason = "MPI thread level below MULTIPLE"
    else:
        try:
            return prepare(name, _plain(comm), args)
        except Passthrough as why:
            reason = str(why)
    record.note(shown, "library", reason)
    return None  # the caller calls the library outside the except: its error comes alone


def _named(name: str, run: Callable[[], Any]) -> Any:
    """``run()``, its flight-record entry naming the call as the program made it."""
    HOT.named = name
    try:
        return run()
    finally:
        HOT.named = None  # not taken: the call continued an entry's run of calls


def _blocking(comm: Any, name: str, args: tuple[Any, ...], library: Callable[[], Any]) -> Any:
    call = _prepared(comm, name, name, args, False)
    if call is None:
        return library()
    _named(name, call.run)
    last = HOT.last_call  # what ran: the library's call (a tuple) or hpcpar's stats
    record.note(name, "hpcpar", "ran " + (LIBRARY if type(last) is tuple else last.algorithm))
    return None


def _nonblocking(comm: Any, name: str, args: tuple[Any, ...], library: Callable[[], Any]) -> Any:
    shown = "I" + name[0].lower() + name[1:]
    call = _prepared(comm, shown, name, args, True)
    if call is None:
        return library()
    record.note(shown, "hpcpar", "nonblocking")
    work, after = _named(shown, call.start)
    return Request.started(work, after)


def _persistent(comm: Any, name: str, args: tuple[Any, ...], library: Callable[[], Any]) -> Any:
    if _prepared(comm, name + "_init", name, args, True) is None:
        return library()
    record.note(name + "_init", "hpcpar", "nonblocking")
    plain = _plain(comm)
    # prepared again at each start: MPI reads the buffers when the request starts
    shown = name + "_init"
    return Prequest.bound(lambda: _named(shown, prepare(name, plain, args).start))


class _Intercepted:
    """The buffer collectives of an intracommunicator, routed through hpcpar."""

    # ---- blocking ----
    def Barrier(self) -> None:
        _blocking(self, "Barrier", (), lambda: _BASE.Barrier(self))

    def Bcast(self, buf: Any, root: int = 0) -> None:
        _blocking(self, "Bcast", (buf, root), lambda: _BASE.Bcast(self, buf, root))

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Any = _SUM, root: int = 0) -> None:
        _blocking(
            self,
            "Reduce",
            (sendbuf, recvbuf, op, root),
            lambda: _BASE.Reduce(self, sendbuf, recvbuf, op, root),
        )

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = _SUM) -> None:  # noqa: PLR0912
        # numpy arrays: the library's call where hpcpar decided so for such calls before
        # (decided), else hpcpar's fast path, given the communicator's state, else the
        # general path. The first, inline: every call costs time here (compare.py)
        if type(recvbuf) is _NDARRAY and _ALLREDUCE and sendbuf is not recvbuf:
            send = recvbuf if sendbuf is IN_PLACE else sendbuf
            if type(send) is _NDARRAY:
                try:
                    state = self._hpcpar_state
                except AttributeError:
                    state = self._hpcpar_state = fast_state(_plain(self))
                if state is not None:
                    known = state.fast_hit  # the last call's decision, else by the key
                    if (
                        known is None
                        or known.op is not op
                        or known.dtype is not recvbuf.dtype
                        or known.nbytes != recvbuf.nbytes
                        or not ~state._sequence & REREAD
                    ):
                        known = state.fast_seen.get((recvbuf.nbytes, recvbuf.dtype, id(op)))
                        if known is None or known.op is not op or not ~state._sequence & REREAD:
                            known = decided(state, recvbuf, op)
                        state.fast_hit = known
                    if known is not None and (
                        send is recvbuf
                        or (send.dtype is recvbuf.dtype and send.nbytes == recvbuf.nbytes)
                    ):
                        # what fast_allreduce does once it has decided
                        if ADOPTED:
                            progress_adopted()
                        if HOT.recording and HOT.last_key is not known:
                            fast_entry(known, state, "Allreduce", recvbuf, op)
                        seq = state._sequence = state._sequence + 1
                        if HOT.guard:
                            if state.guard_run is not known:
                                state.fold_guard_run(seq - 1)
                                state.guard_run, state.guard_run_from = known, seq
                            if seq >= state.guard_next:
                                verify(state, "allreduce")
                        try:
                            state.private.Allreduce(sendbuf, recvbuf, known.mpi_op)
                        except MPI.Exception as exc:
                            raise explain_mpi_error(exc, "allreduce") from None
                        HOT.last_call = known.library_call
                        _FAST[0] += 1
                        return
                    try:
                        if (
                            _named(
                                "Allreduce",
                                lambda: fast_allreduce(send, op, recvbuf, state, "auto"),
                            )
                            is not None
                        ):
                            _FAST[0] += 1
                            return
                    except CollectiveError:  # an op hpcpar refuses: the library decides
                        pass
                else:  # made by the general path below
                    del self._hpcpar_state
        _blocking(
            self,
            "Allreduce",
            (sendbuf, recvbuf, op),
            lambda: _BASE.Allreduce(self, sendbuf, recvbuf, op),
        )

    def Allgather(self, sendbuf: Any, recvbuf: Any) -> None:
        _blocking(
            self, "Allgather", (sendbuf, recvbuf), lambda: _BASE.Allgather(self, sendbuf, recvbuf)
        )

    def Allgatherv(self, sendbuf: Any, recvbuf: Any) -> None:
        _blocking(
            self,
            "Allgatherv",
            (sendbuf, recvbuf),
            lambda: _BASE.Allgatherv(self, sendbuf, recvbuf),
        )

    def Reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = _SUM) -> None:
        _blocking(
            self,
            "Reduce_scatter_block",
            (sendbuf, recvbuf, op),
            lambda: _BASE.Reduce_scatter_block(self, sendbuf, recvbuf, op),
        )

    def Reduce_scatter(
        self, sendbuf: Any, recvbuf: Any, recvcounts: Any = None, op: Any = _SUM
    ) -> None:
        _blocking(
            self,
            "Reduce_scatter",
            (sendbuf, recvbuf, recvcounts, op),
            lambda: _BASE.Reduce_scatter(self, sendbuf, recvbuf, recvcounts, op),
        )

    def Alltoall(self, sendbuf: Any, recvbuf: Any) -> None:
        _blocking(
            self, "Alltoall", (sendbuf, recvbuf), lambda: _BASE.Alltoall(self, sendbuf, recvbuf)
        )

    def Alltoallv(self, sendbuf: Any, recvbuf: Any) -> None:
        _blocking(
            self, "Alltoallv", (sendbuf, recvbuf), lambda: _BASE.Alltoallv(self, sendbuf, recvbuf)
        )

    # ---- nonblocking ----
    def Ibarrier(self) -> MPI.Request:
        return _nonblocking(self, "Barrier", (), lambda: _BASE.Ibarrier(self))

    def Ibcast(self, buf: Any, root: int = 0) -> MPI.Request:
        return _nonblocking(self, "Bcast", (buf, root), lambda: _BASE.Ibcast(self, buf, root))

    def Ireduce(self, sendbuf: Any, recvbuf: Any, op: Any = _SUM, root: int = 0) -> MPI.Request:
        return _nonblocking(
            self,
            "Reduce",
            (sendbuf, recvbuf, op, root),
            lambda: _BASE.Ireduce(self, sendbuf, recvbuf, op, root),
        )

    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Any = _SUM) -> MPI.Request:
        return _nonblocking(
            self,
            "Allreduce",
            (sendbuf, recvbuf, op),
            lambda: _BASE.Iallreduce(self, sendbuf, recvbuf, op),
        )

    def Iallgather(self, sendbuf: Any, recvbuf: Any) -> MPI.Request:
        return _nonblocking(
            self,
            "Allgather",
            (sendbuf, recvbuf),
            lambda: _BASE.Iallgather(self, sendbuf, recvbuf),
        )

    def Iallgatherv(self, sendbuf: Any, recvbuf: Any) -> MPI.Request:
        return _nonblocking(
            self,
            "Allgatherv",
            (sendbuf, recvbuf),
            lambda: _BASE.Iallgatherv(self, sendbuf, recvbuf),
        )

    def Ireduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = _SUM) -> MPI.Request:
        return _nonblocking(
            self,
            "Reduce_scatter_block",
            (sendbuf, recvbuf, op),
            lambda: _BASE.Ireduce_scatter_block(self, sendbuf, recvbuf, op),
        )

    def Ireduce_scatter(
        self, sendbuf: Any, recvbuf: Any, recvcounts: Any = None, op: Any = _SUM
    ) -> MPI.Request:
        return _nonblocking(
            self,
            "Reduce_scatter",
            (sendbuf, recvbuf, recvcounts, op),
            lambda: _BASE.Ireduce_scatter(self, sendbuf, recvbuf, recvcounts, op),
        )

    def Ialltoall(self, sendbuf: Any, recvbuf: Any) -> MPI.Request:
        return _nonblocking(
            self, "Alltoall", (sendbuf, recvbuf), lambda: _BASE.Ialltoall(self, sendbuf, recvbuf)
        )

    def Ialltoallv(self, sendbuf: Any, recvbuf: Any) -> MPI.Request:
        return _nonblocking(
            self,
            "Alltoallv",
            (sendbuf, recvbuf),
            lambda: _BASE.Ialltoallv(self, sendbuf, recvbuf),
        )

    # ---- persistent ----
    def Barrier_init(self, info: Any = MPI.INFO_NULL) -> MPI.Prequest:
        return _persistent(self, "Barrier", (), lambda: _BASE.Barrier_init(self, info))

    def Bcast_init(self, buf: Any, root: int = 0, info: Any = MPI.INFO_NULL) -> MPI.Prequest:
        return _persistent(
            self, "Bcast", (buf, root), lambda: _BASE.Bcast_init(self, buf, root, info)
        )

    def Reduce_init(
        self,
        sendbuf: Any,
        recvbuf: Any,
        op: Any = _SUM,
        root: int = 0,
        info: Any = MPI.INFO_NULL,
    ) -> MPI.Prequest:
        return _persistent(
            self,
            "Reduce",
            (sendbuf, recvbuf, op, root),
            lambda: _BASE.Reduce_init(self, sendbuf, recvbuf, op, root, info),
        )

    def Allreduce_init(
        self, sendbuf: Any, recvbuf: Any, op: Any = _SUM, info: Any = MPI.INFO_NULL
    ) -> MPI.Prequest:
        return _persistent(
            self,
            "Allreduce",
            (sendbuf, recvbuf, op),
            lambda: _BASE.Allreduce_init(self, sendbuf, recvbuf, op, info),
        )

    def Allgather_init(self, sendbuf: Any, recvbuf: Any, info: Any = MPI.INFO_NULL) -> MPI.Prequest:
        return _persistent(
            self,
            "Allgather",
            (sendbuf, recvbuf),
            lambda: _BASE.Allgather_init(self, sendbuf, recvbuf, info),
        )

    def Allgatherv_init(
        self, sendbuf: Any, recvbuf: Any, info: Any = MPI.INFO_NULL
    ) -> MPI.Prequest:
        return _persistent(
            self,
            "Allgatherv",
            (sendbuf, recvbuf),
            lambda: _BASE.Allgatherv_init(self, sendbuf, recvbuf, info),
        )

    def Reduce_scatter_block_init(
        self, sendbuf: Any, recvbuf: Any, op: Any = _SUM, info: Any = MPI.INFO_NULL
    ) -> MPI.Prequest:
        return _persistent(
            self,
            "Reduce_scatter_block",
            (sendbuf, recvbuf, op),
            lambda: _BASE.Reduce_scatter_block_init(self, sendbuf, recvbuf, op, info),
        )

    def Reduce_scatter_init(
        self,
        sendbuf: Any,
        recvbuf: Any,
        recvcounts: Any = None,
        op: Any = _SUM,
        info: Any = MPI.INFO_NULL,
    ) -> MPI.Prequest:
        return _persistent(
            self,
            "Reduce_scatter",
            (sendbuf, recvbuf, recvcounts, op),
            lambda: _BASE.Reduce_scatter_init(self, sendbuf, recvbuf, recvcounts, op, info),
        )

    def Alltoall_init(self, sendbuf: Any, recvbuf: Any, info: Any = MPI.INFO_NULL) -> MPI.Prequest:
        return _persistent(
            self,
            "Alltoall",
            (sendbuf, recvbuf),
            lambda: _BASE.Alltoall_init(self, sendbuf, recvbuf, info),
        )

    def Alltoallv_init(self, sendbuf: Any, recvbuf: Any, info: Any = MPI.INFO_NULL) -> MPI.Prequest:
        return _persistent(
            self,
            "Alltoallv",
            (sendbuf, recvbuf),
            lambda: _BASE.Alltoallv_init(self, sendbuf, recvbuf, info),
        )

    # ---- communicators made from this one stay intercepted ----
    def Split(self, color: int = 0, key: int = 0) -> Any:
        return wrap(_BASE.Split(self, color, key))

    def Split_type(self, split_type: int, key: int = 0, info: Any = MPI.INFO_NULL) -> Any:
        return wrap(_BASE.Split_type(self, split_type, key, info))

    def Create(self, group: MPI.Group) -> Any:
        return wrap(_BASE.Create(self, group))

    def Create_group(self, group: MPI.Group, tag: int = 0) -> Any:
        return wrap(_BASE.Create_group(self, group, tag))

    def Create_cart(self, *args: Any, **kwargs: Any) -> Any:
        return wrap(_BASE.Create_cart(self, *args, **kwargs))

    def Create_graph(self, *args: Any, **kwargs: Any) -> Any:
        return wrap(_BASE.Create_graph(self, *args, **kwargs))

    def Create_dist_graph(self, *args: Any, **kwargs: Any) -> Any:
        return wrap(_BASE.Create_dist_graph(self, *args, **kwargs))

    def Create_dist_graph_adjacent(self, *args: Any, **kwargs: Any) -> Any:
        return wrap(_BASE.Create_dist_graph_adjacent(self, *args, **kwargs))

    def Free(self) -> None:
        _BASE.Free(self)  # type: ignore[arg-type]
        self.__dict__.pop("_hpcpar_plain", None)
        self.__dict__.pop("_hpcpar_state", None)


class Intracomm(_Intercepted, MPI.Intracomm):
    """An intracommunicator whose buffer collectives go through hpcpar."""


class Cartcomm(_Intercepted, MPI.Cartcomm):
    """A cartesian communicator whose buffer collectives go through hpcpar."""

    def Sub(self, remain_dims: Any) -> Any:
        """The sub-grid communicator, intercepted."""
        return wrap(MPI.Cartcomm.Sub(self, remain_dims))


class Graphcomm(_Intercepted, MPI.Graphcomm):
    """A graph communicator whose buffer collectives go through hpcpar."""


class Distgraphcomm(_Intercepted, MPI.Distgraphcomm):
    """A distributed-graph communicator whose buffer collectives go through hpcpar."""


_CLASSES: dict[type, type] = {
    MPI.Intracomm: Intracomm,
    MPI.Cartcomm: Cartcomm,
    MPI.Graphcomm: Graphcomm,
    MPI.Distgraphcomm: Distgraphcomm,
}


def wrap(comm: Any) -> Any:
    """``comm`` as an intercepted communicator (intercommunicators and null as they are)."""
    cls = _CLASSES.get(type(comm))
    if cls is None or comm == MPI.COMM_NULL:
        return comm
    return cls(comm)
