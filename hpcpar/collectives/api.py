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

from ..runtime import flight
from ..runtime.orphans import ADOPTED, progress_adopted
from ..runtime.switches import HOT
from . import guard
from . import reproducible as repro
from .autotune import autotune_on as _autotune_on
from .autotune import tuned_algorithm
from .buffers import check_out, host_array, result_buffer, to_device_like
from .call import open_call
from .channel import even_counts, last_stats, remember_stats
from .check import check_same, checking
from .compressed import check_compressible, codec_for_call
from .errors import CollectiveError
from .fastpath import fast_allreduce
from .ops import ReduceOp, resolve_op
from .registry import LIBRARY
from .schedule import CollectiveRequest, Schedule, run
from .select import choose
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
    "ireduce",
    "ibcast",
    "iallgather",
    "ireduce_scatter",
    "ialltoall",
    "ialltoallv",
    "ibarrier",
    "last_stats",
]


@dataclass
class _Pending:
    name: str
    schedule: Schedule
    finish: Callable[[Any], Any]


def _complete(prepare: Callable[..., _Pending], *args: Any) -> Any:
    pending = prepare(*args, blocking=True)
    return pending.finish(run(pending.schedule, pending.name.removeprefix("i")))


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
    fixed: tuple[Any, str] | None = None,
    **check: Any,
) -> tuple[Any, Any]:
    """Choose the algorithm, check arguments across ranks (HPCPAR_CHECK), open the call.

    The check compares the algorithm that will run, not the one asked for: ``auto`` may
    resolve differently on ranks that see different ``HPCPAR_ALGORITHM_*``, profiles or
    rules, and a choice that failed on one rank is reported on every rank.
    """
    if ADOPTED:  # dropped nonblocking calls still in flight: give them a chance
        progress_adopted()
    state = state_for(comm)
    try:
        chosen, reason = fixed or choose(collective, algorithm, op, state, nbytes, itemsize)
        problem = ""
    except CollectiveError as exc:
        if not checking():
            raise
        chosen, reason, problem = None, "", str(exc)
    if checking():
        runs = chosen.name if chosen is not None else f"none ({problem})"
        check_same(state.private, collective, algorithm=runs, op=op.name if op else None, **check)
        if chosen is None:
            raise CollectiveError(problem)
    call = open_call(state, collective, chosen.name, nbytes, blocking)
    call.stats.steps.append(reason)
    # frames up to the public function: _begin, _prepare_*, _complete or _request, it
    call.flight = flight.enter(
        state.label,
        state._sequence - 1,
        collective if blocking else f"i{collective}",
        chosen.name,
        check.get("count", check.get("counts")),
        check.get("dtype"),
        op,
        check.get("root"),
        depth=4,
    )
    if HOT.guard:  # the always-on mismatch guard (guard.py)
        mark = guard.signature(collective, chosen.name, op.name if op else None, check)
        state.guard_sum = guard.fold(state.guard_sum, mark, state._sequence)
        call.guard = (mark, state._sequence)
        if state._sequence >= state.guard_next:
            guard.verify(state, collective)
    return chosen, call


def _finisher(call: Any, deliver: Callable[[], Any]) -> Callable[[Any], Any]:
    def finish(_value: Any) -> Any:
        remember_stats(call.stats)
        if call.flight is not None:
            call.flight[flight.END] = time.time()
        return deliver()

    if not call.blocking:  # what a rank waiting on the request is inside
        finish.flight = call.flight  # type: ignore[attr-defined]
    return finish


def _root(root: int, size: int, collective: str) -> int:
    if not isinstance(root, (int, np.integer)) or not 0 <= int(root) < size:
        raise CollectiveError(f"{collective}: root must be a rank in 0..{size - 1}, not {root!r}")
    return int(root)


# ---- allreduce -------------------------------------------------------------------------


def _prepare_allreduce(
    x: Any,
    op: Any,
    out: Any,
    comm: Any,
    algorithm: str,
    reproducible: bool,
    compression: Any = None,
    feedback: Any = None,
    blocking: bool = True,
) -> _Pending:
    data = host_array(x)
    rop = resolve_op(op, data.dtype)
    fixed = None
    codec = None
    check: dict[str, Any] = {}
    if compression is not None:
        codec, fixed = codec_for_call(data, rop, comm, algorithm, reproducible, compression)
        check["compression"] = codec.name if codec is not None else "none"
        if codec is not None:
            check["block"] = codec.block
    elif feedback is not None:
        raise CollectiveError("allreduce: feedback= applies to compressed calls: pass compression=")
    work, deliver = result_buffer(data, data.shape, data.dtype, out)
    chosen, call = _begin(
        "allreduce",
        comm,
        algorithm,
        rop,
        work.nbytes,
        blocking,
        itemsize=data.itemsize,
        fixed=fixed,
        count=data.size,
        dtype=data.dtype.str,
        reproducible=bool(reproducible),
        **check,
    )
    if codec is not None:
        from .compression.allreduce import allreduce as compressed

        schedule = compressed(call, work, rop, codec, feedback, compression.seed)
    elif reproducible:
        schedule = repro.allreduce(call, chosen, work, rop)
    else:
        if feedback is not None:  # exact this time: a residual restored for it joins the sum
            feedback.settle(work)
        schedule = chosen.run(call, work, rop)
    return _Pending("iallreduce", schedule, _finisher(call, _on_device(x, out, deliver)))


