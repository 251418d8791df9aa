"""Data-parallel training of PyTorch models over hpcpar's collectives.

An ordinary training loop becomes data-parallel by wrapping the model; each rank feeds
its own part of every global batch::

    from hpcpar.apps.sgd.torch import DataParallel

    model = DataParallel(net)                        # parameters from rank 0
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in my_batches:                          # this rank's rows
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()                              # gradients averaged over ranks
        opt.step()

Gradients are grouped into buckets of about ``bucket_mib`` MiB (or a size chosen from the
cost model and the first backward pass: see ``plan_buckets``), in the reverse order of
the parameters' registration (the order in which the backward pass produces them). A
parameter's gradient is copied into its bucket as soon as autograd has accumulated it;
a full bucket is handed to a communication thread that reduces it with
``hpcpar.iallreduce`` (any algorithm, ``auto`` by default, over real or virtual nodes)
while the backward pass goes on computing the next ones (where the host has a core to
spare for the thread: see ``overlap``). Buckets are reduced in the same order on every
rank; at the end of the backward pass the rest are sent, and the averaged gradients are
written back before ``backward()`` returns.

Why a thread: an MPI library progresses a nonblocking collective only inside MPI calls,
and the backward pass makes none, so ``iallreduce`` started from a hook would mostly
run when the pass ends. The thread makes those calls while autograd computes, sleeping
a few microseconds between them (mpi4py and ``time.sleep`` release the GIL), so the
data moves while the core stays with the backward pass. The thread uses its own
duplicate of the communicator, so the program's own collectives on ``comm`` never
interleave with it. ``overlap=False`` reduces every bucket after the backward pass
instead; ``hpcpar bench sgd`` measures both against PyTorch's
``DistributedDataParallel``.

CPU tensors reach hpcpar without copies (their numpy views); CUDA tensors go the same
way as cupy arrays (DLPack). Parameters that a rank did not use in a backward pass
contribute zeros; a parameter that no rank used keeps its gradient as it was.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from .models import SgdError

__all__ = ["DataParallel", "LocalSGD", "ZeroOptimizer", "plan_buckets"]

_MIB = 1 << 20


class _Bucket:
    """Some parameters' gradients in one flat tensor, and which of them are in."""

    def __init__(self, torch: Any, params: list[Any]) -> None:
        self.params = params
        sizes = [p.numel() for p in params]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64).tolist()
        total = self.offsets[-1]
        # the gradients, then one "used on this rank" count per parameter: after the sum
        # a zero count means no rank used that parameter
        self.flat = torch.zeros(total + len(params), dtype=params[0].dtype, device=params[0].device)
        self.array = _as_array(self.flat)
        self.filled = [False] * len(params)
        self.missing = len(params)
        self.done = threading.Event()
        self.error: BaseException | None = None

    def reset(self) -> None:
        self.filled = [False] * len(self.params)
        self.missing = len(self.params)
        self.done.clear()
        self.error = None

    def put(self, slot: int, grad: Any) -> None:
        a, b = self.offsets[slot], self.offsets[slot + 1]
        self.flat[a:b].copy_(grad.reshape(-1))
        self.flat[self.offsets[-1] + slot] = 1.0
        self.filled[slot] = True
        self.missing -= 1

    def zero_missing(self) -> None:
        """Zeros for the parameters this rank did not use in this pass."""
        for slot, filled in enumerate(self.filled):
            if not filled:
                a, b = self.offsets[slot], self.offsets[slot + 1]
                self.flat[a:b].zero_()
                self.flat[self.offsets[-1] + slot] = 0.0
                self.filled[slot] = True
        self.missing = 0


def _as_array(tensor: Any) -> Any:
    """The numpy (CPU) or cupy (CUDA) array sharing ``tensor``'s memory."""
    if tensor.is_cuda:
        import cupy

        return cupy.from_dlpack(tensor)
    return tensor.numpy()


class _Reducer(threading.Thread):
    """Reduces the buckets handed to it, in the order handed, on its own communicator."""

    def __init__(self, comm: Any, algorithm: str) -> None:
        super().__init__(name="hpcpar-gradients", daemon=True)
        self.comm, self.algorithm = comm, algorithm
        self.work: queue.SimpleQueue[_Bucket | None] = queue.SimpleQueue()

    def run(self) -> None:
        while (bucket := self.work.get()) is not None:
            reduce_bucket(bucket, self.comm, self.algorithm, sleep=True)


