"""Host tensors as numpy views and Horovod's argument rules, for ``mpi_ops``."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from mpi4py import MPI

from ...collectives.errors import CollectiveError
from .. import basics
from ..basics import Adasum, Average, HorovodInternalError, Max, Min, ProcessSet, Product, Sum

__all__ = ["MPI_OPS", "NUMERIC", "ANY", "array", "op_of", "scale", "target", "set_rank", "wrap"]

MPI_OPS = {Sum: MPI.SUM, Average: MPI.SUM, Min: MPI.MIN, Max: MPI.MAX, Product: MPI.PROD}
NUMERIC = {
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.float32,
    torch.float64,
}
ANY = NUMERIC | {torch.bool}
_NUMERIC_NP = frozenset(torch.empty(0, dtype=t).numpy().dtype for t in NUMERIC)


def array(tensor: Any, allowed: set[torch.dtype] = NUMERIC) -> np.ndarray:
    """A numpy view of a host tensor (writes through), or Horovod's ValueError."""
    if allowed is NUMERIC and type(tensor) is torch.Tensor and not tensor.requires_grad:
        try:  # the common case in one call: a contiguous host tensor of a numeric type
            a = tensor.numpy()
        except TypeError:  # a device tensor, or a type numpy has not
            pass
        else:
            if a.dtype in _NUMERIC_NP and a.flags.c_contiguous:
                return a
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"expected a torch.Tensor, not {type(tensor).__name__}")
    if tensor.dtype not in allowed:
        raise ValueError(f"Tensor type {tensor.type()} is not supported.")
    if not tensor.is_cpu:
        raise ValueError(
            f"hpcpar.horovod reduces tensors on the host: move {tensor.device} tensors "
            "with .cpu() first"
        )
    if not tensor.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")
    return tensor.detach().numpy()


def op_of(op: int | None, average: bool | None) -> int:
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
    if op not in MPI_OPS:
        raise ValueError(f"unknown reduction op {op!r}: Average, Sum, Min, Max or Product")
    return op


_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)


def scale(a: np.ndarray, factor: float) -> None:
    """``a *= factor`` as Horovod scales: in double (float for float16), then cast back."""
    if factor == 1.0:
        return
    dtype = a.dtype
    if dtype is _F64 or (dtype is _F32 and math.frexp(factor)[0] == 0.5):
        np.multiply(a, factor, out=a)  # the same result (a power of two scales exactly)
        return
    wide = np.float32 if a.dtype == np.float16 else np.float64
    # computed in ``wide``, cast back on the way out (integers: toward zero), no temporaries
    np.multiply(a, wide(factor), out=a, dtype=wide, casting="unsafe")


def target(process_set: ProcessSet) -> Any:
    """The hierarchy hpcpar's collectives run on for ``process_set`` (ValueError if none)."""
    found = process_set.hierarchy
    return found if found is not None else basics.set_comm(process_set)


def set_rank(process_set: ProcessSet, root_rank: int) -> int:
    """The set's own rank of Horovod rank ``root_rank``."""
    ranks = process_set.ranks or []
    if root_rank not in ranks:
        raise ValueError(f"root_rank {root_rank} is not in process set {ranks}")
    return ranks.index(root_rank)


def wrap(call: Callable[[], Any]) -> Any:
    """``call()``, a failing collective raised as Horovod's ``HorovodInternalError``."""
    try:
        return call()
    except CollectiveError as exc:
        raise HorovodInternalError(str(exc)) from None
