"""Horovod's PyTorch API over hpcpar's collectives: ``import hpcpar.horovod.torch as hvd``.

Names, signatures, defaults and semantics are Horovod's (``horovod.torch``, release
0.28): the same script runs with its import line changed. Tensors live on the host;
a collective runs as hpcpar's (the cost model's algorithm on the node hierarchy, the
mismatch guard, the flight record and the watchdog). An ``*_async`` call returns an
integer handle for ``poll``/``synchronize``, as in Horovod. What is not here yet is
listed in docs/horovod.md.
"""

from __future__ import annotations

import itertools
import pickle
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from mpi4py import MPI

from ... import collectives as hc
from ...collectives.errors import CollectiveError
from .. import basics
from ..basics import (
    Adasum,
    Average,
    HorovodInternalError,
    Max,
    Min,
    ProcessSet,
    Product,
    Sum,
    add_process_set,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    global_process_set,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    remove_process_set,
    rocm_built,
    shutdown,
    size,
)

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "HorovodInternalError",
    "Max",
    "Min",
    "Product",
    "ProcessSet",
    "Sum",
    "add_process_set",
    "allgather",
    "allgather_async",
    "allgather_object",
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
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "init",
    "is_homogeneous",
    "is_initialized",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "rank",
    "reducescatter",
    "reducescatter_async",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "synchronize",
]

_MPI_OPS = {Sum: MPI.SUM, Average: MPI.SUM, Min: MPI.MIN, Max: MPI.MAX, Product: MPI.PROD}
_NUMERIC = {
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.float32,
    torch.float64,
}
_ANY = _NUMERIC | {torch.bool}


# ---- compression ---------------------------------------------------------------------


class _NoneCompressor:
    """No compression."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """The tensor as it is."""
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """The tensor as it is."""
        return tensor


class _FP16Compressor:
    """Floating-point tensors sent as float16 and restored to their dtype."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """``tensor`` as float16 when it is floating point; its dtype as the context."""
        dtype = tensor.dtype
        return (tensor.type(torch.float16) if dtype.is_floating_point else tensor), dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Back to the original dtype."""
        return tensor.type(ctx) if ctx.is_floating_point else tensor


class Compression:
    """Optional compression of the tensors an allreduce sends: ``none`` or ``fp16``."""

    none = _NoneCompressor
    fp16 = _FP16Compressor


# ---- handles -------------------------------------------------------------------------


class _Pending:
    """A started collective: hpcpar's requests and what makes the result of them."""

    def __init__(self, requests: list[Any], finish: Callable[[], Any]) -> None:
        self.requests, self.finish = requests, finish


_HANDLES: dict[int, _Pending] = {}
_NEXT = itertools.count(1)


def _handle(requests: list[Any], finish: Callable[[], Any]) -> int:
    handle = next(_NEXT)
    _HANDLES[handle] = _Pending(requests, finish)
    return handle


def poll(handle: int) -> bool:
    """Whether the collective of ``handle`` is done (``synchronize`` then returns at once)."""
    pending = _HANDLES.get(handle)
    if pending is None:
        return True
    try:
        return all(r.test() for r in pending.requests)
    except CollectiveError as exc:
        raise HorovodInternalError(str(exc)) from None


def synchronize(handle: int) -> Any:
    """Wait for the collective of ``handle`` and return its output (None if unknown)."""
    pending = _HANDLES.pop(handle, None)
    if pending is None:
        return None
    try:
        for request in pending.requests:
            request.wait()
    except CollectiveError as exc:
        raise HorovodInternalError(str(exc)) from None
    return pending.finish()


# ---- helpers -------------------------------------------------------------------------


def _array(tensor: Any, allowed: set[torch.dtype] = _NUMERIC) -> np.ndarray:
    """A numpy view of a host tensor (writes through), or Horovod's ValueError."""
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"expected a torch.Tensor, not {type(tensor).__name__}")
    if tensor.dtype not in allowed:
        raise ValueError(f"Tensor type {tensor.type()} is not supported.")
    if tensor.device.type != "cpu":
        raise ValueError(
            f"hpcpar.horovod reduces tensors on the host: move {tensor.device} tensors "
            "with .cpu() first"
        )
    if not tensor.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")
    return tensor.detach().numpy()


def _op(op: int | None, average: bool | None) -> int:
    """Horovod's ``op``/``average`` rule (``average`` deprecated; both is an error)."""
    if op is not None:
        if average is not None:
            raise ValueError(
                "The op parameter supersedes average. Please provide only one of them."
            )
    elif average is not None:
        warnings.warn(
            "Parameter `average` has been replaced with `op` and will be removed in v1.0",
            DeprecationWarning,
            stacklevel=3,
        )
        op = Average if average else Sum
    else:
        op = Average
    if op == Adasum:
        raise NotImplementedError("hpcpar.horovod does not support Adasum; use Average or Sum")
    if op not in _MPI_OPS:
        raise ValueError(f"unknown reduction op {op!r}: Average, Sum, Min, Max or Product")
    return op


