"""Each intercepted mpi4py collective as the hpcpar call that does the same.

``prepare(name, plain, args)`` reads an mpi4py call's arguments and returns a ``Call``:
``run()`` does it blocking, ``start()`` starts it as hpcpar's nonblocking collective and
returns the request and what to do once it completes (copies into the caller's buffers
where MPI's layout and hpcpar's differ). It raises ``Passthrough`` when the library
should take the call as it is (``message`` says when), so arguments the library would
refuse reach it and fail with its own ``MPI.Exception``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from .. import collectives as hc
from ..collectives.mpi_library import native_mpi_op
from ..collectives.registry import LIBRARY
from ..collectives.select import choose
from ..collectives.state import state_for
from ..runtime.flight import mpi_op_name
from .message import (
    IN_PLACE,
    Derived,
    Passthrough,
    Vector,
    derived,
    is_derived,
    message,
    pair,
    vector,
)

__all__ = ["Call", "prepare", "reduction"]

_NOT_REDUCTIONS = (MPI.REPLACE, MPI.NO_OP, MPI.OP_NULL)
_wrapped: dict[tuple[int, int], Callable[[np.ndarray, np.ndarray], np.ndarray]] = {}


class Call:
    """One prepared intercepted call: ``run()`` blocking, ``start()`` nonblocking."""

    __slots__ = ("after", "blocking", "nonblocking")

    def __init__(
        self,
        blocking: Callable[[], Any],
        nonblocking: Callable[[], Any],
        after: Callable[[], None] | None = None,
    ) -> None:
        self.blocking, self.nonblocking, self.after = blocking, nonblocking, after

    def run(self) -> None:
        """Run the call to its end (blocking)."""
        self.blocking()
        if self.after is not None:
            self.after()

    def start(self) -> tuple[Any, Callable[[], None] | None]:
        """Start the nonblocking form: ``(hpcpar's request, what to run once it is done)``."""
        return self.nonblocking(), self.after


def reduction(op: Any, dtype: np.dtype, datatype: Any) -> Any:
    """The ``op=`` hpcpar runs for an MPI op on ``dtype``.

    A predefined op on a native integer, float or complex type that hpcpar applies
    itself passes as it is. ``MINLOC``/``MAXLOC`` on a pair type and any user op (from
    ``MPI.Op.Create``) become a function that applies the library's own op with
    ``MPI_Reduce_local``, so the result is the library's whatever the op. Any other
    combination (a predefined op on a type MPI does not define it for, ``REPLACE``) is
    left to the library, which gives its own result or error.
    """
    if not isinstance(op, MPI.Op) or any(op == o for o in _NOT_REDUCTIONS):
        raise Passthrough("this op")
    if op.is_predefined:
        pair_op = op in (MPI.MINLOC, MPI.MAXLOC)
        if pair_op != (dtype.fields is not None):
            raise Passthrough(f"op {mpi_op_name(op)} on this datatype")
        if not pair_op:
            try:
                if dtype.isnative and native_mpi_op(op, dtype) is not None:
                    return op
            except hc.CollectiveError:
                pass
            raise Passthrough(f"op {mpi_op_name(op)} on {dtype}")
    if datatype is None:
        raise Passthrough("an op hpcpar cannot apply without a datatype")
    key = (op.py2f(), datatype.py2f())
    found = _wrapped.get(key)
    if found is None:

        def apply(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            out = b.copy()
            op.Reduce_local([a, datatype], [out, datatype])
            return out

        apply.__name__ = mpi_op_name(op)
        found = _wrapped[key] = apply
    return found


def _datatype(spec: Any) -> Any:
    """The MPI datatype a message names explicitly, else None."""
    if isinstance(spec, (list, tuple)) and spec and isinstance(spec[-1], (MPI.Datatype, str)):
        dt = spec[-1]
        return MPI.Datatype.fromcode(dt) if isinstance(dt, str) else dt
    return None


def _op_for(op: Any, x: np.ndarray, *specs: Any) -> Any:
    datatype = None
    for spec in specs:
        datatype = datatype or _datatype(spec)
    if datatype is None and x.dtype.fields is None:
        try:
            datatype = MPI.Datatype.fromcode(x.dtype.char)
        except (KeyError, ValueError):
            datatype = None
    return reduction(op, x.dtype, datatype)


def _same(a: np.ndarray, b: np.ndarray) -> None:
    pair(a, b)
    if a.size != b.size:
        raise Passthrough("different send and receive counts")


# ---- the collectives ------------------------------------------------------------------


def _barrier(plain: Any) -> Call:
    return Call(lambda: hc.barrier(comm=plain), lambda: hc.ibarrier(comm=plain))


def _bcast(plain: Any, buf: Any, root: int) -> Call:
    root = _root(plain, root)
    at_root = plain.Get_rank() == root
    if is_derived(buf):
        return _bcast_derived(plain, derived(buf, writable=not at_root), root, at_root)
    data = message(buf, writable=not at_root)
    out = None if at_root else data
    return Call(
        lambda: hc.bcast(data, root, out=out, comm=plain),
        lambda: hc.ibcast(data, root, out=out, comm=plain),
    )


def _bcast_derived(plain: Any, msg: Derived, root: int, at_root: bool) -> Call:
    """A derived datatype's bytes broadcast by hpcpar, where it runs another algorithm.

    Packing costs a copy on every rank; it pays off only where the cost model chooses
    an algorithm other than the library's call for the packed size, so elsewhere the
    call goes to the library with its datatype.
    """
    nbytes = msg.nbytes
    chosen, _ = choose("bcast", "auto", None, state_for(plain), nbytes, 1)
    if chosen.name == LIBRARY:
        raise Passthrough("derived datatype: the library's call at this size")
    packed = msg.pack() if at_root else np.empty(nbytes, dtype=np.uint8)
    return Call(
        lambda: hc.bcast(packed, root, out=packed, comm=plain),
        lambda: hc.ibcast(packed, root, out=packed, comm=plain),
        None if at_root else lambda: msg.unpack(packed),
    )


def _root(plain: Any, root: Any) -> int:
    if not isinstance(root, (int, np.integer)) or not 0 <= root < plain.Get_size():
        raise Passthrough("a root outside the communicator")
    return int(root)


def _reduce(plain: Any, sendbuf: Any, recvbuf: Any, op: Any, root: int) -> Call:
    root = _root(plain, root)
    at_root = plain.Get_rank() == root
    recv = message(recvbuf, writable=True) if at_root else None
    if sendbuf is IN_PLACE:
        if recv is None:
            raise Passthrough("MPI.IN_PLACE on a rank that is not the root")
        x = recv
    else:
        x = message(sendbuf, writable=False)
        if recv is not None:
            _same(x, recv)
    rop = _op_for(op, x, sendbuf, recvbuf)
    return Call(
        lambda: hc.reduce(x, root, rop, out=recv, comm=plain),
        lambda: hc.ireduce(x, root, rop, out=recv, comm=plain),
    )


def _allreduce(plain: Any, sendbuf: Any, recvbuf: Any, op: Any) -> Call:
    recv = message(recvbuf, writable=True)
    if sendbuf is IN_PLACE:
        x = recv
    else:
        x = message(sendbuf, writable=False)
        _same(x, recv)
    rop = _op_for(op, x, sendbuf, recvbuf)
    return Call(
        lambda: hc.allreduce(x, rop, out=recv, comm=plain),
        lambda: hc.iallreduce(x, rop, out=recv, comm=plain),
    )


def _allgather(plain: Any, sendbuf: Any, recvbuf: Any) -> Call:
    p, r = plain.Get_size(), plain.Get_rank()
    recv = message(recvbuf, writable=True, blocks=p)
    n = recv.size // p
    if sendbuf is IN_PLACE:
        x = recv[r * n : (r + 1) * n]
    else:
        x = message(sendbuf, writable=False)
        pair(x, recv)
        if x.size != n:
            raise Passthrough("different send and receive counts")
    out = recv.reshape(p, n)
    return Call(
        lambda: hc.allgather(x, out=out, comm=plain),
        lambda: hc.iallgather(x, out=out, comm=plain),
    )


def _allgatherv(plain: Any, sendbuf: Any, recvbuf: Any) -> Call:
    p, r = plain.Get_size(), plain.Get_rank()
    recv = vector(recvbuf, p, writable=True)
    x = recv.block(r) if sendbuf is IN_PLACE else message(sendbuf, writable=False)
    pair(x, recv.array)
    if x.size != recv.counts[r]:
        raise Passthrough("different send and receive counts")
    if recv.packed():
        out = recv.array[: sum(recv.counts)]
        return Call(
            lambda: hc.allgather(x, counts=recv.counts, out=out, comm=plain),
            lambda: hc.iallgather(x, counts=recv.counts, out=out, comm=plain),
        )
    out = np.empty(sum(recv.counts), dtype=recv.array.dtype)
    return Call(
        lambda: hc.allgather(x, counts=recv.counts, out=out, comm=plain),
        lambda: hc.iallgather(x, counts=recv.counts, out=out, comm=plain),
        lambda: _spread(out, recv),
    )


def _spread(packed: np.ndarray, into: Vector) -> None:
    at = 0
    for i, count in enumerate(into.counts):
        into.array[into.displs[i] : into.displs[i] + count] = packed[at : at + count]
        at += count


def _gathered(vec: Vector) -> np.ndarray:
    if vec.packed():
        return vec.array[: sum(vec.counts)]
    return np.concatenate([vec.block(i) for i in range(len(vec.counts))])


def _reduce_scatter_block(plain: Any, sendbuf: Any, recvbuf: Any, op: Any) -> Call:
    p = plain.Get_size()
    if sendbuf is IN_PLACE:
        recv = message(recvbuf, writable=True, blocks=p)
        x, n = recv.copy(), recv.size // p
    else:
        recv = message(recvbuf, writable=True)
        x, n = message(sendbuf, writable=False, blocks=p), recv.size
        pair(x, recv)
        if x.size != n * p:
            raise Passthrough("a send count that is not the ranks times the receive count")
    counts = [n] * p
    return _scatter_call(plain, x, op, counts, recv[:n], sendbuf, recvbuf)


def _scatter_call(
    plain: Any, x: np.ndarray, op: Any, counts: list[int], out: np.ndarray, *specs: Any
) -> Call:
    rop = _op_for(op, x, *specs)
    return Call(
        lambda: hc.reduce_scatter(x, rop, counts=counts, out=out, comm=plain),
        lambda: hc.ireduce_scatter(x, rop, counts=counts, out=out, comm=plain),
    )


def _reduce_scatter(
    plain: Any, sendbuf: Any, recvbuf: Any, recvcounts: Any = None, op: Any = MPI.SUM
) -> Call:
    p, r = plain.Get_size(), plain.Get_rank()
    if recvcounts is None:
        if sendbuf is IN_PLACE:
            raise Passthrough("MPI.IN_PLACE without recvcounts")
        # as mpi4py does: every rank's receive count, gathered
        mine = np.array([message(recvbuf, writable=True).size], dtype=np.int64)
        recvcounts = hc.allgather(mine, comm=plain).reshape(-1)
    try:
        counts = [int(c) for c in recvcounts]
    except (TypeError, ValueError):
        raise Passthrough("recvcounts") from None
    if len(counts) != p or any(c < 0 for c in counts):
        raise Passthrough("recvcounts")
    recv = message(recvbuf, writable=True)
    if sendbuf is IN_PLACE:
        if recv.size < sum(counts):
            raise Passthrough("an in-place buffer shorter than the counts")
        x = recv[: sum(counts)].copy()
    else:
        x = message(sendbuf, writable=False)
        pair(x, recv)
        if x.size != sum(counts) or recv.size < counts[r]:
            raise Passthrough("counts beyond the buffers")
    return _scatter_call(plain, x, op, counts, recv[: counts[r]], sendbuf, recvbuf)


def _alltoall(plain: Any, sendbuf: Any, recvbuf: Any) -> Call:
    p = plain.Get_size()
    recv = message(recvbuf, writable=True, blocks=p)
    if sendbuf is IN_PLACE:
        x = recv.copy()
    else:
        x = message(sendbuf, writable=False, blocks=p)
        _same(x, recv)
    return Call(
        lambda: hc.alltoall(x, out=recv, comm=plain),
        lambda: hc.ialltoall(x, out=recv, comm=plain),
    )


def _alltoallv(plain: Any, sendbuf: Any, recvbuf: Any) -> Call:
    p = plain.Get_size()
    recv = vector(recvbuf, p, writable=True)
    send = recv if sendbuf is IN_PLACE else vector(sendbuf, p, writable=False)
    pair(send.array, recv.array)
    x = _gathered(send).copy() if sendbuf is IN_PLACE else _gathered(send)
    got: list[Any] = []

    def keep(result: Any) -> None:
        got.append(result)

    def unpack() -> None:
        data, counts = got[-1]
        if list(counts) != recv.counts:
            raise MPI.Exception(MPI.ERR_TRUNCATE)
        _spread(data, recv)

    return Call(
        lambda: keep(hc.alltoallv(x, send.counts, comm=plain)),
        lambda: _Kept(hc.ialltoallv(x, send.counts, comm=plain), keep),
        unpack,
    )


class _Kept:
    """A request whose result is handed to ``keep`` when it completes."""

    __slots__ = ("_keep", "_request")

    def __init__(self, request: Any, keep: Callable[[Any], None]) -> None:
        self._request, self._keep = request, keep

    def test(self) -> bool:
        if self._request.test():
            self._keep(self._request.wait())
            return True
        return False

    def wait(self) -> Any:
        value = self._request.wait()
        self._keep(value)
        return value


_PREPARE: dict[str, Callable[..., Call]] = {
    "Barrier": _barrier,
    "Bcast": _bcast,
    "Reduce": _reduce,
    "Allreduce": _allreduce,
    "Allgather": _allgather,
    "Allgatherv": _allgatherv,
    "Reduce_scatter_block": _reduce_scatter_block,
    "Reduce_scatter": _reduce_scatter,
    "Alltoall": _alltoall,
    "Alltoallv": _alltoallv,
}

NAMES = tuple(_PREPARE)


def prepare(name: str, plain: Any, args: tuple[Any, ...]) -> Call:
    """The ``Call`` for mpi4py's ``comm.<name>(*args)`` on ``plain`` (or Passthrough)."""
    return _PREPARE[name](plain, *args)
