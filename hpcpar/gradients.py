"""Gradient buckets: filled as autograd produces gradients, reduced in a fixed order.

The machinery that data-parallel front ends share (the SGD app's ``DataParallel`` and
``hpcpar.horovod.torch.DistributedOptimizer``): ``GradientSync`` holds a model's
gradient buckets, takes each gradient as autograd produces it, hands every full bucket
to a communication thread (``Reducer``) or reduces them all at the end, always in
bucket order so that every rank makes the same calls; ``plan_buckets`` replays a
recorded backward pass through the cost model to choose the bucket size;
``reduce_bucket`` reduces one bucket over the ranks.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import numpy as np
import torch

from hpcpar.checkpoint import Sharded

from .collectives.errors import CollectiveError
from .feedback import ErrorFeedback

__all__ = [
    "MIB",
    "CANDIDATES",
    "Bucket",
    "GradientSync",
    "Reducer",
    "as_array",
    "reduce_bucket",
    "group_indices",
    "make_buckets",
    "plan_buckets",
    "spare_core",
    "describe_param",
]

MIB = 1 << 20


class Bucket:
    """Some parameters' gradients in one flat tensor, and which of them are in.

    ``dtype``: the bucket's type (the parameters' by default; a compressed one casts on
    the way in and out). ``counts``: one "used on this rank" count per parameter after
    the gradients (after a sum, zero means no rank used that parameter).
    """

    def __init__(self, params: list[Any], dtype: Any = None, *, counts: bool = True) -> None:
        self.params = params
        sizes = [p.numel() for p in params]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64).tolist()
        total = self.offsets[-1]
        self.counts = counts
        self.flat = torch.zeros(
            total + (len(params) if counts else 0),
            dtype=dtype or params[0].dtype,
            device=params[0].device,
        )
        self.array = as_array(self.flat)
        self.filled = [False] * len(params)
        self.missing = len(params)
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.seconds = 0.0  # the last reduction's time, from its start to its end
        self.compression: Any = None  # a Compression: the gradients are coded across nodes
        self.feedback: Any = None  # their ErrorFeedback
        self.powersgd: Any = None  # or their low-rank state (hpcpar.PowerSGD)

    def reset(self) -> None:
        """Empty the bucket for the next pass."""
        self.filled = [False] * len(self.params)
        self.missing = len(self.params)
        self.done.clear()
        self.error = None

    def put(self, slot: int, grad: Any) -> None:
        """Copy parameter ``slot``'s gradient in and count it as used on this rank."""
        a, b = self.offsets[slot], self.offsets[slot + 1]
        self.flat[a:b].copy_(grad.reshape(-1))
        if self.counts:
            self.flat[self.offsets[-1] + slot] = 1.0
        self.filled[slot] = True
        self.missing -= 1

    def zero_missing(self) -> None:
        """Zeros for the parameters this rank did not use in this pass."""
        for slot, filled in enumerate(self.filled):
            if not filled:
                a, b = self.offsets[slot], self.offsets[slot + 1]
                self.flat[a:b].zero_()
                if self.counts:
                    self.flat[self.offsets[-1] + slot] = 0.0
                self.filled[slot] = True
        self.missing = 0


def as_array(tensor: Any) -> Any:
    """The numpy (CPU) or cupy (CUDA) array sharing ``tensor``'s memory."""
    if tensor.is_cuda:
        import cupy

        return cupy.from_dlpack(tensor)
    return tensor.numpy()


class Reducer(threading.Thread):
    """Reduces the buckets handed to it, in the order handed, on its own communicator."""

    def __init__(self, comm: Any, algorithm: str, op: Any = None) -> None:
        super().__init__(name="hpcpar-gradients", daemon=True)
        self.comm, self.algorithm, self.op = comm, algorithm, op
        self.work: queue.SimpleQueue[Bucket | None] = queue.SimpleQueue()

    def run(self) -> None:
        """Reduce the buckets handed over until handed None."""
        while (bucket := self.work.get()) is not None:
            reduce_bucket(bucket, self.comm, self.algorithm, sleep=True, op=self.op)


# the communication thread spins on progress calls for _SPIN_S (a small bucket is done by
# then), then sleeps between them, from _FIRST_PAUSE_S doubling up to _LONGEST_PAUSE_S
# (where a 10 Gbit/s link moves about 60 KiB, less than a socket buffer)
_SPIN_S, _FIRST_PAUSE_S, _LONGEST_PAUSE_S = 1e-4, 1e-5, 5e-5


