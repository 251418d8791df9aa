"""Horovod's ``DistributedOptimizer`` over hpcpar's gradient buckets.

The optimizer is the one the script built, subclassed as Horovod does it (``isinstance``
and ``state_dict`` keep working). Each parameter's gradient goes into its bucket
(``hpcpar.gradients.GradientSync``) as soon as autograd has accumulated it for the
last of ``backward_passes_per_step`` passes; a full bucket is reduced on a
communication thread while the backward pass goes on (where the host has a core to
spare, as the SGD app's ``DataParallel`` does), the rest when ``synchronize()`` or
``step()`` runs. Buckets go out in the same order on every rank, whatever order the
ranks' passes produce gradients in, so no names need to be negotiated.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from mpi4py import MPI

from ...gradients import MIB, GradientSync, describe_param, spare_core
from ...topology import Hierarchy
from .. import basics
from ..basics import Adasum, Average, ProcessSet, Sum, global_process_set, size
from ..environment import allreduce_algorithm, flag, fusion_threshold
from .compression import Compression
from .join import control_round
from .tensors import MPI_OPS, op_of, scale

__all__ = ["DistributedOptimizer"]

# the compressions that are a cast to the bucket's type and back (Horovod's own)
_CASTS = (  # and hpcpar's, whose tensors stay as they are: the buckets are coded
    Compression.none,
    Compression.fp16,
    Compression.bf16,
    Compression.int8,
    Compression.onebit,
)


class _DistributedOptimizer(torch.optim.Optimizer):
    """Horovod's optimizer wrapper.

    Its methods are copied onto a subclass of the script's optimizer class, as
    Horovod's are (hence ``super(self.__class__, self)``).
    """

    def __init__(
        self,
        params: Any,
        named_parameters: Any,
        compression: Any,
        backward_passes_per_step: int = 1,
        op: int = Average,
        gradient_predivide_factor: float = 1.0,
        groups: Any = None,
        sparse_as_dense: bool = False,
        process_set: ProcessSet = global_process_set,
    ) -> None:
        super(self.__class__, self).__init__(params)  # type: ignore[arg-type]
        self._compression = compression
        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [
                (f"allreduce.noname.{i}.{j}", v)
                for i, param_group in enumerate(self.param_groups)
                for j, v in enumerate(param_group["params"])
            ]
        if any(not isinstance(p, tuple) for p in named_parameters):
            raise ValueError(
                "named_parameters should be a sequence of tuples (name, parameter), "
                "usually produced by model.named_parameters()."
            )
        names = [k for k, _ in named_parameters]
        dups = sorted({k for k in names if names.count(k) > 1})
        if dups:
            raise ValueError(
                "Parameter names in named_parameters must be unique. "
                f"Found duplicates: {', '.join(dups)}"
            )
        all_ids = {id(v) for group in self.param_groups for v in group["params"]}
        unnamed = all_ids - {id(v) for _, v in named_parameters}
        if unnamed:
            raise ValueError(
                "named_parameters was specified, but one or more model parameters were "
                f"not named. Python object ids: {', '.join(str(i) for i in unnamed)}"
            )
        self._parameter_names = {id(v): k for k, v in named_parameters}
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._synchronized = False
        self._should_synchronize = True
        self._pending = False  # a hook ran since the last synchronize
        self._hooks: list[Any] = []
        self._sync: GradientSync | None = None
        self._requires_update = [
            p for group in self.param_groups for p in group["params"] if p.requires_grad
        ]
        self._allreduce_delay = {id(p): backward_passes_per_step for p in self._requires_update}
        self._ctx: dict[int, Any] = {}
        self._sparse: dict[int, Any] = {}
        _check_groups(groups)
        self._groups = groups
        if self.process_set.included() and self._requires_update:
            _DistributedOptimizer._start(self)

    def _start(self) -> None:
        """Check the ranks' parameters agree, build the buckets, register the hooks."""
        comm = basics.set_comm(self.process_set)
        mine = [
            (self._parameter_names[id(p)], tuple(p.shape), str(p.dtype))
            for p in self._requires_update
        ]
        every = comm.comm.allgather(mine)
        for their_rank, theirs in enumerate(every):
            if theirs != mine:
                first = next(
                    (a, b) for a, b in zip([*mine, None], [*theirs, None], strict=False) if a != b
                )
                raise ValueError(
                    "DistributedOptimizer: the ranks' parameters differ: rank "
                    f"{basics.rank()} has {describe_param(first[0])} where rank "
                    f"{self.process_set.ranks[their_rank]} has {describe_param(first[1])}"
                )
        # the gradients' own communicator: the thread never interleaves with the script
        self._own = comm.comm.Dup()
        self._hierarchy = Hierarchy(self._own, layout=comm.layout)
        threads_ok = MPI.Query_thread() >= MPI.THREAD_SERIALIZED
        overlap = threads_ok and not flag("HOROVOD_MPI_THREADS_DISABLE") and spare_core(comm.comm)
        threshold = fusion_threshold()
        compression = self._compression

        def dtype_of(p: Any) -> Any:
            return compression.compress(torch.zeros(1, dtype=p.dtype))[0].dtype

        self._sync = GradientSync(
            self._requires_update,
            self._hierarchy,
            compression=getattr(compression, "scheme", None) or None,
            error_feedback=getattr(compression, "error_feedback", False),
            limit=None if threshold is None else max(1, threshold),
            algorithm=allreduce_algorithm(),
            overlap=overlap,
            op=MPI_OPS[self.op],
            dtype_of=dtype_of,
            counts=False,
            groups=_DistributedOptimizer._group_indices(self),
        )
        if threshold is not None:
            self._sync.plan = (
                f"HOROVOD_FUSION_THRESHOLD={threshold}: {len(self._sync.buckets)} bucket(s) "
                f"of at most about {threshold / MIB:g} MiB"
            )
        self._join_id: int | None = None
        if self.process_set == global_process_set:
            st = basics.state()
            self._join_id = len(st.optimizers)
            st.optimizers.append(weakref.ref(self))
        if size() > 1:
            self._hooks = [
                p.register_post_accumulate_grad_hook(_DistributedOptimizer._make_hook(self, p))
                for p in self._requires_update
            ]

    def _group_indices(self) -> list[list[int]] | None:
        """``groups`` as indices into the trained parameters (None: buckets by size)."""
        if self._groups is None:
            return None
        params = self._requires_update
        if isinstance(self._groups, list):
            where = {id(p): i for i, p in enumerate(params)}
            out = [[where[id(p)] for p in g if id(p) in where] for g in self._groups]
            grouped = {i for g in out for i in g}
            out += [[i] for i in range(len(params)) if i not in grouped]
            return [g for g in out if g]
        # Horovod's split_list: n groups as even as can be, the first ones one longer
        count = min(int(self._groups), len(params))
        per, extra = divmod(len(params), count)
        bounds = [i * per + min(i, extra) for i in range(count + 1)]
        return [list(range(bounds[i], bounds[i + 1])) for i in range(count)]

    def _make_hook(self, p: Any) -> Any:
        def hook(param: Any) -> None:
            key = id(p)
            if self._allreduce_delay[key] <= 0:
                raise AssertionError(
                    "Gradients were computed more than backward_passes_per_step times "
                    "before call to step(). Increase backward_passes_per_step to "
                    "accumulate gradients locally."
                )
            self._pending = True
            self._allreduce_delay[key] -= 1
            if self._allreduce_delay[key] == 0:
                _DistributedOptimizer._put(self, p)

        return hook

    def _put(self, p: Any) -> None:
        """``p``'s gradient (compressed, prescaled) into its bucket."""
        assert self._sync is not None
        if p.grad is None:  # another rank may have computed it
            p.grad = torch.zeros_like(p)
        grad = p.grad
        if grad.is_sparse:
            if not self.sparse_as_dense:
                self._sparse[id(p)] = grad  # reduced by allgather in synchronize
                return
            grad = grad.to_dense()
        if self._compression in _CASTS:  # the bucket's copy casts: no tensor in between
            compressed = grad
        else:
            compressed, self._ctx[id(p)] = self._compression.compress(grad)
        if self.op == Average and self.gradient_predivide_factor != 1.0:
            compressed = compressed * (1.0 / self.gradient_predivide_factor)
        self._sync.put(p, compressed.detach())

    def synchronize(self) -> None:
        """Finish reducing every gradient and write the results into ``p.grad``."""
        if self._sync is None:
            self._synchronized = True
            return
        sync = self._sync
        try:
            if self._join_id is not None and size() > 1:
                control_round(self._join_id, bool(self._sparse))
            for p in self._requires_update:
                if not sync.filled(p) and id(p) not in self._sparse:
                    _DistributedOptimizer._put(self, p)
            sync.complete()
            _DistributedOptimizer._write_back(self)
            for p in self._requires_update:  # the same order on every rank
                if id(p) in self._sparse:
                    _DistributedOptimizer._sparse_reduce(self, p, self._sparse[id(p)])
        finally:
            sync.reset()
            self._sparse.clear()
            self._ctx.clear()
            for key in self._allreduce_delay:
                self._allreduce_delay[key] = self.backward_passes_per_step
            self._pending = False
        self._synchronized = True

    def _write_back(self) -> None:
        assert self._sync is not None
        post = self.gradient_predivide_factor if self.op == Average else 1.0
        if self.op == Average:
            post /= self._hierarchy.comm.Get_size()
        with torch.no_grad():
            for bucket in self._sync.buckets:
                scale(bucket.array, post)
                for slot, p in enumerate(bucket.params):
                    if id(p) in self._sparse:
                        continue
                    a, b = bucket.offsets[slot], bucket.offsets[slot + 1]
                    view = bucket.flat[a:b].view(p.shape)
                    if self._compression in _CASTS:  # the copy below casts back
                        out = view
                    else:
                        out = self._compression.decompress(view, self._ctx.get(id(p)))
                    if p.grad.is_sparse:
                        p.grad.zero_().add_(out.to(p.grad.dtype).to_sparse())
                    elif out.data_ptr() == view.data_ptr() and out.dtype == p.dtype:
                        p.grad = out  # the bucket's memory, as DDP's gradient_as_bucket_view
                    else:
                        p.grad.copy_(out)

    def _sparse_reduce(self, p: Any, grad: Any) -> None:
        """Horovod's sparse allreduce: every rank's indices and values, gathered."""
        from .grouped import sparse_allreduce_async

        total = sparse_allreduce_async(grad, "", self.op, self.process_set)()
        p.grad.zero_().add_(total)

    def _serve_joined(self) -> None:
        """A joined rank's part in another rank's step: zeros for every gradient."""
        assert self._sync is not None
        try:
            self._sync.complete()
        finally:
            self._sync.reset()

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """``step()`` inside does not synchronize (call ``synchronize()`` before it)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Any = None) -> Any:
        """Synchronize (unless inside ``skip_synchronize``), then the optimizer's step."""
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() context "
                    "after optimizer.synchronize(). This can cause training slowdown. You "
                    "may want to consider using optimizer.skip_synchronize() context if "
                    "you use optimizer.synchronize() in your code.",
                    stacklevel=2,
                )
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)  # type: ignore[misc]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The optimizer's ``zero_grad``; an error between ``backward`` and ``step``."""
        if self._pending:
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(). This is prohibited as it "
                "can cause a race condition."
            )
        super(self.__class__, self).zero_grad(set_to_none)  # type: ignore[misc]

    def load_state_dict(self, *args: Any, **kwargs: Any) -> None:
        """The optimizer's ``load_state_dict``; pending reductions are forgotten."""
        if self._sync is not None and self._pending:
            self._sync.complete()  # every rank takes part in what was started
            self._sync.reset()
        self._pending, self._synchronized, self._should_synchronize = False, False, True
        self._ctx.clear()
        self._sparse.clear()
        for key in self._allreduce_delay:
            self._allreduce_delay[key] = self.backward_passes_per_step
        super(self.__class__, self).load_state_dict(*args, **kwargs)  # type: ignore[misc]

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes accumulate before a reduction."""
        self.backward_passes_per_step = passes
        for key in self._allreduce_delay:
            self._allreduce_delay[key] = passes

    @property
    def bucket_plan(self) -> str:
        """Which bucket size the gradients use and why (``hpcpar.gradients``)."""
        return self._sync.plan if self._sync is not None else "no gradients reduced here"

    @property
    def communication(self) -> dict[str, float]:
        """This rank's gradient communication so far, in seconds.

        ``steps``; ``reduce_s``: the buckets' reductions, each from its start to its
        end, summed; ``exposed_s``: what ``step()`` waited for them after the
        backward passes; ``hidden_s``: the difference, which the passes hid.
        """
        sync = self._sync
        if sync is None:
            return {"steps": 0, "reduce_s": 0.0, "exposed_s": 0.0, "hidden_s": 0.0}
        return {
            "steps": sync.passes,
            "reduce_s": sync.reduce_seconds,
            "exposed_s": sync.comm_seconds,
            "hidden_s": max(0.0, sync.reduce_seconds - sync.comm_seconds),
        }

    def __del__(self) -> None:
        sync = getattr(self, "_sync", None)
        if sync is not None:
            sync.close()


def _check_groups(groups: Any) -> None:
    """Horovod's checks of ``groups`` (a count, or lists of distinct tensors)."""
    if groups is None:
        return
    if not (isinstance(groups, list) or groups > 0):
        raise ValueError(
            "groups should be a non-negative integer or a list of list of torch.Tensor."
        )
    if isinstance(groups, list):
        seen: set[int] = set()
        for members in groups:
            for p in members:
                if not isinstance(p, torch.Tensor):
                    raise ValueError("groups must consist of torch.Tensor.")
                if id(p) in seen:
                    raise ValueError("A parameter can only appear once in groups.")
                seen.add(id(p))


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Any = None,
    compression: Any = Compression.none,
    backward_passes_per_step: int = 1,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: ProcessSet = global_process_set,
) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that ``step()`` uses gradients reduced over the processes.

    As Horovod's: ``op`` (``Average`` by default) combines the ranks' gradients,
    ``gradient_predivide_factor`` splits the average before and after the sum,
    ``backward_passes_per_step`` passes accumulate locally before a reduction,
    ``groups`` (a count, or lists of parameters) fixes which gradients are fused,
    ``compression`` sends them compressed, ``sparse_as_dense`` reduces sparse
    gradients as dense ones (else their rows are gathered), ``process_set`` limits the
    reduction to a set. Without ``groups`` the buckets are
    ``HOROVOD_FUSION_THRESHOLD`` bytes, or the size hpcpar's cost model predicts ends
    the backward pass's communication soonest (``optimizer.bucket_plan`` says which).
    """
    basics.state()
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if getattr(compression, "scheme", "") and op not in (Average, Sum):
        raise ValueError(f"Compression.{compression.name} sums: use op Average or Sum")
    if num_groups != 0:
        warnings.warn(
            "Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
            DeprecationWarning,
            stacklevel=2,
        )
        if groups is None:
            groups = num_groups
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    if op == Adasum:
        raise NotImplementedError("hpcpar.horovod does not support Adasum; use Average or Sum")
    op_of(op, None)  # an unknown op: ValueError
    cls = type(
        optimizer.__class__.__name__,
        (optimizer.__class__,),
        dict(_DistributedOptimizer.__dict__),
    )
    return cls(  # type: ignore[no-any-return]
        optimizer.param_groups,
        named_parameters,
        compression,
        backward_passes_per_step,
        op,
        gradient_predivide_factor,
        groups,
        sparse_as_dense,
        process_set,
    )
