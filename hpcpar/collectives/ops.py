"""Reduction operations: MPI ops, numpy ufuncs and user functions, applied to whole arrays."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

from .errors import CollectiveError

__all__ = ["ReduceOp", "resolve_op", "make_op", "OpError"]


class OpError(CollectiveError):
    """A reduction operation that cannot be used (unknown, or wrong for the dtype)."""


@dataclass(frozen=True)
class ReduceOp:
    """A reduction hpcpar can apply to whole segments.

    Attributes:
        name: For messages and ``explain``.
        combine: ``combine(a, b, out)`` stores ``a op b`` into ``out`` (``out`` may be
            ``a`` or ``b``); ``a`` always holds data of lower ranks than ``b``.
        commutative: Whether ``a op b == b op a``; only then may an algorithm reorder.
        mpi_op: The MPI library's own op, when there is one.
    """

    name: str
    combine: Callable[[np.ndarray, np.ndarray, np.ndarray], None]
    commutative: bool
    mpi_op: Any = None
    source: Any = None


def _logical(func: Callable[..., Any]) -> Callable[[np.ndarray, np.ndarray, np.ndarray], None]:
    # MPI's logical ops return 0/1 in the operand type, not bool.
    def combine(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        out[...] = func(a, b)

    return combine


def _ufunc(func: np.ufunc) -> Callable[[np.ndarray, np.ndarray, np.ndarray], None]:
    def combine(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        func(a, b, out=out)

    return combine


def _half_sum(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """float16 ``a + b`` into ``out``.

    With torch's vectorised kernel when the program has loaded torch (numpy's float16
    arithmetic converts one element at a time), else numpy's; the same sums either way.
    """
    torch = sys.modules.get("torch")
    if (
        torch is not None
        and a.flags.c_contiguous
        and b.flags.c_contiguous
        and out.flags.c_contiguous
        and a.flags.writeable
        and b.flags.writeable
        and out.flags.writeable
    ):
        t = torch.from_numpy
        torch.add(t(a.reshape(-1)), t(b.reshape(-1)), out=t(out.reshape(-1)))
    else:
        np.add(a, b, out=out)


_BITWISE = {"BAND", "BOR", "BXOR"}
_MPI_OPS: dict[str, tuple[Callable[..., Any], bool]] = {
    "SUM": (np.add, False),
    "PROD": (np.multiply, False),
    "MIN": (np.minimum, False),
    "MAX": (np.maximum, False),
    "LAND": (np.logical_and, True),
    "LOR": (np.logical_or, True),
    "LXOR": (np.logical_xor, True),
    "BAND": (np.bitwise_and, False),
    "BOR": (np.bitwise_or, False),
    "BXOR": (np.bitwise_xor, False),
}
_COMMUTATIVE_UFUNCS = {
    np.add,
    np.multiply,
    np.minimum,
    np.maximum,
    np.fmin,
    np.fmax,
    np.logical_and,
    np.logical_or,
    np.logical_xor,
    np.bitwise_and,
    np.bitwise_or,
    np.bitwise_xor,
}


def _mpi_name(op: MPI.Op) -> str | None:
    for name in _MPI_OPS:
        if op == getattr(MPI, name):
            return name
    return None


_cache: dict[tuple[Any, ...], ReduceOp] = {}


def resolve_op(op: Any, dtype: np.dtype, *, commutative: bool | None = None) -> ReduceOp:
    """Cached ``make_op``: the same op and dtype resolve once per process."""
    if isinstance(op, MPI.Op):
        key: tuple[Any, ...] = ("mpi", op.py2f(), dtype, commutative)
    else:
        key = ("obj", id(op), dtype, commutative)
    found = _cache.get(key)
    if found is None or (key[0] == "obj" and found.source is not op):
        found = make_op(op, dtype, commutative=commutative)
        _cache[key] = found
    return found


def make_op(op: Any, dtype: np.dtype, *, commutative: bool | None = None) -> ReduceOp:
    """Turn an ``op=`` argument into a ``ReduceOp`` for arrays of ``dtype``.

    Args:
        op: ``MPI.SUM`` and the other predefined MPI ops, a numpy ufunc taking two
            arrays (``np.maximum``), or a function ``f(a, b) -> array``.
        dtype: The element type it will reduce.
        commutative: Overrides the guess; functions are taken as non-commutative
            (and associative) unless told otherwise.

    Raises:
        OpError: unknown op, or an op that does not apply to ``dtype``.
    """
    dtype = np.dtype(dtype)
    if isinstance(op, MPI.Op):
        name = _mpi_name(op)
        if name is None:
            raise OpError(
                f"MPI op {op!r} is not supported; use SUM, PROD, MIN, MAX, LAND, LOR, "
                "LXOR, BAND, BOR, BXOR, a numpy ufunc or a function"
            )
        func, logical = _MPI_OPS[name]
        _check_dtype(name, dtype)
        combine = _logical(func) if logical else _ufunc(func)
        if name == "SUM" and dtype == np.float16:
            combine = _half_sum
        return ReduceOp(name, combine, True if commutative is None else commutative, op, op)
    if isinstance(op, np.ufunc):
        if op.nin != 2:
            raise OpError(f"numpy ufunc {op.__name__} takes {op.nin} input(s); a reduction needs 2")
        guess = op in _COMMUTATIVE_UFUNCS
        return ReduceOp(
            op.__name__, _ufunc(op), guess if commutative is None else commutative, None, op
        )
    if callable(op):
        name = getattr(op, "__name__", type(op).__name__)

        def combine(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
            out[...] = op(a, b)

        return ReduceOp(name, combine, bool(commutative), None, op)
    raise OpError(f"op must be an MPI op, a numpy ufunc or a function, not {type(op).__name__}")


def _check_dtype(name: str, dtype: np.dtype) -> None:
    kind = dtype.kind
    if dtype.fields is not None or kind in "OSUVMm":
        raise OpError(f"MPI.{name} does not apply to dtype {dtype}; pass a function as op")
    if name in _BITWISE and kind not in "biu":
        raise OpError(f"MPI.{name} needs an integer or bool dtype, not {dtype}")
    if name in ("MIN", "MAX") and kind == "c":
        raise OpError(f"MPI.{name} does not apply to complex dtype {dtype}")