def reduce_bucket(
    bucket: Bucket, comm: Any, algorithm: str, *, sleep: bool = False, op: Any = None
) -> None:
    """Reduce ``bucket`` over the ranks in place (``op``: a sum by default).

    An error is kept in the bucket for the rank that waits for it.

    ``sleep``: start the reduction nonblocking and drive it with progress calls, after
    the first 100 us with short sleeps between them, so that the thread leaves the core
    to the backward pass while the data is on the wire (a blocking call would spin in
    the library's progress loop).
    """
    from mpi4py import MPI

    import hpcpar

    op = MPI.SUM if op is None else op
    began = time.perf_counter()
    try:
        if bucket.flat.is_cuda:  # the copies into the bucket ran on the current stream
            torch.cuda.current_stream(bucket.flat.device).synchronize()
        parts = [(bucket.array, {"algorithm": algorithm})]
        if bucket.powersgd is not None:  # the gradients low-rank, the counts exact
            views = [
                bucket.array[bucket.offsets[i] : bucket.offsets[i + 1]].reshape(p.shape)
                for i, p in enumerate(bucket.params)
            ]
            for view, total in zip(views, bucket.powersgd.allreduce(views), strict=True):
                view[...] = total
            parts = [(bucket.array[bucket.offsets[-1] :], {})] if bucket.counts else []
        elif bucket.compression is not None:  # the gradients coded, the counts exact
            grads, counts = bucket.array[: bucket.offsets[-1]], bucket.array[bucket.offsets[-1] :]
            coded = {"compression": bucket.compression, "feedback": bucket.feedback}
            parts = [(grads, coded)] + ([(counts, {})] if counts.size else [])
        for array, how in parts:
            if sleep:
                request = hpcpar.iallreduce(array, op, out=array, comm=comm, **how)
                pause, spin = _FIRST_PAUSE_S, time.perf_counter() + _SPIN_S
                while not request.test():
                    if time.perf_counter() > spin:
                        time.sleep(pause)
                        pause = min(2 * pause, _LONGEST_PAUSE_S)
            else:
                hpcpar.allreduce(array, op, out=array, comm=comm, **how)
    except BaseException as exc:  # handed to the thread that waits
        bucket.error = exc
    finally:
        bucket.seconds = time.perf_counter() - began
        bucket.done.set()


def group_indices(kinds: list[Any], nbytes: list[int], limit: int) -> list[list[int]]:
    """Indices (in the order given) cut into buckets: one kind each, about ``limit`` bytes."""
    groups: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, (kind, n) in enumerate(zip(kinds, nbytes, strict=True)):
        if current and (kind != kinds[current[0]] or size >= limit):
            groups.append(current)
            current, size = [], 0
        current.append(i)
        size += n
    if current:
        groups.append(current)
    return groups


def _itemsize(dtype: Any) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def make_buckets(
    params: list[Any],
    limit: int,
    *,
    dtype_of: Any = None,
    counts: bool = True,
    groups: list[list[int]] | None = None,
) -> list[Bucket]:
    """Buckets of ``params`` in reverse order, one dtype and device each, about ``limit`` bytes.

    ``dtype_of(param)``: each bucket's type (the parameter's by default). ``groups``:
    indices into ``params`` that form the buckets instead (each split by type).
    """
    dtype_of = dtype_of or (lambda p: p.dtype)
    if groups is None:
        order = list(reversed(params))
        kinds = [(dtype_of(p), p.device) for p in order]
        nbytes = [p.numel() * _itemsize(k[0]) for p, k in zip(order, kinds, strict=True)]
        cut = [[order[i] for i in g] for g in group_indices(kinds, nbytes, limit)]
    else:
        cut = []
        for group in groups:
            members = [params[i] for i in group]
            kinds = [(dtype_of(p), p.device) for p in members]
            cut += [
                [members[i] for i in g] for g in group_indices(kinds, [0] * len(kinds), 1 << 62)
            ]
    return [Bucket(g, dtype_of(g[0]), counts=counts) for g in cut]


# bucket limits ``bucket_mib="auto"`` considers: 64 KiB to 256 MiB
CANDIDATES = tuple(1 << k for k in range(16, 29))


