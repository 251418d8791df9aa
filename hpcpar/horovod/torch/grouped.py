"""Horovod's reducescatter, the grouped allgather and reducescatter, and sparse allreduce.

A grouped call starts one hpcpar collective per tensor under one handle, so
``synchronize`` returns every result at once, as Horovod's fused call does. Each
differentiable form has Horovod's gradient: a reducescatter's is the allgather of the
output's gradient (times the set's size for ``Sum`` and the scale factors), a grouped
allgather's the average of the gradients, each rank's rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ... import collectives as hc
from ..basics import Average, ProcessSet, Sum, global_process_set
from .compression import Compression
from .handles import new_handle, synchronize, take
from .mpi_ops import allgather, allgather_async, grouped_allreduce
from .tensors import MPI_OPS, array, op_of, scale, target, wrap

__all__ = [
    "reducescatter",
    "reducescatter_async",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "sparse_allreduce_async",
]


def _reducescatter_parts(
    tensor: torch.Tensor,
    op: int,
    process_set: ProcessSet,
    prescale_factor: float,
    postscale_factor: float,
) -> tuple[Any, Any]:
    """Start one reducescatter; returns its request and what makes its output."""
    comm = target(process_set)
    p, me = comm.size, comm.rank
    if tensor.dim() == 0:
        raise ValueError("reducescatter needs a tensor of at least one dimension")
    n = tensor.shape[0]
    rows = [n // p + (1 if i < n % p else 0) for i in range(p)]
    row = int(np.prod(tensor.shape[1:], dtype=np.int64))
    x = array(tensor).reshape(-1).copy()
    scale(x, prescale_factor)
    out = torch.empty((rows[me], *tensor.shape[1:]), dtype=tensor.dtype)
    flat = array(out).reshape(-1)
    post = postscale_factor / p if op == Average else postscale_factor
    request = wrap(
        lambda: hc.ireduce_scatter(
            x, MPI_OPS[op], counts=[r * row for r in rows], out=flat, comm=comm
        )
    )

    def finish() -> torch.Tensor:
        scale(flat, post)
        return out

    return request, finish


def reducescatter_async(
    tensor: torch.Tensor,
    name: str | None = None,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    """Start reducing ``tensor`` and giving process i its block of the first dimension.

    Blocks as Horovod splits them: ``n // p`` rows each, the first ``n % p`` one more.
    """
    op = op_of(op, None)
    request, finish = _reducescatter_parts(
        tensor, op, process_set, prescale_factor, postscale_factor
    )
    return new_handle([request], finish)


def _scatter_gradient(ctx: Any, grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    factor = ctx.process_set.size() if ctx.op == Sum else 1.0
    factor *= ctx.prescale_factor * ctx.postscale_factor
    return [g * factor if factor != 1.0 else g for g in grads]


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        tensor: torch.Tensor,
        op: int,
        process_set: ProcessSet,
        prescale_factor: float,
        postscale_factor: float,
    ) -> torch.Tensor:
        ctx.op, ctx.process_set = op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return synchronize(
            reducescatter_async(tensor, None, op, process_set, prescale_factor, postscale_factor)
        )

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        (grad,) = _scatter_gradient(ctx, [grad_output.contiguous()])
        return allgather(grad.contiguous(), process_set=ctx.process_set), None, None, None, None


def reducescatter(
    tensor: torch.Tensor,
    name: str | None = None,
    compression: Any = Compression.none,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """Reduce ``tensor`` over the processes and return this process's block of rows."""
    op = op_of(op, None)
    compressed, ctx = compression.compress(tensor)
    out = _Reducescatter.apply(compressed, op, process_set, prescale_factor, postscale_factor)
    return compression.decompress(out, ctx)


def grouped_reducescatter_async(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    """Start a reducescatter of every tensor of ``tensors``; one handle for all."""
    op = op_of(op, None)
    parts = [
        _reducescatter_parts(t, op, process_set, prescale_factor, postscale_factor) for t in tensors
    ]
    return new_handle([r for r, _ in parts], lambda: [finish() for _, finish in parts])


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        op: int,
        process_set: ProcessSet,
        prescale_factor: float,
        postscale_factor: float,
        *tensors: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        ctx.op, ctx.process_set = op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        handle = grouped_reducescatter_async(
            list(tensors), None, op, process_set, prescale_factor, postscale_factor
        )
        return tuple(synchronize(handle))

    @staticmethod
    def backward(ctx: Any, *grad_output: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        grads = _scatter_gradient(ctx, [g.contiguous() for g in grad_output])
        gathered = grouped_allgather([g.contiguous() for g in grads], process_set=ctx.process_set)
        return (None, None, None, None, *gathered)


def grouped_reducescatter(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    compression: Any = Compression.none,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[torch.Tensor]:
    """``reducescatter`` of every tensor of ``tensors`` in one call; returns a list."""
    op = op_of(op, None)
    pairs = [compression.compress(t) for t in tensors]
    outs = _GroupedReducescatter.apply(
        op, process_set, prescale_factor, postscale_factor, *[c for c, _ in pairs]
    )
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, pairs, strict=True)]


def grouped_allgather_async(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start an allgather of every tensor of ``tensors``; one handle for all."""
    handles = [allgather_async(t, process_set=process_set) for t in tensors]
    pending = [take(h) for h in handles]
    return new_handle(
        [r for p in pending for r in p.requests], lambda: [p.finish() for p in pending]
    )


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, process_set: ProcessSet, *tensors: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        ctx.dims, ctx.process_set = [t.shape[0] for t in tensors], process_set
        return tuple(synchronize(grouped_allgather_async(list(tensors), None, process_set)))

    @staticmethod
    def backward(ctx: Any, *grad_output: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        reduced = grouped_allreduce(
            [g.contiguous() for g in grad_output], op=Average, process_set=ctx.process_set
        )
        dims = grouped_allgather(
            [torch.tensor([d], dtype=torch.int32) for d in ctx.dims], process_set=ctx.process_set
        )
        r = ctx.process_set.rank()
        offsets = [int(d[:r].sum()) for d in dims]
        return (
            None,
            *[g.narrow(0, o, d) for g, o, d in zip(reduced, offsets, ctx.dims, strict=True)],
        )


def grouped_allgather(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """``allgather`` of every tensor of ``tensors`` in one call; returns a list."""
    return list(_GroupedAllgather.apply(process_set, *tensors))


def sparse_allreduce_async(
    tensor: torch.Tensor, name: str, op: int, process_set: ProcessSet = global_process_set
) -> Any:
    """Horovod's sparse allreduce: every rank's indices and values gathered.

    Returns a callable that waits and gives the summed (``Average``: averaged) sparse
    tensor, as Horovod's does.
    """
    t = tensor.coalesce() if not tensor.is_coalesced() else tensor
    indices_handle = allgather_async(
        t._indices().transpose(0, 1).contiguous(), process_set=process_set
    )
    values_handle = allgather_async(t._values().contiguous(), process_set=process_set)

    def handle() -> torch.Tensor:
        values = synchronize(values_handle)
        indices = synchronize(indices_handle)
        if op == Average:
            values = values / process_set.size()
        return torch.sparse_coo_tensor(
            indices.transpose(0, 1), values, t.size(), check_invariants=True
        )

    return handle
