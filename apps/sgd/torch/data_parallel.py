"""``DataParallel``: a torch module whose backward pass averages gradients over the ranks."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from hpcpar.gradients import MIB, GradientSync, as_array, describe_param, spare_core

from ..models import SgdError

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
        compression: None (exact), or a scheme (``"int8"``, ``"fp16"``, ``"bf16"``,
            ``"1bit"``, a ``hpcpar.Compression``) for the gradients' allreduces: coded
            only across nodes (``hpcpar.collectives.compression``); or a
            ``hpcpar.PowerSGD`` (its settings; every bucket keeps its own state).
        error_feedback: Keep what coding loses and add it to the next step's gradients
            (``hpcpar.ErrorFeedback``); needed for ``1bit`` to converge.

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
        compression: Any = None,
        error_feedback: bool = False,
    ) -> None:
        from mpi4py import MPI

        from hpcpar.collectives.compression import as_compression
        from hpcpar.collectives.errors import CollectiveError
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
        from hpcpar.powersgd import PowerSGD

        try:
            spec = compression if isinstance(compression, PowerSGD) else as_compression(compression)
        except CollectiveError as exc:
            raise SgdError(f"DataParallel: {exc}") from None
        if error_feedback and spec is None:
            raise SgdError("DataParallel: error_feedback=True needs a compression")
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
        threads_ok = MPI.Query_thread() >= MPI.THREAD_SERIALIZED
        if overlap is None:
            overlap = spare_core(base)
        self.sync = GradientSync(
            trained,
            self.hierarchy,
            limit=None if auto else int(bucket_mib * MIB),
            algorithm=algorithm,
            overlap=bool(overlap) and threads_ok,
            compression=spec,
            error_feedback=error_feedback,
        )
        if not auto:
            self.sync.plan = (
                f"{len(self.sync.buckets)} bucket(s) of at most about {bucket_mib:g} MiB, "
                "as requested"
            )
        self.sync_gradients = True
        self._in_pass = False
        self._hooks = [p.register_post_accumulate_grad_hook(self._ready) for p in trained]

    @property
    def buckets(self) -> list[Any]:
        """The gradient buckets, in the order every rank reduces them."""
        return self.sync.buckets

    @property
    def bucket_bytes(self) -> int:
        """The bucket size in bytes (the cost model's choice after the first pass if auto)."""
        return self.sync.bucket_bytes

    @property
    def bucket_plan(self) -> str:
        """Which bucket size is used and why."""
        return self.sync.plan

    @property
    def overlap(self) -> bool:
        """Whether buckets are reduced on a communication thread during the pass."""
        return self.sync.overlap

    @property
    def compression(self) -> Any:
        """The gradients' ``hpcpar.Compression`` or ``hpcpar.PowerSGD`` (None: exact)."""
        return self.sync.powersgd or self.sync.compression

    def feedback_state(self) -> dict[str, Any]:
        """The error feedback's residuals, for a checkpoint (``GradientSync.feedback_state``)."""
        return self.sync.feedback_state()

    def load_feedback_state(self, saved: dict[str, Any]) -> None:
        """Take back what ``feedback_state`` saved (any rank count)."""
        self.sync.load_feedback_state(saved)

    @property
    def comm_seconds(self) -> float:
        """Seconds waited for the gradients' communication after the backward passes."""
        return self.sync.comm_seconds

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
        if getattr(self, "sync", None) is not None:
            self.sync.close()
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
        if self.sync.filled(param):  # a second backward through the same graph: sum them
            return
        self.sync.put(param, param.grad)

    def _finish(self) -> None:
        """The end of the backward pass: send the rest, wait, write the averages back."""
        try:
            self.sync.complete()
            self._write_back()
        finally:
            self._in_pass = False
            self.sync.reset()

    def _write_back(self) -> None:
        with torch.no_grad():
            for bucket in self.sync.buckets:
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