def plan_buckets(
    nbytes: list[int],
    ready: list[float],
    end: float,
    cost: Any,
    *,
    overlap: bool,
    kinds: list[Any] | None = None,
) -> tuple[int, float, dict[int, float]]:
    """The bucket limit that ends the backward pass's communication soonest.

    A replay of one backward pass: parameter ``i`` (in the order the pass produces them,
    ``nbytes[i]`` bytes of gradient) is ready ``ready[i]`` seconds into the pass, which
    ends at ``end``; a bucket goes out when its last gradient is ready (at ``end``
    without ``overlap``) and the buckets are reduced one after another, each taking
    ``cost(bytes)`` seconds. Small buckets start early but each pays a call's latency;
    large ones pay it once but start late.

    Returns:
        The limit in bytes, its communication time exposed after the pass, and the
        exposed time of every candidate limit (ties go to the larger bucket).
    """
    kinds = kinds or [0] * len(nbytes)
    exposed: dict[int, float] = {}
    for limit in CANDIDATES:
        clock = 0.0
        for group in group_indices(kinds, nbytes, limit):
            start = max(ready[i] for i in group) if overlap else end
            clock = max(clock, start) + cost(sum(nbytes[i] for i in group))
        exposed[limit] = max(0.0, clock - end)
    best = min(exposed.values())
    chosen = max(limit for limit, t in exposed.items() if t <= best * 1.01 + 1e-9)
    return chosen, exposed[chosen], exposed


def spare_core(comm: Any) -> bool:
    """Whether this host has more usable cores than ranks of ``comm`` (collective)."""
    from mpi4py import MPI

    from .runtime.env import usable_cores

    host = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        ranks = host.Get_size()
    finally:
        host.Free()
    return bool(comm.allreduce(int(usable_cores() > ranks), op=MPI.MIN))


