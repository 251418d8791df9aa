"""MPI datatypes to plan layouts, by walking their constructors (``Datatype.decode``).

Every combiner MPI defines is walked structurally except DARRAY (and any combiner a
library adds), which is read by probing: MPI packs an index pattern and the packed
bytes say which source byte went where. Every derived handle that decoding returns is
freed (MPI counts them as references).
"""

from __future__ import annotations

from math import prod
from typing import Any

import numpy as np
from mpi4py import MPI

from .errors import DatatypeError
from .ir import Item, Strided, canonical, replicate, shift

__all__ = ["decode_layout", "probe_layout"]


def _free(datatypes: list[Any]) -> None:
    for dt in datatypes:
        if dt != MPI.DATATYPE_NULL and not dt.is_predefined:
            dt.Free()


def _extent(dt: MPI.Datatype) -> int:
    return dt.Get_extent()[1]


def _subarray(old: MPI.Datatype, p: dict[str, Any]) -> tuple[Item, ...]:
    e = _extent(old)
    sizes, subsizes, starts = list(p["sizes"]), list(p["subsizes"]), list(p["starts"])
    if p["order"] == MPI.ORDER_FORTRAN:
        sizes, subsizes, starts = sizes[::-1], subsizes[::-1], starts[::-1]
    strides = [e * prod(sizes[d + 1 :]) for d in range(len(sizes))]
    items = shift(decode_layout(old), sum(s * st for s, st in zip(starts, strides, strict=True)))
    for d in reversed(range(len(sizes))):
        items = replicate(items, subsizes[d], strides[d])
    return items


def _blocks(
    old_items: tuple[Item, ...], extent: int, lengths: list[int], displacements: list[int]
) -> tuple[Item, ...]:
    out: list[Item] = []
    (plain,) = old_items if len(old_items) == 1 else (None,)
    if isinstance(plain, Strided) and not plain.counts and plain.size == extent:
        # blocks of a dense type (named, contiguous): each block one plain block, made
        # directly (as replicate would, without its rewriting per block)
        start = plain.offset
        out = [
            Strided(start + d, n * extent) for n, d in zip(lengths, displacements, strict=True) if n
        ]
        return canonical(tuple(out))
    for length, displacement in zip(lengths, displacements, strict=True):
        out.extend(shift(replicate(old_items, length, extent), displacement))
    return canonical(tuple(out))


def decode_layout(dt: MPI.Datatype) -> tuple[Item, ...]:  # noqa: PLR0911 (one return per combiner)
    """The canonical layout of one element of ``dt`` (offsets from its origin)."""
    if dt == MPI.DATATYPE_NULL:
        raise DatatypeError("datatype is MPI.DATATYPE_NULL (freed or never created)")
    base, combiner, p = dt.decode()
    children = [base] if combiner != "STRUCT" else list(p["datatypes"])
    try:
        if combiner == "NAMED":
            size = dt.Get_size()
            return (Strided(0, size),) if size else ()
        if combiner in ("DUP", "RESIZED"):
            return decode_layout(base)
        old = decode_layout(base) if combiner != "STRUCT" else ()
        e = _extent(base) if combiner != "STRUCT" else 0
        if combiner == "CONTIGUOUS":
            return replicate(old, p["count"], e)
        if combiner in ("VECTOR", "HVECTOR"):
            stride = p["stride"] * (e if combiner == "VECTOR" else 1)
            return replicate(replicate(old, p["blocklength"], e), p["count"], stride)
        if combiner in ("INDEXED", "HINDEXED"):
            scale = e if combiner == "INDEXED" else 1
            return _blocks(old, e, list(p["blocklengths"]), [d * scale for d in p["displacements"]])
        if combiner in ("INDEXED_BLOCK", "HINDEXED_BLOCK"):
            scale = e if combiner == "INDEXED_BLOCK" else 1
            displacements = [d * scale for d in p["displacements"]]
            return _blocks(old, e, [p["blocklength"]] * len(displacements), displacements)
        if combiner == "STRUCT":
            out: list[Item] = []
            for length, displacement, child in zip(
                p["blocklengths"], p["displacements"], children, strict=True
            ):
                out.extend(
                    shift(replicate(decode_layout(child), length, _extent(child)), displacement)
                )
            return canonical(tuple(out))
        if combiner == "SUBARRAY":
            return _subarray(base, p)
        return probe_layout(dt)
    finally:
        _free(children)


def mpi_pack(dt: MPI.Datatype, area: np.ndarray, origin: int, count: int = 1) -> np.ndarray:
    """``count`` elements of ``dt`` packed by MPI from ``area`` (origin at byte ``origin``)."""
    extent = _extent(dt)
    if extent <= 0:
        raise DatatypeError(f"cannot pack a datatype of extent {extent} with MPI.Datatype.Pack")
    packed = np.empty(dt.Pack_size(count, MPI.COMM_SELF), dtype=np.uint8)
    used = dt.Pack(area[origin : origin + count * extent], packed, 0, MPI.COMM_SELF)
    return packed[:used]


def probe_layout(dt: MPI.Datatype) -> tuple[Item, ...]:
    """Read a layout from MPI itself: pack an index pattern and see where each byte came from."""
    true_lb, true_extent = dt.Get_true_extent()
    lb, extent = dt.Get_extent()
    if dt.Get_size() == 0:
        return ()
    origin = max(0, -true_lb, -lb)
    area = np.empty(origin + max(true_lb + true_extent, lb + extent, extent), dtype=np.uint8)
    index = np.arange(area.size, dtype=np.int64)
    where = None
    for k in range((area.size.bit_length() + 7) // 8):
        area[:] = (index >> (8 * k)) & 0xFF
        byte = mpi_pack(dt, area, origin).astype(np.int64) << (8 * k)
        where = byte if where is None else where + byte
    offsets = where - origin  # type: ignore[operator]
    breaks = np.flatnonzero(np.diff(offsets) != 1) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [offsets.size]])
    return canonical(
        tuple(Strided(int(offsets[a]), int(b - a)) for a, b in zip(starts, ends, strict=True))
    )