# the communication thread spins on progress calls for _SPIN_S (a small bucket is done by
# then), then sleeps between them, from _FIRST_PAUSE_S doubling up to _LONGEST_PAUSE_S
# (where a 10 Gbit/s link moves about 60 KiB, less than a socket buffer)
_SPIN_S, _FIRST_PAUSE_S, _LONGEST_PAUSE_S = 1e-4, 1e-5, 5e-5


def reduce_bucket(bucket: _Bucket, comm: Any, algorithm: str, *, sleep: bool = False) -> None:
    """Sum ``bucket`` over the ranks in place; an error is kept for the waiting rank.

    ``sleep``: start the reduction nonblocking and drive it with progress calls, after
    the first 100 us with short sleeps between them, so that the thread leaves the core
    to the backward pass while the data is on the wire (a blocking call would spin in
    the library's progress loop).
    """
    import hpcpar

    try:
        if bucket.flat.is_cuda:  # the copies into the bucket ran on the current stream
            import torch

            torch.cuda.current_stream(bucket.flat.device).synchronize()
        if sleep:
            request = hpcpar.iallreduce(
                bucket.array, out=bucket.array, comm=comm, algorithm=algorithm
            )
            pause, spin = _FIRST_PAUSE_S, time.perf_counter() + _SPIN_S
            while not request.test():
                if time.perf_counter() > spin:
                    time.sleep(pause)
                    pause = min(2 * pause, _LONGEST_PAUSE_S)
        else:
            hpcpar.allreduce(bucket.array, out=bucket.array, comm=comm, algorithm=algorithm)
    except BaseException as exc:  # handed to the thread that waits
        bucket.error = exc
    finally:
        bucket.done.set()


