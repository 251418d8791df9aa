"""The public collectives: argument checks, algorithm choice, blocking and nonblocking forms.

Each collective is prepared once (``_prepare_*``: validate, choose, build the schedule
and the function that delivers the result); the blocking form runs the schedule to the
end, the ``i*`` form returns a ``CollectiveRequest`` that advances it on ``test()``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

from ..runtime.env import getenv_fast
from . import mpi_library
from . import reproducible as repro
from .autotune import autotune_on as _autotune_on
from .autotune import tuned_algorithm
from .buffers import check_out, host_array, result_buffer, to_device_like
from .call import open_call
from .channel import CollectiveStats, even_counts
from .check import check_same, checking
from .errors import CollectiveError
from .ops import ReduceOp, resolve_op
from .schedule import CollectiveRequest, Schedule, run
from .select import choose
from .state import fast_state as _fast_state
from .state import state_for

__all__ = [
    "allreduce",
    "reduce",
    "bcast",
    "allgather",
    "reduce_scatter",
    "alltoall",
    "alltoallv",
    "barrier",
    "iallreduce",
    "allreduce_init",
    "PersistentAllreduce",
    "ireduce",
    "ibcast",
    "iallgather",
    "ireduce_scatter",
    "ialltoall",
    "ialltoallv",
    "ibarrier",
    "last_stats",
]

_last: list[Any] = [None]  # CollectiveStats, or the fast path's (collective, bytes)


def last_stats() -> CollectiveStats | None:
    """Counters of the collective this rank completed last (messages and bytes per level)."""
    last = _last[0]
    if type(last) is tuple:  # the library's call, made by the fast path: made up on demand
        stats = CollectiveStats(last[0], "mpi", last[1])
        stats.inside_mpi = True
        _last[0] = last = stats
    return last


@dataclass
class _Pending:
    name: str
    schedule: Schedule
    finish: Callable[[Any], Any]


def _complete(prepare: Callable[..., _Pending], *args: Any) -> Any:
    pending = prepare(*args, blocking=True)
    return pending.finish(run(pending.schedule))


def _request(prepare: Callable[..., _Pending], *args: Any) -> CollectiveRequest:
    pending = prepare(*args, blocking=False)
    return CollectiveRequest(pending.name, pending.schedule, pending.finish)


def _begin(
    collective: str,
    comm: Any,
    algorithm: str,
    op: ReduceOp | None,
    nbytes: int,
    blocking: bool,
    itemsize: int = 1,
    **check: Any,
) -> tuple[Any, Any]:
    """Check arguments across ranks (HPCPAR_CHECK), choose the algorithm, open the call."""
    state = state_for(comm)
    if checking():
        check_same(
            state.private, collective, algorithm=algorithm, op=op.name if op else None, **check
        )
    chosen, reason = choose(collective, algorithm, op, state, nbytes, itemsize)
    call = open_call(state, collective, chosen.name, nbytes, blocking)
    call.stats.steps.append(reason)
    return chosen, call


def _finisher(call: Any, deliver: Callable[[], Any]) -> Callable[[Any], Any]:
    def finish(_value: Any) -> Any:
        _last[0] = call.stats
        return deliver()

    return finish


def _root(root: int, size: int, collective: str) -> int:
    if not isinstance(root, (int, np.integer)) or not 0 <= int(root) < size:
        raise CollectiveError(f"{collective}: root must be a rank in 0..{size - 1}, not {root!r}")
    return int(root)


# ---- allreduce -------------------------------------------------------------------------


def _prepare_allreduce(
    x: Any, op: Any, out: Any, comm: Any, algorithm: str, reproducible: bool, blocking: bool = True
) -> _Pending:
    data = host_array(x)
    rop = resolve_op(op, data.dtype)
    work, deliver = result_buffer(data, data.shape, data.dtype, out)
    chosen, call = _begin(
        "allreduce",
        comm,
        algorithm,
        rop,
        work.nbytes,
        blocking,
        itemsize=data.itemsize,
        count=data.size,
        dtype=data.dtype.str,
        reproducible=bool(reproducible),
    )
    if reproducible:
        schedule = repro.allreduce(call, chosen, work, rop)
    else:
        schedule = chosen.run(call, work, rop)
    return _Pending("iallreduce", schedule, _finisher(call, _on_device(x, out, deliver)))


def _on_device(x: Any, out: Any, deliver: Callable[[], Any]) -> Callable[[], Any]:
    if out is not None:
        return deliver
    return lambda: to_device_like(x, deliver())


_AUTO_ENV = (b"HPCPAR_ALGORITHM_ALLREDUCE", b"HPCPAR_RULES", b"HPCPAR_PROFILE")
_native_ops: dict[tuple[int, Any], tuple[Any, Any]] = {}  # (id(op), dtype) -> (op, MPI op)


def _fast_allreduce(x: Any, op: Any, out: Any, comm: Any, algorithm: str) -> Any:
    """The MPI library's blocking Allreduce with as little Python as possible, or None.

    Taken only when the general path would do exactly this: numpy arrays, a predefined
    op on a native dtype, the ``mpi`` algorithm, no checks. It still takes a tag from
    the sequence, so every rank's sequence stays the same whichever path it took.
    """
    state = _fast_state(comm)
    if state is None or type(x) is not np.ndarray or not isinstance(op, MPI.Op) or checking():
        return None
    if algorithm == "auto":
        # auto's choice depends on the size, the element size and three variables
        # (read on every call, so changing one takes effect at once); remember it.
        key = (x.nbytes, x.itemsize, getenv_fast("", _AUTO_ENV[0]),
               getenv_fast("", _AUTO_ENV[1]), getenv_fast("", _AUTO_ENV[2]))  # fmt: skip
        use_mpi = state.fast_auto.get(key)
        if use_mpi is None:
            use_mpi = choose("allreduce", "auto", None, state, x.nbytes, x.itemsize)[0].name
            use_mpi = state.fast_auto[key] = use_mpi == "mpi"
            if len(state.fast_auto) > 4096:  # a program sweeping every size
                state.fast_auto.clear()
        if not use_mpi:
            return None
    elif algorithm != "mpi":
        return None
    native = _native_ops.get((id(op), x.dtype))
    if native is None or native[0] is not op:  # the entry holds op: its id is not reused
        rop = resolve_op(op, x.dtype)
        native = (op, rop.mpi_op if mpi_library.is_native(rop, x.dtype) else None)
        _native_ops[(id(op), x.dtype)] = native
    if native[1] is None or not x.flags.c_contiguous:
        return None
    if out is None:
        out = np.empty_like(x)
    usable = type(out) is np.ndarray and out.shape == x.shape and out.dtype == x.dtype
    if not (usable and out.flags.c_contiguous and out.flags.writeable):
        return None
    state.next_tag()
    if out is x:
        state.private.Allreduce(MPI.IN_PLACE, out, native[1])
    else:
        state.private.Allreduce(x, out, native[1])
    _last[0] = ("allreduce", x.nbytes)
    return out


def allreduce(
    x: Any,
    op: Any = MPI.SUM,
    *,
    out: Any = None,
    comm: Any = None,
    algorithm: str = "auto",
    reproducible: bool = False,
    autotune: bool | None = None,
) -> Any:
    """Reduce ``x`` over all ranks; every rank gets the result.

    Args:
        x: This rank's contribution (numpy or cupy array, any shape).
        op: ``MPI.SUM`` (and the other predefined ops), a numpy ufunc, or a function
            ``f(a, b) -> array`` (taken as non-commutative, applied in rank order).
        out: Where to put the result (same shape and dtype as ``x``; may be ``x``).
        comm: ``None`` (hpcpar's communicator), a communicator, or a ``Hierarchy``.
        algorithm: ``"auto"`` or a name from ``hpcpar.collectives.algorithms_for("allreduce")``.
        reproducible: Bitwise identical results whatever the algorithm and layout
            (see ``hpcpar.collectives.reproducible``).
        autotune: With ``auto``, time the model's best candidates on the first call of
            each size class and keep the fastest (``hpcpar.collectives.autotune``);
            None: as ``HPCPAR_AUTOTUNE`` says.

    Returns:
        The reduced array (``out`` when given).
    """
    if (
        algorithm == "auto"
        and not reproducible
        and (autotune or (autotune is None and _autotune_on()))
    ):
        algorithm = tuned_algorithm(x, op, comm)[0]
    if not reproducible:
        result = _fast_allreduce(x, op, out, comm, algorithm)
        if result is not None:
            return result
    return _complete(_prepare_allreduce, x, op, out, comm, algorithm, reproducible)


PERSISTENT_PROBE_BYTES = 1 << 20


class PersistentAllreduce:
    """An allreduce bound to its buffers and its algorithm (``allreduce_init``).

    ``start()`` then ``wait()`` (or ``call()``, both) as often as wanted; ``x`` may be
    changed between calls, never between ``start()`` and ``wait()``. ``free()`` (or a
    ``with`` block) releases it. ``algorithm`` and ``reason`` say what was chosen.
    """

    def __init__(self, x: Any, op: Any, out: Any, comm: Any, algorithm: str) -> None:
        state = state_for(comm)
        data = host_array(x)
        rop = resolve_op(op, data.dtype)
        if out is None:
            out = np.empty_like(x)
        else:
            check_out(out, tuple(data.shape), data.dtype)
        chosen, self.reason = choose("allreduce", algorithm, rop, state, data.nbytes,
                                     data.itemsize)  # fmt: skip
        self.algorithm = chosen.name
        self.x, self.out, self._op, self._comm, self._state = x, out, op, comm, state
        self._running: Any = None
        self._freed = False
        self._request: Any = None
        library = (
            chosen.name == "mpi"
            and type(x) is np.ndarray
            and type(out) is np.ndarray
            and x.flags.c_contiguous
            and out.flags.c_contiguous
            and mpi_library.is_native(rop, data.dtype)
        )
        if library:  # the library's call, bound: its persistent request or its blocking call
            self._mpi_op = rop.mpi_op
            self._request = self._faster_library_call(state, x, out, rop.mpi_op)
            self._library = True
        else:
            self._library = False

    def start(self) -> None:
        """Begin one allreduce of ``x`` into ``out`` (collective)."""
        if self._freed:
            raise CollectiveError("persistent allreduce: used after free()")
        if self._running is not None:
            raise CollectiveError("persistent allreduce: start() again before wait()")
        if self._library:
            self._state.next_tag()  # the same tag sequence as a plain call
            if self._request is not None:
                self._request.Start()
            else:
                self._blocking()
            self._running = True
        else:
            self._running = iallreduce(self.x, self._op, out=self.out, comm=self._comm,
                                       algorithm=self.algorithm)  # fmt: skip

    def wait(self) -> Any:
        """Finish the allreduce ``start()`` began; returns ``out``."""
        if self._running is None:
            raise CollectiveError("persistent allreduce: wait() without start()")
        running, self._running = self._running, None
        if self._library:
            if self._request is not None:
                self._request.Wait()
            _last[0] = ("allreduce", self.out.nbytes)
            return self.out
        return running.wait()

    def __call__(self) -> Any:
        """``start()`` and ``wait()``: one blocking allreduce; returns ``out``."""
        if self._library and self._running is None and not self._freed:
            self._state.next_tag()
            if self._request is not None:
                self._request.Start()
                self._request.Wait()
            else:
                self._blocking()
            _last[0] = ("allreduce", self.out.nbytes)
            return self.out
        self.start()
        return self.wait()

    def _blocking(self) -> None:
        if self.out is self.x:
            self._state.private.Allreduce(MPI.IN_PLACE, self.out, self._mpi_op)
        else:
            self._state.private.Allreduce(self.x, self.out, self._mpi_op)

    def _faster_library_call(self, state: Any, x: Any, out: Any, mpi_op: Any) -> Any:
        """The library's persistent request, or None for its blocking call (collective).

        Whichever is faster here.

        MPI libraries may run persistent collectives with other algorithms than the
        blocking ones (MPICH 5 on the virtual cluster: 0.5x the time at 16 B, 1.45x at
        256 KiB), so up to ``PERSISTENT_PROBE_BYTES`` both are timed on the bound
        buffers (three loops of three calls each, every loop started together and
        counted on its slowest rank; ``out`` gets overwritten, ``x`` too when in place);
        above, the blocking call, whose Python cost no longer matters.
        """
        if x.nbytes > PERSISTENT_PROBE_BYTES:
            self.reason += "; bound to the library's blocking call"
            return None
        comm = state.private
        saved = x.copy() if out is x else None
        request = comm.Allreduce_init(MPI.IN_PLACE if out is x else x, out, mpi_op)

        def persistent() -> None:
            request.Start()
            request.Wait()

        best = []
        for call in (persistent, self._blocking):
            call()
            fastest = float("inf")
            for _ in range(3):
                comm.Barrier()
                start = time.perf_counter()
                for _ in range(3):
                    call()
                took = comm.allreduce((time.perf_counter() - start) / 3, op=MPI.MAX)
                fastest = min(fastest, took)
            best.append(fastest)
        if saved is not None:
            np.copyto(x, saved)
        kept = "persistent request" if best[0] <= best[1] else "blocking call"
        self.reason += (f"; bound to the library's {kept} (persistent {best[0] * 1e6:.1f} us,"
                        f" blocking {best[1] * 1e6:.1f} us per call)")  # fmt: skip
        if best[0] <= best[1]:
            return request
        request.Free()
        return None

    def free(self) -> None:
        """Release the persistent request (after its last ``wait()``)."""
        if self._running is not None:
            raise CollectiveError("persistent allreduce: free() before wait()")
        if self._request is not None and not self._freed:
            self._request.Free()
        self._freed = True

    def __enter__(self) -> PersistentAllreduce:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._running is not None:
            self.wait()
        self.free()


def allreduce_init(
    x: Any, op: Any = MPI.SUM, *, out: Any = None, comm: Any = None, algorithm: str = "auto"
) -> PersistentAllreduce:
    """A persistent allreduce of ``x`` into ``out``: the algorithm is chosen once (collective).

    For loops that reduce the same buffers again and again (an iterative solver's dot
    products): where ``auto`` picks the MPI library's call, each call is the library's
    persistent ``MPI_Allreduce_init`` request started and waited, or its blocking call,
    whichever measured faster here when the call was made (up to 1 MiB, so ``init`` runs
    the allreduce about 20 times: ``out`` is overwritten; in place, ``x`` is restored),
    with no per-call selection; any other algorithm runs as ``iallreduce`` of the bound
    buffers.
    """
    return PersistentAllreduce(x, op, out, comm, algorithm)


def iallreduce(
    x: Any,
    op: Any = MPI.SUM,
    *,
    out: Any = None,
    comm: Any = None,
    algorithm: str = "auto",
    reproducible: bool = False,
) -> CollectiveRequest:
    """Nonblocking ``allreduce``: returns a request; ``wait()`` returns the result.

    ``x`` is copied when the call starts, so it may change at once; ``out`` must not be
    touched until the request completes.
    """
    return _request(_prepare_allreduce, x, op, out, comm, algorithm, reproducible)


# ---- reduce ----------------------------------------------------------------------------


def _prepare_reduce(
    x: Any,
    root: int,
    op: Any,
    out: Any,
    comm: Any,
    algorithm: str,
    reproducible: bool,
    blocking: bool = True,
) -> _Pending:
    data = host_array(x)
    rop = resolve_op(op, data.dtype)
    state = state_for(comm)
    root = _root(root, state.size, "reduce")
    at_root = state.rank == root
    work, deliver = result_buffer(data, data.shape, data.dtype, out if at_root else None)
    collective = "allreduce" if reproducible else "reduce"
    chosen, call = _begin(
        collective,
        comm,
        algorithm,
        rop,
        work.nbytes,
        blocking,
        itemsize=data.itemsize,
        count=data.size,
        dtype=data.dtype.str,
        root=root,
        reproducible=bool(reproducible),
    )
    if reproducible:  # one definition of the reproducible sum: the allreduce's
        schedule = repro.allreduce(call, chosen, work, rop)
    else:
        schedule = chosen.run(call, work, rop, root)
    result = _on_device(x, out, deliver) if at_root else (lambda: None)
    return _Pending("ireduce", schedule, _finisher(call, result))


def reduce(
    x: Any,
    root: int = 0,
    op: Any = MPI.SUM,
    *,
    out: Any = None,
    comm: Any = None,
    algorithm: str = "auto",
    reproducible: bool = False,
) -> Any:
    """Reduce ``x`` over all ranks to ``root``.

    Returns:
        The result on ``root`` (``out`` when given), ``None`` on the other ranks. With
        ``reproducible=True`` it runs as a reproducible allreduce (same bits as there).
    """
    return _complete(_prepare_reduce, x, root, op, out, comm, algorithm, reproducible)


def ireduce(
    x: Any,
    root: int = 0,
    op: Any = MPI.SUM,
    *,
    out: Any = None,
    comm: Any = None,
    algorithm: str = "auto",
    reproducible: bool = False,
) -> CollectiveRequest:
    """Nonblocking ``reduce``."""
    return _request(_prepare_reduce, x, root, op, out, comm, algorithm, reproducible)


# ---- bcast -----------------------------------------------------------------------------


def _prepare_bcast(
    x: Any, root: int, out: Any, comm: Any, algorithm: str, blocking: bool = True
) -> _Pending:
    data = host_array(x)
    state = state_for(comm)
    root = _root(root, state.size, "bcast")
    at_root = state.rank == root
    target = out
    if target is None and isinstance(x, np.ndarray) and (not at_root or x.flags.writeable):
        # MPI semantics: x is the buffer, filled in place on the receiving ranks (some
        # algorithms also pass the root's own blocks back through it: same values).
        target = x
    if target is x and not at_root and not x.flags.writeable:
        raise CollectiveError("bcast: x is read-only on a receiving rank; pass out=")
    source = data if at_root else None
    work, deliver = result_buffer(source, data.shape, data.dtype, target)
    chosen, call = _begin(
        "bcast",
        comm,
        algorithm,
        None,
        work.nbytes,
        blocking,
        itemsize=data.itemsize,
        count=data.size,
        dtype=data.dtype.str,
        root=root,
    )
    result = _on_device(x, target, deliver)
    return _Pending("ibcast", chosen.run(call, work, root), _finisher(call, result))


def bcast(
    x: Any, root: int = 0, *, out: Any = None, comm: Any = None, algorithm: str = "auto"
) -> Any:
    """Broadcast the root's ``x`` to every rank.

    On the other ranks ``x`` is the receive buffer (same shape and dtype) and is filled
    in place, as in MPI, unless ``out`` is given. Returns the broadcast array.
    """
    return _complete(_prepare_bcast, x, root, out, comm, algorithm)


def ibcast(
    x: Any, root: int = 0, *, out: Any = None, comm: Any = None, algorithm: str = "auto"
) -> CollectiveRequest:
    """Nonblocking ``bcast``."""
    return _request(_prepare_bcast, x, root, out, comm, algorithm)


# ---- allgather -------------------------------------------------------------------------


def _counts(counts: Any, size: int, collective: str, total: int | None = None) -> list[int]:
    try:
        values = [int(c) for c in counts]
    except (TypeError, ValueError):
        raise CollectiveError(f"{collective}: counts must be a sequence of integers") from None
    if len(values) != size or any(c < 0 for c in values):
        raise CollectiveError(
            f"{collective}: counts must be {size} non-negative integers, not {list(counts)}"
        )
    if total is not None and sum(values) != total:
        raise CollectiveError(
            f"{collective}: counts add up to {sum(values)} but the buffer has {total} elements"
        )
    return values


def _prepare_allgather(
    x: Any, out: Any, counts: Any, comm: Any, algorithm: str, blocking: bool = True
) -> _Pending:
    data = host_array(x)
    state = state_for(comm)
    p, r = state.size, state.rank
    if counts is None:
        sizes, shape = [data.size] * p, (p, *data.shape)
    else:
        sizes = _counts(counts, p, "allgather")
        if sizes[r] != data.size:
            raise CollectiveError(
                f"allgather: counts[{r}] is {sizes[r]} but x has {data.size} elements"
            )
        shape = (sum(sizes),)
    work, deliver = result_buffer(None, shape, data.dtype, out)
    start = sum(sizes[:r])
    work[start : start + data.size] = data.reshape(-1)
    chosen, call = _begin(
        "allgather",
        comm,
        algorithm,
        None,
        sum(sizes) // p * data.itemsize,  # the same on every rank: auto must agree
        blocking,
        itemsize=data.itemsize,
        counts=sizes,
        dtype=data.dtype.str,
    )
    return _Pending(
        "iallgather", chosen.run(call, work, sizes), _finisher(call, _on_device(x, out, deliver))
    )


def allgather(
    x: Any, *, out: Any = None, counts: Any = None, comm: Any = None, algorithm: str = "auto"
) -> Any:
    """Gather every rank's ``x`` on every rank.

    Returns:
        Without ``counts``: an array of shape ``(size, *x.shape)`` (all ranks pass the
        same shape). With ``counts`` (elements per rank): the 1-D concatenation.
    """
    return _complete(_prepare_allgather, x, out, counts, comm, algorithm)


def iallgather(
    x: Any, *, out: Any = None, counts: Any = None, comm: Any = None, algorithm: str = "auto"
) -> CollectiveRequest:
    """Nonblocking ``allgather``."""
    return _request(_prepare_allgather, x, out, counts, comm, algorithm)


# ---- reduce_scatter --------------------------------------------------------------------


def _prepare_reduce_scatter(
    x: Any,
    op: Any,
    counts: Any,
    out: Any,
    comm: Any,
    algorithm: str,
    reproducible: bool,
    blocking: bool = True,
) -> _Pending:
    data = host_array(x)
    rop = resolve_op(op, data.dtype)
    state = state_for(comm)
    p, r = state.size, state.rank
    sizes = (
        even_counts(data.size, p)
        if counts is None
        else _counts(counts, p, "reduce_scatter", data.size)
    )
    if out is not None:
        check_out(out, (sizes[r],), data.dtype)
    work = np.array(data, order="C").reshape(-1)
    collective = "allreduce" if reproducible else "reduce_scatter"
    chosen, call = _begin(
        collective,
        comm,
        algorithm,
        rop,
        work.nbytes,
        blocking,
        itemsize=data.itemsize,
        counts=sizes,
        dtype=data.dtype.str,
        reproducible=bool(reproducible),
    )
    schedule = (
        repro.allreduce(call, chosen, work, rop)
        if reproducible
        else chosen.run(call, work, rop, sizes)
    )
    start = sum(sizes[:r])

    def deliver() -> Any:
        block = work[start : start + sizes[r]]
        if out is None:
            return to_device_like(x, block.copy())
        out[...] = to_device_like(out, block)
        return out

    return _Pending("ireduce_scatter", schedule, _finisher(call, deliver))


def reduce_scatter(
    x: Any,
    op: Any = MPI.SUM,
    *,
    counts: Any = None,
    out: Any = None,
    comm: Any = None,
    algorithm: str = "auto",
    reproducible: bool = False,
) -> Any:
    """Reduce ``x`` (flattened) over all ranks and give rank i block i.

    Args:
        x: This rank's full vector.
        op: The reduction, as for ``allreduce``.
        counts: Elements of each rank's block (default: an even split, the first
            ranks one more); must add up to ``x.size``.
        out: Where to put this rank's block (1-D, ``counts[rank]`` elements).
        comm: As for ``allreduce``.
        algorithm: ``"auto"`` or a name from ``algorithms_for("reduce_scatter")``.
        reproducible: Runs as a reproducible allreduce, then keeps the block.

    Returns:
        This rank's block of the reduced vector (1-D).
    """
    return _complete(_prepare_reduce_scatter, x, op, counts, out, comm, algorithm, reproducible)


def ireduce_scatter(
    x: Any,
    op: Any = MPI.SUM,
    *,
    counts: Any = None,
    out: Any = None,
    comm: Any = None,
    algorithm: str = "auto",
    reproducible: bool = False,
) -> CollectiveRequest:
    """Nonblocking ``reduce_scatter``."""
    return _request(_prepare_reduce_scatter, x, op, counts, out, comm, algorithm, reproducible)


# ---- alltoall(v) -----------------------------------------------------------------------


def _prepare_alltoall(
    x: Any, out: Any, comm: Any, algorithm: str, blocking: bool = True
) -> _Pending:
    data = host_array(x)
    state = state_for(comm)
    p = state.size
    if data.size % p:
        raise CollectiveError(
            f"alltoall: x has {data.size} elements, not a multiple of the {p} ranks"
        )
    block = data.size // p
    send = np.ascontiguousarray(data).reshape(-1)
    work, deliver = result_buffer(None, data.shape, data.dtype, out)
    chosen, call = _begin(
        "alltoall",
        comm,
        algorithm,
        None,
        data.nbytes,
        blocking,
        itemsize=data.itemsize,
        count=data.size,
        dtype=data.dtype.str,
    )
    return _Pending(
        "ialltoall",
        chosen.run(call, send, work, block),
        _finisher(call, _on_device(x, out, deliver)),
    )


def alltoall(x: Any, *, out: Any = None, comm: Any = None, algorithm: str = "auto") -> Any:
    """Block i of ``x`` (flattened, split into ``size`` equal blocks) goes to rank i.

    Returns:
        An array shaped like ``x`` whose block j came from rank j.
    """
    return _complete(_prepare_alltoall, x, out, comm, algorithm)


def ialltoall(
    x: Any, *, out: Any = None, comm: Any = None, algorithm: str = "auto"
) -> CollectiveRequest:
    """Nonblocking ``alltoall``."""
    return _request(_prepare_alltoall, x, out, comm, algorithm)


def _prepare_alltoallv(
    x: Any, counts: Any, comm: Any, algorithm: str, blocking: bool = True
) -> _Pending:
    data = host_array(x)
    state = state_for(comm)
    send_counts = _counts(counts, state.size, "alltoallv", data.size)
    send = np.ascontiguousarray(data).reshape(-1)
    chosen, call = _begin(
        "alltoallv",
        comm,
        algorithm,
        None,
        data.nbytes,
        blocking,
        itemsize=data.itemsize,
        dtype=data.dtype.str,
    )
    result: list[Any] = []

    def schedule() -> Schedule:
        # The receive counts come from the MPI library first (p integers per rank).
        theirs = np.empty(state.size, dtype=np.int64)
        yield [state.private.Ialltoall(np.array(send_counts, dtype=np.int64), theirs)]
        recv_counts = [int(c) for c in theirs]
        recv = np.empty(sum(recv_counts), dtype=data.dtype)
        yield from chosen.run(call, send, send_counts, recv, recv_counts)
        result.extend([recv, recv_counts])

    def deliver() -> Any:
        return to_device_like(x, result[0]), result[1]

    return _Pending("ialltoallv", schedule(), _finisher(call, deliver))


def alltoallv(
    x: Any, counts: Any, *, comm: Any = None, algorithm: str = "auto"
) -> tuple[Any, list[int]]:
    """Send ``counts[i]`` consecutive elements of ``x`` (flattened) to rank i.

    Returns:
        ``(received, received_counts)``: the blocks from ranks 0..size-1 back to back,
        and how many elements came from each.
    """
    return _complete(_prepare_alltoallv, x, counts, comm, algorithm)


def ialltoallv(
    x: Any, counts: Any, *, comm: Any = None, algorithm: str = "auto"
) -> CollectiveRequest:
    """Nonblocking ``alltoallv``; ``wait()`` returns ``(received, received_counts)``."""
    return _request(_prepare_alltoallv, x, counts, comm, algorithm)


# ---- barrier ---------------------------------------------------------------------------


def _prepare_barrier(comm: Any, algorithm: str, blocking: bool = True) -> _Pending:
    chosen, call = _begin("barrier", comm, algorithm, None, 0, blocking)
    return _Pending("ibarrier", chosen.run(call), _finisher(call, lambda: None))


def barrier(*, comm: Any = None, algorithm: str = "auto") -> None:
    """Wait until every rank has entered the barrier."""
    _complete(_prepare_barrier, comm, algorithm)


def ibarrier(*, comm: Any = None, algorithm: str = "auto") -> CollectiveRequest:
    """Nonblocking ``barrier``."""
    return _request(_prepare_barrier, comm, algorithm)
