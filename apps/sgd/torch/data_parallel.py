"""``DataParallel``: a torch module whose backward pass averages gradients over the ranks."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from ..models import SgdError
from .buckets import (
    CANDIDATES,
    MIB,
    Reducer,
    as_array,
    make_buckets,
    plan_buckets,
    reduce_bucket,
)

__all__ = ["DataParallel"]


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

    Attributes:
        hierarchy: The gradients' own ``Hierarchy`` (a duplicate of ``comm``): the
            optimizers built on the model (``ZeroOptimizer``, ``LocalSGD``) use it too.
        sync_gradients: Whether ``backward()`` averages the gradients (``no_sync``, and
            the optimizers that communicate themselves, turn it off).

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
        base = resolve_comm(comm)
        self.rank, self.size = base.Get_rank(), base.Get_size()
        self._check_same_model(base)
        check_dtypes(module)
        # the gradients' own communicator: the program's collectives on comm never
        # interleave with the communication thread's
        self._own = base.Dup()
        layout = comm.layout if isinstance(comm, Hierarchy) else None
        self.hierarchy = Hierarchy(self._own, layout=layout)
        self._broadcast()
        trained = [p for p in module.parameters() if p.requires_grad]
        if not trained:
            self.free()
            raise SgdError("DataParallel: the module has no parameter that requires grad")
        self._trained = trained
        self.bucket_bytes = int((25.0 if auto else bucket_mib) * MIB)
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
        self.sync_gradients = True
        self._in_pass = False
        self._next = 0  # the next bucket to send: every rank sends them in index order
        threads_ok = MPI.Query_thread() >= MPI.THREAD_SERIALIZED
        if overlap is None:
            overlap = spare_core(base)
        self.overlap = bool(overlap) and threads_ok
        self._reducer: Reducer | None = None
        if self.overlap:
            self._reducer = Reducer(self.hierarchy, algorithm)
            self._reducer.start()
        self._hooks = [p.register_post_accumulate_grad_hook(self._ready) for p in trained]

    def _set_buckets(self, limit: int) -> None:
        self.buckets = make_buckets(self._trained, limit)
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
        was, self.sync_gradients = self.sync_gradients, False
        try:
            yield
        finally:
            self.sync_gradients = was

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
            self.hierarchy.free()
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
                        f"{describe_param(a)} where rank {rank} has {describe_param(b)}"
                    )

    def _broadcast(self) -> None:
        """Rank 0's parameters and buffers on every rank (one broadcast per dtype)."""
        import hpcpar

        tensors = [*self.module.parameters(), *self.module.buffers()]
        groups: dict[tuple[Any, Any], list[Any]] = {}
        for t in tensors:
            groups.setdefault((t.dtype, t.device), []).append(t)
        with torch.no_grad():
            for group in groups.values():
                flat = torch.cat([t.detach().reshape(-1) for t in group])
                got = hpcpar.bcast(as_array(flat), root=0, comm=self.hierarchy)
                flat = torch.as_tensor(got, device=flat.device)
                at = 0
                for t in group:
                    t.copy_(flat[at : at + t.numel()].view_as(t))
                    at += t.numel()

    # ---- the backward pass ---------------------------------------------------------------

    def _ready(self, param: Any) -> None:
        """Autograd accumulated ``param``'s gradient: put it in its bucket, send what is full."""
        if not self.sync_gradients:
            return
        if not self._in_pass:
            self._in_pass = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish)
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
                    reduce_bucket(bucket, self.hierarchy, self.algorithm)
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
        from hpcpar.collectives.tally import Layout

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
        layout = Layout(tuple(self.hierarchy.node_of))
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
        one = every[CANDIDATES[-1]]
        shape = (
            f"{len(self.buckets)} buckets of about {limit / MIB:g} MiB"
            if len(self.buckets) > 1
            else "one bucket"
        )
        where = "buckets reduced during the pass" if self._reducer else "all after the pass"
        self.bucket_plan = (
            f"auto: {shape}; predicted communication after a {1e3 * float(when[-1]):.1f} ms "
            f"backward pass {1e3 * exposed:.2f} ms (one bucket: {1e3 * one:.2f} ms; {where})"
        )


def check_dtypes(module: Any) -> None:
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


def spare_core(comm: Any) -> bool:
    """Whether this host has more usable cores than ranks of ``comm`` (collective)."""
    from mpi4py import MPI

    from hpcpar.runtime.env import usable_cores

    host = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        ranks = host.Get_size()
    finally:
        host.Free()
    return bool(comm.allreduce(int(usable_cores() > ranks), op=MPI.MIN))


def describe_param(entry: tuple[str, tuple[int, ...], str] | None) -> str:
    if entry is None:
        return "no parameter"
    name, shape, dtype = entry
    return f"{name} of shape {list(shape)} ({dtype.removeprefix('torch.')})"