class DataParallel:
    """A ``torch.nn.Module`` trained data-parallel over hpcpar.

    Gradients are averaged over the ranks in ``backward()``, reduced bucket by bucket
    while the backward pass runs.

    Args:
        module: The model (the same architecture on every rank). Its parameters and
            buffers are broadcast from rank 0, so every rank starts from rank 0's.
        comm: ``None`` (hpcpar's communicator), a communicator, or a ``Hierarchy``
            (virtual nodes for the hierarchical algorithms).
        bucket_mib: Bucket size in MiB (gradients of one dtype and device per bucket),
            or ``"auto"`` (default): the first backward pass runs with 25 MiB buckets
            and records when each gradient is ready; the size that the cost model
            predicts ends the pass's communication soonest is used from then on
            (``bucket_plan`` says which and why; see ``plan_buckets``).
        algorithm: The allreduce algorithm (``auto``: the cost model's choice).
        overlap: ``True``: reduce buckets on a communication thread while the backward
            pass runs; ``False``: reduce them all after it, on the calling thread;
            ``None`` (default): the thread where this host has a core for it (more
            usable cores than ranks on the host), since a thread that must share its
            rank's core with the backward pass slows both.

    Raises:
        SgdError: the ranks' models differ (the first differing parameter is named, on
            every rank), a parameter or buffer of a dtype numpy has not (bfloat16, the
            float8 types), a bad bucket size, or no parameter to train.
    """

    def __init__(
        self,
        module: Any,
        *,
        comm: Any = None,
        bucket_mib: float | str = "auto",
        algorithm: str = "auto",
        overlap: bool | None = None,
    ) -> None:
        import torch
        from mpi4py import MPI

        from hpcpar.runtime.comm import resolve_comm
        from hpcpar.topology import Hierarchy

        auto = bucket_mib == "auto"
        if not auto and not (
            isinstance(bucket_mib, (int, float))
            and not isinstance(bucket_mib, bool)
            and 0 < bucket_mib < 1 << 20
        ):
            raise SgdError(
                f"bucket_mib must be a positive number of MiB or 'auto', not {bucket_mib!r}"
            )
        self.module, self.algorithm = module, algorithm
        self._torch = torch
        base = resolve_comm(comm)
        self.rank, self.size = base.Get_rank(), base.Get_size()
        self._check_same_model(base)
        _check_dtypes(torch, module)
        # the gradients' own communicator: the program's collectives on comm never
        # interleave with the communication thread's
        self._own = base.Dup()
        layout = comm.layout if isinstance(comm, Hierarchy) else None
        self._hierarchy = Hierarchy(self._own, layout=layout)
        self._broadcast()
        trained = [p for p in module.parameters() if p.requires_grad]
        if not trained:
            self.free()
            raise SgdError("DataParallel: the module has no parameter that requires grad")
        self._trained = trained
        self.bucket_bytes = int((25.0 if auto else bucket_mib) * _MIB)
        self._set_buckets(self.bucket_bytes)
        self.bucket_plan = (
            "auto: chosen after the first backward pass"
            if auto
            else (
                f"{len(self.buckets)} bucket(s) of at most about {bucket_mib:g} MiB, as requested"
            )
        )
        # the first pass's timeline, for bucket_mib="auto": when each gradient was ready
        self._timeline: list[float] | None = [0.0] * len(trained) if auto else None
        self._produced = {id(p): i for i, p in enumerate(reversed(trained))}
        self.comm_seconds = 0.0  # waited for the gradients' communication after the passes
        self._sync = True
        self._in_pass = False
        self._next = 0  # the next bucket to send: every rank sends them in index order
        threads_ok = MPI.Query_thread() >= MPI.THREAD_SERIALIZED
        if overlap is None:
            overlap = _spare_core(base)
        self.overlap = bool(overlap) and threads_ok
        self._reducer: _Reducer | None = None
        if self.overlap:
            self._reducer = _Reducer(self._hierarchy, algorithm)
            self._reducer.start()
        self._hooks = [p.register_post_accumulate_grad_hook(self._ready) for p in trained]

    def _set_buckets(self, limit: int) -> None:
        self.buckets = _make_buckets(self._torch, self._trained, limit)
        self._where = {id(p): (b, slot) for b in self.buckets for slot, p in enumerate(b.params)}

    # ---- the module's face ------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The module's forward pass."""
        return self.module(*args, **kwargs)

    def parameters(self, recurse: bool = True) -> Iterator[Any]:
        """The module's parameters (for the optimizer)."""
        return self.module.parameters(recurse)

    def named_parameters(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        """The module's named parameters."""
        return self.module.named_parameters(*args, **kwargs)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """The module's state dict (the same on every rank)."""
        return self.module.state_dict(*args, **kwargs)

    def train(self, mode: bool = True) -> DataParallel:
        """Training mode for the module."""
        self.module.train(mode)
        return self

    def eval(self) -> DataParallel:
        """Evaluation mode for the module."""
        self.module.eval()
        return self

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally in the backward passes inside.

        The first backward pass after it averages everything accumulated.
        """
        was, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = was

    def free(self) -> None:
        """Stop the communication thread, remove the hooks, free the communicators."""
        if self._reducer is not None:
            self._reducer.work.put(None)
            self._reducer.join()
            self._reducer = None
        for hook in getattr(self, "_hooks", []):
            hook.remove()
        self._hooks = []
        if getattr(self, "_own", None) is not None:
            self._hierarchy.free()
            self._own.Free()
            self._own = None

    def __enter__(self) -> DataParallel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    # ---- set-up -----------------------------------------------------------------------

    def _check_same_model(self, base: Any) -> None:
        mine = [(name, tuple(p.shape), str(p.dtype)) for name, p in self.module.named_parameters()]
        every = base.allgather(mine)
        for rank, theirs in enumerate(every):
            if theirs == mine:
                continue
            for a, b in zip(mine + [None] * len(theirs), theirs + [None] * len(mine), strict=False):
                if a != b:
                    raise SgdError(
                        f"DataParallel: the ranks' models differ: rank {self.rank} has "
                        f"{_describe(a)} where rank {rank} has {_describe(b)}"
                    )

    def _broadcast(self) -> None:
        """Rank 0's parameters and buffers on every rank (one broadcast per dtype)."""
        import hpcpar

        torch = self._torch
        tensors = [*self.module.parameters(), *self.module.buffers()]
        groups: dict[tuple[Any, Any], list[Any]] = {}
        for t in tensors:
            groups.setdefault((t.dtype, t.device), []).append(t)
        with torch.no_grad():
            for group in groups.values():
                flat = torch.cat([t.detach().reshape(-1) for t in group])
                got = hpcpar.bcast(_as_array(flat), root=0, comm=self._hierarchy)
                flat = torch.as_tensor(got, device=flat.device)
                at = 0
                for t in group:
                    t.copy_(flat[at : at + t.numel()].view_as(t))
                    at += t.numel()

    # ---- the backward pass ---------------------------------------------------------------

    def _ready(self, param: Any) -> None:
        """Autograd accumulated ``param``'s gradient: put it in its bucket, send what is full."""
        if not self._sync:
            return
        if not self._in_pass:
            self._in_pass = True
            self._torch.autograd.Variable._execution_engine.queue_callback(self._finish)
            self._began = time.perf_counter()
        bucket, slot = self._where[id(param)]
        if bucket.filled[slot]:  # a second backward through the same graph: sum them
            return
        if self._timeline is not None:
            self._timeline[self._produced[id(param)]] = time.perf_counter() - self._began
        bucket.put(slot, param.grad)
        self._send_ready()

    def _send_ready(self) -> None:
        while self._next < len(self.buckets) and self.buckets[self._next].missing == 0:
            if self._reducer is not None:
                self._reducer.work.put(self.buckets[self._next])
            self._next += 1

    def _finish(self) -> None:
        """The end of the backward pass: send the rest, wait, write the averages back."""
        try:
            ended = time.perf_counter()
            for bucket in self.buckets:
                if bucket.missing:
                    bucket.zero_missing()
            self._send_ready()
            for bucket in self.buckets:
                if self._reducer is None:
                    reduce_bucket(bucket, self._hierarchy, self.algorithm)
                bucket.done.wait()
            self.comm_seconds += time.perf_counter() - ended
            errors = [b.error for b in self.buckets if b.error is not None]
            if errors:
                raise errors[0]
            self._write_back()
            if self._timeline is not None:
                self._choose_buckets(ended - self._began)
        finally:
            self._in_pass = False
            self._next = 0
            for bucket in self.buckets:
                bucket.reset()

    def _write_back(self) -> None:
        torch = self._torch
        with torch.no_grad():
            for bucket in self.buckets:
                total = bucket.offsets[-1]
                bucket.flat[:total].div_(self.size)
                used = bucket.flat[total:].tolist()
                for slot, p in enumerate(bucket.params):
                    if used[slot] == 0:  # no rank used it: its gradient stays as it was
                        continue
                    a, b = bucket.offsets[slot], bucket.offsets[slot + 1]
                    mean = bucket.flat[a:b].view_as(p)
                    if p.grad is None:
                        p.grad = mean.clone()
                    else:
                        p.grad.copy_(mean)

    def _choose_buckets(self, end: float) -> None:
        """Replay the recorded pass through the cost model; use the best bucket size."""
        from mpi4py import MPI

        from hpcpar.collectives.cost.explain import plan_for
        from hpcpar.collectives.cost.tally import Layout

        assert self._timeline is not None
        # each gradient at the latest share of the pass at which a rank had it, times
        # the slowest rank's pass (identical on every rank, so is the choice); a
        # parameter this pass did not use counts as ready at the end
        end = max(end, 1e-9)
        when = np.array([min(t, end) / end if t > 0 else 1.0 for t in self._timeline] + [end])
        self._own.Allreduce(MPI.IN_PLACE, when, op=MPI.MAX)
        when[:-1] *= when[-1]
        self._timeline = None
        order = list(reversed(self._trained))
        nbytes = [p.numel() * p.element_size() for p in order]
        itemsize = order[0].element_size()
        layout = Layout(tuple(self._hierarchy.node_of))
        cached: dict[int, float] = {}

        def cost(n: int) -> float:
            if n not in cached:
                plan = plan_for("allreduce", n, layout, itemsize=itemsize)
                name = plan.algorithm if self.algorithm == "auto" else self.algorithm
                cached[n] = next(
                    (q.seconds for q in plan.ranking if q.algorithm == name), plan.predicted_s
                )
            return cached[n]

        kinds = [(p.dtype, p.device) for p in order]
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
        one = every[_CANDIDATES[-1]]
        shape = (
            f"{len(self.buckets)} buckets of about {limit / _MIB:g} MiB"
            if len(self.buckets) > 1
            else "one bucket"
        )
        where = "buckets reduced during the pass" if self._reducer else "all after the pass"
        self.bucket_plan = (
            f"auto: {shape}; predicted communication after a {1e3 * float(when[-1]):.1f} ms "
            f"backward pass {1e3 * exposed:.2f} ms (one bucket: {1e3 * one:.2f} ms; {where})"
        )


def _check_dtypes(torch: Any, module: Any) -> None:
    """Every parameter and buffer of a dtype hpcpar can reduce (numpy's and cupy's)."""
    named = [*module.named_parameters(), *module.named_buffers()]
    for name, t in named:
        try:
            torch.empty(0, dtype=t.dtype).numpy()
        except TypeError:
            raise SgdError(
                f"DataParallel: {name} is {str(t.dtype).removeprefix('torch.')}, which "
                "hpcpar's collectives cannot reduce (numpy has no such type); train in "
                "float32 or float16"
            ) from None


def _spare_core(comm: Any) -> bool:
    """Whether this host has more usable cores than ranks of ``comm`` (collective)."""
    from mpi4py import MPI

    from hpcpar.runtime.env import usable_cores

    host = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        ranks = host.Get_size()
    finally:
        host.Free()
    return bool(comm.allreduce(int(usable_cores() > ranks), op=MPI.MIN))


def _group(kinds: list[Any], nbytes: list[int], limit: int) -> list[list[int]]:
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


def _make_buckets(torch: Any, params: list[Any], limit: int) -> list[_Bucket]:
    """Reverse registration order, one dtype and device per bucket, about ``limit`` bytes."""
    order = list(reversed(params))
    kinds = [(p.dtype, p.device) for p in order]
    groups = _group(kinds, [p.numel() * p.element_size() for p in order], limit)
    return [_Bucket(torch, [order[i] for i in g]) for g in groups]


# bucket limits ``bucket_mib="auto"`` considers: 64 KiB to 256 MiB
_CANDIDATES = tuple(1 << k for k in range(16, 29))


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
    for limit in _CANDIDATES:
        clock = 0.0
        for group in _group(kinds, nbytes, limit):
            start = max(ready[i] for i in group) if overlap else end
            clock = max(clock, start) + cost(sum(nbytes[i] for i in group))
        exposed[limit] = max(0.0, clock - end)
    best = min(exposed.values())
    chosen = max(limit for limit, t in exposed.items() if t <= best * 1.01 + 1e-9)
    return chosen, exposed[chosen], exposed


def _describe(entry: tuple[str, tuple[int, ...], str] | None) -> str:
    if entry is None:
        return "no parameter"
    name, shape, dtype = entry
    return f"{name} of shape {list(shape)} ({dtype.removeprefix('torch.')})"


class ZeroOptimizer:
    """ZeRO stage 1 over a ``DataParallel`` model: optimizer state sharded over ranks.

    Each rank keeps the optimizer state of one slice of the parameters. ``step()``
    reduce-scatters the gradients (each rank receives the sum of its slice), steps its
    slice with its own optimizer, and allgathers the updated slices, so every rank ends
    with the whole model while holding a ``1/ranks`` share of the optimizer state
    (Adam's two moments, momentum buffers). The model's ``backward()`` then leaves the
    gradients as each rank computed them (no allreduce). For element-wise optimizers
    (SGD, momentum, Adam, AdamW) the model is the unsharded one's, within
    floating-point summation order.

    With ``hierarchical=True`` (the ZeRO++ hpZ idea, over a ``Hierarchy``'s nodes) the
    scatter and gather run hpcpar's two-level algorithms: within each node first, and
    only one rank per node talks to the other nodes, so the parameter allgather crosses
    the network once per node instead of once per rank.

    Args:
        model: The ``DataParallel`` model (all parameters of one dtype and device).
        make_optimizer: Builds the inner optimizer from a list of parameters, e.g.
            ``lambda p: torch.optim.Adam(p, lr=1e-3)``.
        hierarchical: Two-level scatter and gather (where the hierarchy has several
            nodes and a node with several ranks; otherwise the flat ones, which are
            then as good).

    Raises:
        SgdError: parameters of several dtypes or devices.
    """

    def __init__(
        self, model: DataParallel, make_optimizer: Any, *, hierarchical: bool = False
    ) -> None:
        torch = model._torch
        self.model, self._torch = model, torch
        self.params = [p for p in model.module.parameters() if p.requires_grad]
        kinds = {(p.dtype, p.device) for p in self.params}
        if len(kinds) != 1:
            raise SgdError("ZeroOptimizer: the parameters must share one dtype and device")
        model._sync = False  # backward leaves the local gradients to step()
        self.sizes = [p.numel() for p in self.params]
        total = sum(self.sizes)
        size, rank = model.size, model.rank
        self.counts = [total // size + (1 if r < total % size else 0) for r in range(size)]
        self.lo = sum(self.counts[:rank])
        self.hi = self.lo + self.counts[rank]
        nodes = model._hierarchy.node_of
        # two levels only where there are both: several nodes, and a node with several ranks
        two = hierarchical and 1 < len(set(nodes)) < len(nodes)
        self.algorithm = "two_level" if two else model.algorithm
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.shard = torch.nn.Parameter(flat[self.lo : self.hi].clone())
        self.optimizer = make_optimizer([self.shard])

    @property
    def param_groups(self) -> Any:
        """The inner optimizer's parameter groups (learning rate and so on)."""
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the model's gradients."""
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def step(self) -> None:
        """Reduce-scatter the gradients, step this rank's slice, allgather the model."""
        import hpcpar

        torch, model = self._torch, self.model
        with torch.no_grad():
            grads = torch.cat(
                [
                    (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                    for p in self.params
                ]
            )
            mine = hpcpar.reduce_scatter(
                _as_array(grads),
                counts=self.counts,
                comm=model._hierarchy,
                algorithm=self._algorithm("reduce_scatter"),
            )
            self.shard.grad = torch.as_tensor(mine, device=grads.device).div_(model.size)
        self.optimizer.step()
        with torch.no_grad():
            whole = hpcpar.allgather(
                _as_array(self.shard.detach()),
                counts=self.counts,
                comm=model._hierarchy,
                algorithm=self._algorithm("allgather"),
            )
            flat = torch.as_tensor(whole, device=self.shard.device)
            at = 0
            for p, n in zip(self.params, self.sizes, strict=True):
                p.copy_(flat[at : at + n].view_as(p))
                at += n

    def _algorithm(self, collective: str) -> str:
        """The model's algorithm where ``collective`` has it (allreduce's may not)."""
        from hpcpar.collectives import algorithms_for

        return self.algorithm if self.algorithm in algorithms_for(collective) else "auto"

    def state_dict(self) -> Any:
        """This rank's slice of the optimizer state."""
        return self.optimizer.state_dict()


class LocalSGD:
    """Local SGD and DiLoCo-style outer steps over a ``DataParallel`` model.

    Each rank takes ``steps`` steps of its own (inner) optimizer on its own batches
    without communication; then the ranks average how far their models moved from the
    last common model (the outer gradient, one allreduce) and an outer optimizer steps
    the common model by it, and every rank continues from the result. Communication
    falls by a factor of ``steps``. With the default outer optimizer (SGD, learning rate
    1) the outer step is plain model averaging (local SGD); DiLoCo uses SGD with
    Nesterov momentum (``lambda p: torch.optim.SGD(p, lr=0.7, momentum=0.9,
    nesterov=True)``).

    Args:
        model: The ``DataParallel`` model (all parameters of one dtype and device).
        inner: The inner optimizer over ``model.parameters()``.
        steps: Inner steps per outer step.
        make_outer: Builds the outer optimizer from a list of parameters (default: SGD
            with learning rate 1).

    Raises:
        SgdError: ``steps`` below 1, or parameters of several dtypes or devices.
    """

    def __init__(
        self, model: DataParallel, inner: Any, *, steps: int = 8, make_outer: Any = None
    ) -> None:
        torch = model._torch
        if not isinstance(steps, int) or steps < 1:
            raise SgdError(f"LocalSGD: steps must be a positive integer, not {steps!r}")
        self.model, self.inner, self.steps, self._torch = model, inner, steps, torch
        self.params = [p for p in model.module.parameters() if p.requires_grad]
        if len({(p.dtype, p.device) for p in self.params}) != 1:
            raise SgdError("LocalSGD: the parameters must share one dtype and device")
        model._sync = False  # the inner steps use each rank's own gradients
        with torch.no_grad():
            self.common = torch.nn.Parameter(self._flat())
        make_outer = make_outer or (lambda p: torch.optim.SGD(p, lr=1.0))
        self.outer = make_outer([self.common])
        self.taken = 0  # inner steps since the last outer step

    def _flat(self) -> Any:
        return self._torch.cat([p.detach().reshape(-1) for p in self.params])

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the model's gradients (the inner optimizer's)."""
        self.inner.zero_grad(set_to_none=set_to_none)

    def step(self) -> bool:
        """One inner step, and the outer step when ``steps`` have been taken.

        Returns:
            Whether this step synchronised the ranks (collective then).
        """
        self.inner.step()
        self.taken += 1
        if self.taken < self.steps:
            return False
        self.synchronize()
        return True

    def synchronize(self) -> None:
        """The outer step now (collective): average the moves, step the common model."""
        import hpcpar

        torch, model = self._torch, self.model
        with torch.no_grad():
            moved = self.common.detach() - self._flat()
            total = hpcpar.allreduce(
                _as_array(moved), comm=model._hierarchy, algorithm=model.algorithm
            )
            self.common.grad = torch.as_tensor(total, device=moved.device).div_(model.size)
        self.outer.step()
        with torch.no_grad():
            at = 0
            for p in self.params:
                n = p.numel()
                p.copy_(self.common[at : at + n].view_as(p))
                at += n
        self.taken = 0