def _scale(a: np.ndarray, factor: float) -> None:
    """``a *= factor`` as Horovod scales: in double (float for float16), then cast back."""
    if factor == 1.0:
        return
    wide = np.float32 if a.dtype == np.float16 else np.float64
    a[...] = (a.astype(wide) * wide(factor)).astype(a.dtype)  # integers: toward zero


def _comm(process_set: ProcessSet) -> Any:
    return basics.set_comm(process_set)


def _set_rank(process_set: ProcessSet, root_rank: int) -> int:
    """The set's own rank of Horovod rank ``root_rank``."""
    ranks = process_set.ranks or []
    if root_rank not in ranks:
        raise ValueError(f"root_rank {root_rank} is not in process set {ranks}")
    return ranks.index(root_rank)


def _wrap(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except CollectiveError as exc:
        raise HorovodInternalError(str(exc)) from None


# ---- allreduce -----------------------------------------------------------------------


def _allreduce_async(
    tensor: torch.Tensor,
    output: torch.Tensor,
    op: int,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
) -> int:
    comm = _comm(process_set)
    if output is not tensor:
        with torch.no_grad():  # the result of a collective, not of the copy
            output.copy_(tensor)
    a = _array(output)
    _scale(a, prescale_factor)
    post = postscale_factor / comm.size if op == Average else postscale_factor
    request = _wrap(lambda: hc.iallreduce(a, _MPI_OPS[op], out=a, comm=comm))

    def finish() -> torch.Tensor:
        _scale(a, post)
        return output

    return _handle([request], finish)


def _allreduce_now(
    tensor: torch.Tensor,
    output: torch.Tensor,
    op: int,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
) -> torch.Tensor:
    """The blocking allreduce (hpcpar's fast path for small calls); returns ``output``."""
    comm = _comm(process_set)
    a = _array(tensor)
    out = a if output is tensor else _array(output)
    if prescale_factor != 1.0:
        if out is not a:
            np.copyto(out, a)
        _scale(out, prescale_factor)
        a = out
    _wrap(lambda: hc.allreduce(a, _MPI_OPS[op], out=out, comm=comm))
    _scale(out, postscale_factor / comm.size if op == Average else postscale_factor)
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
    op = _op(op, average)
    _array(tensor)
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
    op = _op(op, average)
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
        out = torch.empty_like(tensor)
        return _allreduce_now(tensor, out, op, prescale_factor, postscale_factor, process_set)

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
    op = _op(op, average)
    compressed, ctx = compression.compress(tensor)
    if compressed.requires_grad:
        reduced = _Allreduce.apply(compressed, op, prescale_factor, postscale_factor, process_set)
    else:
        out = torch.empty_like(compressed)
        reduced = _allreduce_now(
            compressed, out, op, prescale_factor, postscale_factor, process_set
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
    op = _op(op, average)
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
    comm = _comm(process_set)
    post = postscale_factor / comm.size if op == Average else postscale_factor
    requests, fused = [], []
    for dtype in dict.fromkeys(t.dtype for t in tensors):
        members = [i for i, t in enumerate(tensors) if t.dtype == dtype]
        buffer = np.concatenate([_array(tensors[i]).ravel() for i in members])
        _scale(buffer, prescale_factor)
        requests.append(_wrap(lambda b=buffer: hc.iallreduce(b, _MPI_OPS[op], out=b, comm=comm)))
        fused.append((members, buffer))

    def finish() -> list[torch.Tensor]:
        for members, buffer in fused:
            _scale(buffer, post)
            at = 0
            for i in members:
                n = outputs[i].numel()
                _array(outputs[i]).ravel()[...] = buffer[at : at + n]
                at += n
        return outputs

    return _handle(requests, finish)


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
    op = _op(op, average)
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
    op = _op(op, average)
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
    op = _op(op, average)
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
    comm = _comm(process_set)
    a = _array(tensor, _ANY)
    if tensor.dim() == 0:
        raise ValueError("allgather needs a tensor of at least one dimension")
    row = int(np.prod(tensor.shape[1:], dtype=np.int64))
    shapes = _wrap(lambda: hc.allgather(np.array([tensor.shape[0], row], np.int64), comm=comm))
    if len(set(shapes[:, 1].tolist())) != 1:
        raise HorovodInternalError(
            f"allgather: the processes' tensors differ beyond the first dimension "
            f"(elements per row {shapes[:, 1].tolist()})"
        )
    rows = shapes[:, 0]
    out = torch.empty((int(rows.sum()), *tensor.shape[1:]), dtype=tensor.dtype)
    flat = _array(out, _ANY).reshape(-1)
    counts = (rows * row).tolist()
    request = _wrap(lambda: hc.iallgather(a.reshape(-1), out=flat, counts=counts, comm=comm))
    return _handle([request], lambda: out)


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
    comm = _comm(process_set)
    root = _set_rank(process_set, root_rank)
    if output is not tensor:
        with torch.no_grad():  # the result of a collective, not of the copy
            output.copy_(tensor)
    a = _array(output, _ANY)
    request = _wrap(lambda: hc.ibcast(a, root, comm=comm))
    return _handle([request], lambda: output)


def broadcast_async(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start broadcasting ``root_rank``'s ``tensor``; the result is a new tensor."""
    _array(tensor, _ANY)
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


# ---- alltoall and reducescatter ------------------------------------------------------


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
    comm = _comm(process_set)
    a = _array(tensor, _ANY)
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
    request = _wrap(lambda: hc.ialltoallv(a.reshape(-1), [r * row for r in rows], comm=comm))

    def finish() -> tuple[torch.Tensor, torch.Tensor]:
        received, counts = request.wait()
        got = [c // row if row else 0 for c in counts]
        out = torch.from_numpy(np.ascontiguousarray(received)).reshape(sum(got), *tensor.shape[1:])
        return out, torch.tensor(got, dtype=torch.int32)

    return _handle([request], finish)


def alltoall(
    tensor: torch.Tensor,
    splits: Any = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """``alltoall_async`` and wait: ``output``, or ``(output, received_splits)`` with splits."""
    output, received = synchronize(alltoall_async(tensor, splits, name, process_set))
    return output if splits is None else (output, received)


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
    op = _op(op, None)
    comm = _comm(process_set)
    p, me = comm.size, comm.rank
    if tensor.dim() == 0:
        raise ValueError("reducescatter needs a tensor of at least one dimension")
    n = tensor.shape[0]
    rows = [n // p + (1 if i < n % p else 0) for i in range(p)]
    row = int(np.prod(tensor.shape[1:], dtype=np.int64))
    x = _array(tensor).reshape(-1).copy()
    _scale(x, prescale_factor)
    out = torch.empty((rows[me], *tensor.shape[1:]), dtype=tensor.dtype)
    flat = _array(out).reshape(-1)
    post = postscale_factor / p if op == Average else postscale_factor
    request = _wrap(
        lambda: hc.ireduce_scatter(
            x, _MPI_OPS[op], counts=[r * row for r in rows], out=flat, comm=comm
        )
    )

    def finish() -> torch.Tensor:
        _scale(flat, post)
        return out

    return _handle([request], finish)


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
    compressed, ctx = compression.compress(tensor)
    out = synchronize(
        reducescatter_async(compressed, name, op, process_set, prescale_factor, postscale_factor)
    )
    return compression.decompress(out, ctx)


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Wait until every process of ``process_set`` has called it."""
    comm = _comm(process_set)
    _wrap(lambda: hc.barrier(comm=comm))


# ---- parameters and objects ----------------------------------------------------------


def broadcast_parameters(params: Any, root_rank: int) -> None:
    """Broadcast a ``state_dict()``, ``named_parameters()`` or ``parameters()`` in place."""
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, list):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError(f"invalid params of type: {type(params)}")
    handles = [broadcast_async_(p, root_rank, name) for name, p in items]
    for handle in handles:
        synchronize(handle)


def broadcast_optimizer_state(optimizer: Any, root_rank: int, model: Any = None) -> None:
    """Give every process ``root_rank``'s optimizer state and hyper-parameters.

    The root's ``state_dict()`` as it is (an optimizer that has not stepped yet has no
    per-parameter state to send; Horovod instead first takes a step with zero gradients
    on every process). ``model`` is accepted for Horovod's signature.
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state = broadcast_object(optimizer.state_dict(), root_rank)
    if rank() != root_rank:
        optimizer.load_state_dict(state)


def broadcast_object(
    obj: Any,
    root_rank: int = 0,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """``root_rank``'s object on every process (pickled by the program, in memory)."""
    if rank() == root_rank:
        data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
        length = torch.tensor([data.size], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    broadcast_(length, root_rank, process_set=process_set)
    buf = (
        torch.from_numpy(data.copy())
        if rank() == root_rank
        else torch.empty(int(length), dtype=torch.uint8)
    )
    broadcast_(buf, root_rank, process_set=process_set)
    return obj if rank() == root_rank else pickle.loads(buf.numpy().tobytes())


def allgather_object(
    obj: Any, name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[Any]:
    """Every process's object, in rank order (pickled by the program, in memory)."""
    data = torch.from_numpy(np.frombuffer(pickle.dumps(obj), dtype=np.uint8).copy())
    lengths = allgather(torch.tensor([data.numel()], dtype=torch.int64), process_set=process_set)
    gathered = allgather(data, process_set=process_set).numpy()
    edges = np.concatenate([[0], np.cumsum(lengths.numpy())])
    return [pickle.loads(gathered[edges[i] : edges[i + 1]].tobytes()) for i in range(len(lengths))]