class GradientSync:
    """The gradients of ``params`` reduced over ``hierarchy``, bucket by bucket.

    ``put`` takes a parameter's gradient as autograd produces it and hands every full
    bucket, in bucket order, to the communication thread (``overlap``); ``complete``
    fills what this rank did not produce with zeros, reduces the rest, waits, and
    raises the first error; the caller then reads the reduced buckets and calls
    ``reset``. Every rank reduces the buckets in the same order, so ranks whose
    backward passes produce gradients in different orders still make the same calls.

    Args:
        params: The parameters, in registration order (the same on every rank).
        hierarchy: A ``Hierarchy`` of the gradients' own (the thread uses it).
        limit: Bucket size in bytes, or ``None``: 25 MiB for the first pass, which
            records when each gradient was ready, then the size ``plan_buckets``
            predicts ends the pass's communication soonest (``plan`` says which).
        algorithm: The allreduce algorithm (``auto``: the cost model's).
        overlap: Reduce full buckets on a thread while the pass goes on.
        op: The reduction (an MPI op; a sum by default).
        dtype_of: Each parameter's bucket type (its own by default).
        counts: Count which ranks used each parameter (``Bucket``).
        groups: Indices into ``params`` that form the buckets instead of a size.
        compression: A ``hpcpar.Compression`` (or scheme name) for the gradients'
            allreduces (the counts stay exact), or a ``hpcpar.PowerSGD`` whose settings
            each bucket's own low-rank state copies; None: exact.
        error_feedback: Keep each bucket's coding residual (``hpcpar.ErrorFeedback``)
            and add it to the next pass's gradients.
    """

    def __init__(
        self,
        params: list[Any],
        hierarchy: Any,
        *,
        limit: int | None = None,
        algorithm: str = "auto",
        overlap: bool = False,
        op: Any = None,
        dtype_of: Any = None,
        counts: bool = True,
        groups: list[list[int]] | None = None,
        compression: Any = None,
        error_feedback: bool = False,
    ) -> None:
        from .collectives.compression import as_compression
        from .powersgd import PowerSGD

        self.powersgd = compression if isinstance(compression, PowerSGD) else None
        self.compression = None if self.powersgd else as_compression(compression)
        if error_feedback and self.compression is None:
            raise CollectiveError("error_feedback=True needs a compression")
        self.error_feedback = bool(error_feedback)
        self.buckets: list[Bucket] = []
        self.params, self.hierarchy, self.algorithm = params, hierarchy, algorithm
        self.op, self.dtype_of, self.counts, self.groups = op, dtype_of, counts, groups
        auto = limit is None and groups is None
        self.bucket_bytes = 25 * MIB if limit is None else int(limit)
        self._set_buckets(self.bucket_bytes)
        self.plan = "auto: chosen after the first backward pass" if auto else ""
        self._timeline: list[float] | None = [0.0] * len(params) if auto else None
        self._produced = {id(p): i for i, p in enumerate(reversed(params))}
        self.comm_seconds = 0.0  # waited for the communication after the passes
        self.reduce_seconds = 0.0  # the buckets' reductions, start to end, summed
        self.passes = 0
        self.began: float | None = None
        self._next = 0
        self._reducer: Reducer | None = None
        if overlap:
            self._reducer = Reducer(hierarchy, algorithm, op)
            self._reducer.start()

    @property
    def overlap(self) -> bool:
        """Whether full buckets are reduced on the communication thread."""
        return self._reducer is not None

    def _set_buckets(self, limit: int) -> None:
        owed = self._owed_by_param() if self.buckets else {}
        self.buckets = make_buckets(
            self.params, limit, dtype_of=self.dtype_of, counts=self.counts, groups=self.groups
        )
        self._where = {id(p): (b, slot) for b in self.buckets for slot, p in enumerate(b.params)}
        for bucket in self.buckets:
            bucket.compression = self.compression
            if self.powersgd is not None:
                bucket.powersgd = self.powersgd.like()
            if self.error_feedback:
                bucket.feedback = ErrorFeedback(self.hierarchy)
        self._carry(owed)

    def _owed_by_param(self) -> dict[int, np.ndarray]:
        """What the buckets' error feedback holds, parameter by parameter."""
        out: dict[int, np.ndarray] = {}
        for bucket in self.buckets:
            if bucket.feedback is None or bucket.feedback.n is None:
                continue
            held = bucket.feedback.owed()
            for slot, p in enumerate(bucket.params):
                out[id(p)] = held[bucket.offsets[slot] : bucket.offsets[slot + 1]]
        return out

    def _carry(self, owed: dict[int, np.ndarray]) -> None:
        """Hand what is owed per parameter to the buckets that hold them now."""
        if not owed:
            return
        for bucket in self.buckets:
            if bucket.feedback is None:
                continue
            vector = np.zeros(bucket.offsets[-1], np.float32)
            for slot, p in enumerate(bucket.params):
                if id(p) in owed:
                    vector[bucket.offsets[slot] : bucket.offsets[slot + 1]] = owed[id(p)]
            bucket.feedback.carry(vector)

    def feedback_state(self) -> dict[str, Any]:
        """The error feedback's residuals for a checkpoint: a ``Sharded`` row per rank.

        Held per parameter (in ``params`` order), so a restore with other buckets, or on
        another rank count (the rows each rank receives are summed), keeps what is owed.
        """
        owed = self._owed_by_param()
        row = np.concatenate(
            [owed.get(id(p), np.zeros(p.numel(), np.float32)).reshape(-1) for p in self.params]
        ).astype(np.float32)
        state = self.hierarchy
        rank, size = state.comm.Get_rank(), state.comm.Get_size()
        return {"owed": Sharded(row[None], (size, row.size), (rank, 0))}

    def load_feedback_state(self, saved: dict[str, Any]) -> None:
        """Take back what ``feedback_state`` saved (any rank count)."""
        leaf = saved.get("owed") if isinstance(saved, dict) else None
        block = np.asarray(leaf.block if isinstance(leaf, Sharded) else leaf, np.float32)
        total = sum(p.numel() for p in self.params)
        if block.ndim != 2 or block.shape[1] != total:
            raise CollectiveError(
                f"feedback state has shape {block.shape}, not (rows, {total}) for these parameters"
            )
        if not self.error_feedback:
            return
        held = block.sum(axis=0)
        starts = np.cumsum([0] + [p.numel() for p in self.params])
        self._carry({id(p): held[starts[i] : starts[i + 1]] for i, p in enumerate(self.params)})

    def filled(self, param: Any) -> bool:
        """Whether ``param``'s gradient is in its bucket for this pass."""
        bucket, slot = self._where[id(param)]
        return bucket.filled[slot]

    def put(self, param: Any, grad: Any) -> None:
        """Copy ``param``'s gradient into its bucket; send the buckets that are full."""
        if self.began is None:
            self.began = time.perf_counter()
        bucket, slot = self._where[id(param)]
        if self._timeline is not None:
            self._timeline[self._produced[id(param)]] = time.perf_counter() - self.began
        bucket.put(slot, grad)
        self._send_ready()

    def _send_ready(self) -> None:
        while self._next < len(self.buckets) and self.buckets[self._next].missing == 0:
            if self._reducer is not None:
                self._reducer.work.put(self.buckets[self._next])
            self._next += 1

    def complete(self) -> None:
        """Zeros for what this rank did not produce; reduce the rest; wait (collective)."""
        ended = time.perf_counter()
        for bucket in self.buckets:
            if bucket.missing:
                bucket.zero_missing()
        self._send_ready()
        for bucket in self.buckets:
            if self._reducer is None:
                reduce_bucket(bucket, self.hierarchy, self.algorithm, op=self.op)
            bucket.done.wait()
        self.comm_seconds += time.perf_counter() - ended
        self.reduce_seconds += sum(b.seconds for b in self.buckets)
        self.passes += 1
        errors = [b.error for b in self.buckets if b.error is not None]
        if errors:
            raise errors[0]
        self._pass_seconds = ended - (self.began or ended)

    def reset(self) -> None:
        """Empty the buckets for the next pass (after the first, choose their size if auto)."""
        if self._timeline is not None and getattr(self, "_pass_seconds", None) is not None:
            self._choose_buckets(self._pass_seconds)
        self._pass_seconds = None
        self.began = None
        self._next = 0
        for bucket in self.buckets:
            bucket.reset()

    def close(self) -> None:
        """Stop the communication thread."""
        if self._reducer is not None:
            self._reducer.work.put(None)
            self._reducer.join()
            self._reducer = None

    def _choose_buckets(self, end: float) -> None:
        """Replay the recorded pass through the cost model; use the best bucket size."""
        from mpi4py import MPI

        from .collectives.cost.explain import plan_for
        from .collectives.tally import Layout

        assert self._timeline is not None
        # each gradient at the latest share of the pass at which a rank had it, times
        # the slowest rank's pass (identical on every rank, so is the choice); a
        # parameter this pass did not use counts as ready at the end
        end = max(end, 1e-9)
        when = np.array([min(t, end) / end if t > 0 else 1.0 for t in self._timeline] + [end])
        self.hierarchy.comm.Allreduce(MPI.IN_PLACE, when, op=MPI.MAX)
        when[:-1] *= when[-1]
        self._timeline = None
        order = list(reversed(self.params))
        dtype_of = self.dtype_of or (lambda p: p.dtype)
        itemsizes = [_itemsize(dtype_of(p)) for p in order]
        nbytes = [p.numel() * k for p, k in zip(order, itemsizes, strict=True)]
        layout = Layout(tuple(self.hierarchy.node_of))
        cached: dict[int, float] = {}

        def cost(n: int) -> float:
            if n not in cached:
                plan = plan_for("allreduce", n, layout, itemsize=itemsizes[0])
                name = plan.algorithm if self.algorithm == "auto" else self.algorithm
                cached[n] = next(
                    (q.seconds for q in plan.ranking if q.algorithm == name), plan.predicted_s
                )
            return cached[n]

        kinds = [(dtype_of(p), p.device) for p in order]
        limit, exposed, every = plan_buckets(
            nbytes,
            when[:-1].tolist(),
            float(when[-1]),
            cost,
            overlap=self._reducer is not None,
            kinds=kinds,
        )
        self.bucket_bytes = limit
        self._set_buckets(limit)
        one = every[CANDIDATES[-1]]
        shape = (
            f"{len(self.buckets)} buckets of about {limit / MIB:g} MiB"
            if len(self.buckets) > 1
            else "one bucket"
        )
        where = "buckets reduced during the pass" if self._reducer else "all after the pass"
        self.plan = (
            f"auto: {shape}; predicted communication after a {1e3 * float(when[-1]):.1f} ms "
            f"backward pass {1e3 * exposed:.2f} ms (one bucket: {1e3 * one:.2f} ms; {where})"
        )


def describe_param(entry: tuple[str, tuple[int, ...], str] | None) -> str:
    """``(name, shape, dtype)`` of a parameter in words, for the ranks-differ errors."""
    if entry is None:
        return "no parameter"
    name, shape, dtype = entry
    return f"{name} of shape {list(shape)} ({dtype.removeprefix('torch.')})"
