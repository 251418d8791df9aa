"""Plans of numpy views: packing and unpacking through the view itself.

A view's plan (``plan(a[::2, 1:-1])``) copies between the view and its packed bytes
seen in the view's own shape and dtype, one ``kernels.copy_op`` copy, instead of
through the plan's kernels. Copies made once (a new buffer, a received message) choose
cheaply and remember, per layout, when numpy's own copy was the choice.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from .errors import DatatypeError
from .kernels import WIDEN_BYTES, copy_op, run_copies


class Plan(Protocol):
    """What these copies need of a view's plan (``plan.Plan``)."""

    view_shape: tuple[int, ...]
    view_dtype: np.dtype
    size: int
    _memo: dict[Any, Any]  # per-layout choices, kept with the plan's derived data


__all__ = ["pack_view", "pack_view_anew", "same_view", "unpack_view", "unpack_view_once"]

_BYTE = np.dtype(np.uint8)


def same_view(p: Plan, arr: np.ndarray) -> None:
    """Refuse an array of another shape or dtype than the view the plan was made of."""
    if arr.shape != p.view_shape or arr.dtype != p.view_dtype:
        raise DatatypeError(
            f"this plan is for arrays of shape {p.view_shape} and dtype {p.view_dtype}"
        )


def pack_view_anew(p: Plan, src: np.ndarray) -> np.ndarray:
    """``pack(src)`` of a view plan into a new buffer (what ``hpcpar.send`` does)."""
    dtype = src.dtype
    if dtype is not p.view_dtype or src.shape != p.view_shape:
        same_view(p, src)
    if (src.nbytes < WIDEN_BYTES and dtype.fields is None) or p._memo.get(("plain", src.strides)):
        # numpy's own copy: small, or where ``copy_op`` chose it for these strides before
        # (choosing again costs more than the small copy itself); not for records,
        # whose padding numpy's copy would leave uninitialised
        return src.copy().view(_BYTE) if src.ndim == 1 else np.frombuffer(src.copy(), _BYTE)
    typed = np.empty(src.shape, src.dtype)
    _copy_once(p, typed, src, src)
    return typed.reshape(-1).view(np.uint8)


def unpack_view_once(p: Plan, typed: np.ndarray, dst: np.ndarray) -> None:
    """Copy ``typed`` (contiguous, the view's shape and dtype) into the view ``dst``."""
    if p._memo.get(("plain", dst.strides)):
        dst[...] = typed
    else:
        _copy_once(p, dst, typed, dst)


def _copy_once(p: Plan, dst: np.ndarray, src: np.ndarray, view: np.ndarray) -> None:
    """Run ``copy_op(dst, src, once=True)``; remember if it was numpy's own copy.

    Kept per ``view``'s strides: the choice is the same either way between a view and
    its packed form, so packs and receives share it.
    """
    copy, to, source = copy_op(dst, src, once=True)
    copy(to, source)
    if view.dtype.itemsize >= 8:  # (narrower elements: the choice depends on alignment)
        p._memo["plain", view.strides] = copy is np.copyto and to is dst and source is src


def pack_view(p: Plan, src: np.ndarray, packed: np.ndarray) -> list[Any]:
    """Pack the view ``src`` into ``packed``; the copy made (``kernels.replay`` repeats it)."""
    same_view(p, src)
    ops = [copy_op(packed[: p.size].view(src.dtype).reshape(src.shape), src)]
    run_copies(ops)
    return ops


def unpack_view(p: Plan, packed: np.ndarray, dst: np.ndarray, once: bool) -> list[Any]:
    """Unpack ``packed`` into the view ``dst`` (``once``: a buffer used once); the copy made."""
    same_view(p, dst)
    if not dst.flags.writeable:
        raise DatatypeError("dst is read-only")
    flat = packed[: p.size]
    if np.may_share_memory(dst, flat) and np.shares_memory(dst, flat):
        raise DatatypeError("dst and buf overlap; unpack into separate memory")
    ops = [copy_op(dst, flat.view(dst.dtype).reshape(dst.shape), once=once)]
    run_copies(ops)
    return ops