def _on_device(x: Any, out: Any, deliver: Callable[[], Any]) -> Callable[[], Any]:
    if out is not None:
        return deliver
    return lambda: to_device_like(x, deliver())


def allreduce(
    x: Any,
    op: Any = MPI.SUM,
    *,
    out: Any = None,
    comm: Any = None,
    algorithm: str = "auto",
    reproducible: bool = False,
    autotune: bool | None = None,
    compression: Any = None,
    tolerance: float | None = None,
    feedback: Any = None,
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
        compression: ``None`` (exact, the default), ``"fp16"``, ``"bf16"``, ``"int8"``,
            ``"1bit"``, ``"auto"`` or a ``hpcpar.Compression``: a lossy SUM of float32 or
            float64 data, exact inside each node and coded only across nodes
            (``hpcpar.collectives.compression``; on one node nothing is coded).
        tolerance: The largest error bound accepted (``auto`` picks the fastest predicted
            scheme within it, or exact; ``hpcpar.explain(..., compression="auto")``
            shows the bounds).
        feedback: An ``hpcpar.ErrorFeedback`` for this vector: what coding loses is
            added to the next call's contribution.

    Returns:
        The reduced array (``out`` when given).
    """
    if compression is not None or tolerance is not None or feedback is not None:
        from .compression import as_compression

        spec = as_compression(compression, tolerance)
        if spec is not None:
            data = host_array(x)
            check_compressible(data, resolve_op(op, data.dtype), algorithm, reproducible)
        # _prepare_allreduce refuses feedback= without compression=
        if feedback is not None or (spec is not None and len(state_for(comm).node_ranks) > 1):
            return _complete(
                _prepare_allreduce, x, op, out, comm, algorithm, reproducible, spec, feedback
            )
        # one node: nothing to code, so the exact call as it would run without compression=
    if not reproducible and not (autotune and algorithm == "auto"):
        result = fast_allreduce(x, op, out, comm, algorithm, autotune is None)
        if result is not None:
            return result
    if (
        algorithm == "auto"
        and not reproducible
        and (autotune or (autotune is None and _autotune_on()))
    ):

        def timed(name: str, scratch: np.ndarray) -> Any:
            return allreduce(x, op, out=scratch, comm=comm, algorithm=name, autotune=False)

        algorithm = tuned_algorithm(x, op, comm, timed)[0]
        result = fast_allreduce(x, op, out, comm, algorithm, False)
        if result is not None:
            return result
    return _complete(_prepare_allreduce, x, op, out, comm, algorithm, reproducible)


def iallreduce(
    x: Any,
    op: Any = MPI.SUM,
    *,
    out: Any = None,
    comm: Any = None,
    algorithm: str = "auto",
    reproducible: bool = False,
    compression: Any = None,
    tolerance: float | None = None,
    feedback: Any = None,
) -> CollectiveRequest:
    """Nonblocking ``allreduce``: returns a request; ``wait()`` returns the result.

    ``x`` is copied when the call starts, so it may change at once; ``out`` must not be
    touched until the request completes (nor ``feedback`` used by another call).
    """
    spec = None
    if compression is not None or tolerance is not None or feedback is not None:
        from .compression import as_compression

        spec = as_compression(compression, tolerance)
    return _request(_prepare_allreduce, x, op, out, comm, algorithm, reproducible, spec, feedback)


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
    collective = "allreduce" if reproducible else "reduce_scatter"
    chosen, call = _begin(
        collective,
        comm,
        algorithm,
        rop,
        data.nbytes,
        blocking,
        itemsize=data.itemsize,
        counts=sizes,
        dtype=data.dtype.str,
        reproducible=bool(reproducible),
    )
    if blocking and not reproducible and chosen.name == LIBRARY:
        # the library's call reads x and writes this rank's block: no copy of x
        from .algorithms.mpi import reduce_scatter_into

        block = np.empty(sizes[r], dtype=data.dtype)
        send = np.ascontiguousarray(data).reshape(-1)
        schedule = reduce_scatter_into(call, send, rop, sizes, block)

        def handed() -> Any:
            if out is None:
                return to_device_like(x, block)
            out[...] = to_device_like(out, block)
            return out

        return _Pending("ireduce_scatter", schedule, _finisher(call, handed))
    work = np.array(data, order="C").reshape(-1)
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
