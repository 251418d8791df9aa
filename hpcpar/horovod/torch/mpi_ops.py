"""Horovod's collectives on torch tensors, run as hpcpar's (Horovod's ``mpi_ops``).

Each collective takes a host tensor as a numpy view (writes go through), runs hpcpar's
collective on the process set's hierarchy, and applies Horovod's scaling; an ``*_async``
call returns an integer handle for ``poll``/``synchronize``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ... import collectives as hc
from ...collectives.errors import CollectiveError
from ...collectives.fastpath import fast_allreduce
from ..basics import (
    Average,
    HorovodInternalError,
    ProcessSet,
    Sum,
    global_process_set,
    rank,
)
from .compression import Compression
from .handles import new_handle, poll, synchronize
from .tensors import ANY, MPI_OPS, array, op_of, scale, set_rank, target, wrap

__all__ = [
    "allgather",
    "allgather_async",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "poll",
    "synchronize",
]

# ---- allreduce -----------------------------------------------------------------------


def _allreduce_async(
    tensor: torch.Tensor,
    output: torch.Tensor,
    op: int,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
) -> int:
    comm = target(process_set)
    if output is not tensor:
        with torch.no_grad():  # the result of a collective, not of the copy
            output.copy_(tensor)
    a = array(output)
    scale(a, prescale_factor)
    post = postscale_factor / comm.size if op == Average else postscale_factor
    request = wrap(lambda: hc.iallreduce(a, MPI_OPS[op], out=a, comm=comm))

    def finish() -> torch.Tensor:
        scale(a, post)
        return output

    return new_handle([request], finish)


def _allreduce_now(
    tensor: torch.Tensor,
    output: torch.Tensor | None,
    op: int,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
) -> torch.Tensor:
    """The blocking allreduce (hpcpar's fast path for small calls).

    ``output``: the tensor to write (``tensor`` itself for in place), or None for a new
    one; returns it.
    """
    comm = target(process_set)
    a = array(tensor)
    if output is tensor:
        out = a
    elif output is None:
        out = np.empty_like(a)
        output = torch.from_numpy(out)
    else:
        out = array(output)
    if prescale_factor != 1.0:
        if out is not a:
            np.copyto(out, a)
        scale(out, prescale_factor)
        a = out
    mpi_op = MPI_OPS[op]
    try:  # hpcpar.allreduce's own first step, then the rest of it
        if fast_allreduce(a, mpi_op, out, comm, "auto") is None:
            hc.allreduce(a, mpi_op, out=out, comm=comm)
    except CollectiveError as exc:
        raise HorovodInternalError(str(exc)) from None
    scale(out, postscale_factor / comm.size if op == Average else postscale_factor)
    return output


def allreduce_async(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start averaging (or ``op``) ``tensor`` over the processes; ``tensor`` is unchanged.

    Returns a handle for ``poll``/``synchronize``, whose result is a new tensor.
    ``name`` is accepted for Horovod's signature (calls match by order, as in MPI).
    """
    op = op_of(op, average)
    array(tensor)
    return _allreduce_async(
        tensor, torch.empty_like(tensor), op, prescale_factor, postscale_factor, process_set
    )


def allreduce_async_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """``allreduce_async`` in place: the result is written into ``tensor``."""
    op = op_of(op, average)
    return _allreduce_async(tensor, tensor, op, prescale_factor, postscale_factor, process_set)


class _Allreduce(torch.autograd.Function):
    """Allreduce with autograd: the gradient is the allreduce of the output's gradient."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        tensor: torch.Tensor,
        op: int,
        prescale_factor: float,
        postscale_factor: float,
        process_set: ProcessSet,
    ) -> torch.Tensor:
        ctx.op, ctx.process_set = op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return _allreduce_now(tensor, None, op, prescale_factor, postscale_factor, process_set)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        grad = allreduce(
            grad_output.contiguous(),
            op=ctx.op,
            prescale_factor=ctx.prescale_factor,
            postscale_factor=ctx.postscale_factor,
            process_set=ctx.process_set,
        )
        return grad, None, None, None, None


def allreduce(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: Any = Compression.none,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Average (or ``op``) ``tensor`` over the processes; returns a new tensor.

    Differentiable: the gradient flows back through an allreduce of the same op.
    ``compression`` (``Compression.fp16``) sends floating-point tensors as float16.
    """
    op = op_of(op, average)
    if getattr(compression, "scheme", ""):
        raise ValueError(
            f"Compression.{compression.name} codes DistributedOptimizer's gradient buckets; "
            "hvd.allreduce takes Compression.none or Compression.fp16"
        )
    if compression is Compression.none and not tensor.requires_grad:
        return _allreduce_now(tensor, None, op, prescale_factor, postscale_factor, process_set)
    compressed, ctx = compression.compress(tensor)
    if compressed.requires_grad:
        reduced = _Allreduce.apply(compressed, op, prescale_factor, postscale_factor, process_set)
    else:
        reduced = _allreduce_now(
            compressed, None, op, prescale_factor, postscale_factor, process_set
        )
    return compression.decompress(reduced, ctx)


def allreduce_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """``allreduce`` in place; returns ``tensor``."""
    op = op_of(op, average)
    return _allreduce_now(tensor, tensor, op, prescale_factor, postscale_factor, process_set)


def _grouped_async(
    tensors: Sequence[torch.Tensor],
    outputs: list[torch.Tensor],
    op: int,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
) -> int:
    """One allreduce per dtype over the tensors' elements fused into one buffer."""
    comm = target(process_set)
    post = postscale_factor / comm.size if op == Average else postscale_factor
    requests, fused = [], []
    for dtype in dict.fromkeys(t.dtype for t in tensors):
        members = [i for i, t in enumerate(tensors) if t.dtype == dtype]
        buffer = np.concatenate([array(tensors[i]).ravel() for i in members])
        scale(buffer, prescale_factor)
        requests.append(wrap(lambda b=buffer: hc.iallreduce(b, MPI_OPS[op], out=b, comm=comm)))
        fused.append((members, buffer))

    def finish() -> list[torch.Tensor]:
        for members, buffer in fused:
            scale(buffer, post)
            at = 0
            for i in members:
                n = outputs[i].numel()
                array(outputs[i]).ravel()[...] = buffer[at : at + n]
                at += n
        return outputs

    return new_handle(requests, finish)


def grouped_allreduce_async(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start one fused allreduce of every tensor of ``tensors``; results are new tensors."""
    op = op_of(op, average)
    outputs = [torch.empty_like(t) for t in tensors]
    return _grouped_async(tensors, outputs, op, prescale_factor, postscale_factor, process_set)


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """``grouped_allreduce_async`` in place."""
    op = op_of(op, average)
    return _grouped_async(
        tensors, list(tensors), op, prescale_factor, postscale_factor, process_set
    )


def grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    compression: Any = Compression.none,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """Allreduce every tensor of ``tensors`` in one fused call; returns new tensors."""
    op = op_of(op, average)
    pairs = [compression.compress(t) for t in tensors]
    outputs = synchronize(
        _grouped_async(
            [p[0] for p in pairs],
            [torch.empty_like(p[0]) for p in pairs],
            op,
            prescale_factor,
            postscale_factor,
            process_set,
        )
    )
    return [compression.decompress(t, p[1]) for t, p in zip(outputs, pairs, strict=True)]


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """``grouped_allreduce`` in place; returns ``tensors``."""
    return synchronize(
        grouped_allreduce_async_(
            tensors, average, name, op, prescale_factor, postscale_factor, process_set
        )
    )


# ---- allgather -----------------------------------------------------------------------


def allgather_async(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> int:
    """Start concatenating every process's ``tensor`` along the first dimension.

    The first dimension may differ between processes; the others may not.
    """
    comm = target(process_set)
    a = array(tensor, ANY)
    if tensor.dim() == 0:
        raise ValueError("allgather needs a tensor of at least one dimension")
    row = int(np.prod(tensor.shape[1:], dtype=np.int64))
    shapes = wrap(lambda: hc.allgather(np.array([tensor.shape[0], row], np.int64), comm=comm))
    if len(set(shapes[:, 1].tolist())) != 1:
        raise HorovodInternalError(
            f"allgather: the processes' tensors differ beyond the first dimension "
            f"(elements per row {shapes[:, 1].tolist()})"
        )
    rows = shapes[:, 0]
    out = torch.empty((int(rows.sum()), *tensor.shape[1:]), dtype=tensor.dtype)
    flat = array(out, ANY).reshape(-1)
    counts = (rows * row).tolist()
    request = wrap(lambda: hc.iallgather(a.reshape(-1), out=flat, counts=counts, comm=comm))
    return new_handle([request], lambda: out)


class _Allgather(torch.autograd.Function):
    """Allgather with autograd: the gradient is this process's rows of the summed gradient."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, process_set: ProcessSet) -> torch.Tensor:  # type: ignore[override]
        ctx.rows, ctx.process_set = tensor.shape[0], process_set
        return synchronize(allgather_async(tensor, process_set=process_set))

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        summed = allreduce(grad_output.contiguous(), op=Sum, process_set=ctx.process_set)
        rows = allgather(torch.tensor([ctx.rows], dtype=torch.int64), process_set=ctx.process_set)
        start = int(rows[: ctx.process_set.rank()].sum())
        return summed.narrow(0, start, ctx.rows), None


def allgather(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> torch.Tensor:
    """Every process's ``tensor`` concatenated along the first dimension (differentiable)."""
    if tensor.requires_grad:
        return _Allgather.apply(tensor, process_set)
    return synchronize(allgather_async(tensor, name, process_set))


# ---- broadcast -----------------------------------------------------------------------


def _broadcast_async(
    tensor: torch.Tensor, output: torch.Tensor, root_rank: int, process_set: ProcessSet
) -> int:
    comm = target(process_set)
    root = set_rank(process_set, root_rank)
    if output is not tensor:
        with torch.no_grad():  # the result of a collective, not of the copy
            output.copy_(tensor)
    a = array(output, ANY)
    request = wrap(lambda: hc.ibcast(a, root, comm=comm))
    return new_handle([request], lambda: output)


def broadcast_async(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start broadcasting ``root_rank``'s ``tensor``; the result is a new tensor."""
    array(tensor, ANY)
    return _broadcast_async(tensor, torch.empty_like(tensor), root_rank, process_set)


def broadcast_async_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """``broadcast_async`` in place: ``tensor`` receives the root's values."""
    return _broadcast_async(tensor, tensor, root_rank, process_set)


class _Broadcast(torch.autograd.Function):
    """Broadcast with autograd: the root gets the sum of every process's gradient."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, tensor: torch.Tensor, root_rank: int, process_set: ProcessSet
    ) -> torch.Tensor:
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, process_set=process_set))

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        grad = allreduce(grad_output.contiguous(), op=Sum, process_set=ctx.process_set)
        if rank() != ctx.root_rank:
            grad = grad * 0
        return grad, None, None


def broadcast(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """``root_rank``'s ``tensor`` on every process, as a new tensor (differentiable)."""
    if tensor.requires_grad:
        return _Broadcast.apply(tensor, root_rank, process_set)
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


def broadcast_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """``broadcast`` in place; returns ``tensor``."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ---- alltoall ------------------------------------------------------------------------


def alltoall_async(
    tensor: torch.Tensor,
    splits: Any = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start sending ``splits[i]`` rows (first dimension) of ``tensor`` to process i.

    Without ``splits`` the first dimension is split evenly. The result is
    ``(output, received_splits)``.
    """
    comm = target(process_set)
    a = array(tensor, ANY)
    p = comm.size
    if splits is None:
        if tensor.dim() == 0 or tensor.shape[0] % p:
            raise ValueError(
                f"alltoall without splits needs a first dimension divisible by {p} processes"
            )
        rows = [tensor.shape[0] // p] * p
    else:
        rows = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
        if len(rows) != p or min(rows) < 0 or sum(rows) != tensor.shape[0]:
            raise ValueError(
                f"alltoall: splits must be {p} non-negative row counts adding up to "
                f"{tensor.shape[0]}, not {rows}"
            )
    row = int(np.prod(tensor.shape[1:], dtype=np.int64))
    request = wrap(lambda: hc.ialltoallv(a.reshape(-1), [r * row for r in rows], comm=comm))

    def finish() -> tuple[torch.Tensor, torch.Tensor]:
        received, counts = request.wait()
        got = [c // row if row else 0 for c in counts]
        out = torch.from_numpy(np.ascontiguousarray(received)).reshape(sum(got), *tensor.shape[1:])
        return out, torch.tensor(got, dtype=torch.int32)

    return new_handle([request], finish)


def alltoall(
    tensor: torch.Tensor,
    splits: Any = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """``alltoall_async`` and wait: ``output``, or ``(output, received_splits)`` with splits."""
    output, received = synchronize(alltoall_async(tensor, splits, name, process_set))
    return output if splits is None else (output, received)


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Wait until every process of ``process_set`` has called it."""
    comm = target(process_set)
    wrap(lambda: hc.barrier(comm=comm))
