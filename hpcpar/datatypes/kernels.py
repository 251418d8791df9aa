"""Executing a layout: flatten it into strided copy kernels and run them with numpy.

Every leaf of the layout, inside however many repeats, is one copy between two
strided arrays (source in the user's buffer, destination in the packed buffer). Each
kernel moves the widest word (8, 4, 2 or 1 bytes) that divides its block, its strides
and both addresses, since copying 8-byte blocks byte by byte runs several times slower.
The strided views are built with ``numpy.ndarray(buffer=...)``, which checks that every
byte they reach lies inside the buffer: a plan can never touch memory outside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .ir import Item, Strided, packed_size

__all__ = ["Kernel", "flatten", "copy_kernels"]

_WORDS = {8: np.uint64, 4: np.uint32, 2: np.uint16, 1: np.uint8}


@dataclass(frozen=True)
class Kernel:
    """One strided copy: ``size`` bytes per block over ``dims`` (count, src stride, dst stride)."""

    src: int
    dst: int
    size: int
    dims: tuple[tuple[int, int, int], ...]


def flatten(
    items: tuple[Item, ...], outer: tuple[tuple[int, int, int], ...] = (), dst: int = 0
) -> list[Kernel]:
    """The copy kernels of a layout, destinations laid out in pack order."""
    out: list[Kernel] = []
    cursor = dst
    for item in items:
        if isinstance(item, Strided):
            inner = []
            packed = item.size
            for count, stride in reversed(list(zip(item.counts, item.strides, strict=True))):
                inner.append((count, stride, packed))
                packed *= count
            out.append(Kernel(item.offset, cursor, item.size, (*outer, *reversed(inner))))
        else:
            body = packed_size(item.body)
            out += flatten(item.body, (*outer, (item.count, item.stride, body)), cursor)
        cursor += item.nbytes
    return out


def _word(k: Kernel, src_addr: int, dst_addr: int) -> int:
    for w in (8, 4, 2):
        if k.size % w or (src_addr + k.src) % w or (dst_addr + k.dst) % w:
            continue
        if all(s % w == 0 and d % w == 0 for _, s, d in k.dims):
            return w
    return 1


def _view(buf: np.ndarray, offset: int, k: Kernel, w: int, strides: tuple[int, ...]) -> np.ndarray:
    shape = (*(c for c, _, _ in k.dims), k.size // w)
    return np.ndarray(shape, dtype=_WORDS[w], buffer=buf, offset=offset, strides=(*strides, w))


def copy_kernels(
    kernels: list[Kernel], unpacked: np.ndarray, packed: np.ndarray, origin: int, pack: bool
) -> None:
    """Run the kernels between ``unpacked`` (origin at byte ``origin``) and ``packed``.

    Both are 1-D uint8 arrays; ``pack`` copies into ``packed``, otherwise out of it.
    """
    src_addr = unpacked.__array_interface__["data"][0] + origin
    dst_addr = packed.__array_interface__["data"][0]
    for k in kernels:
        if k.size == 0 or any(c == 0 for c, _, _ in k.dims):
            continue
        w = _word(k, src_addr, dst_addr)
        user = _view(unpacked, origin + k.src, k, w, tuple(s for _, s, _ in k.dims))
        flat = _view(packed, k.dst, k, w, tuple(d for _, _, d in k.dims))
        if pack:
            np.copyto(flat, user)
        else:
            np.copyto(user, flat)
