"""Executing a layout: flatten it into strided copy kernels and run them with numpy.

Every leaf of the layout, inside however many repeats, is one copy between two
strided arrays (source in the user's buffer, destination in the packed buffer). Each
kernel moves the widest word (8, 4, 2 or 1 bytes) that divides its block, its strides
and both addresses, since copying 8-byte blocks byte by byte runs several times slower.
The strided views are built with ``numpy.ndarray(buffer=...)``, which checks that every
byte they reach lies inside the buffer: a plan can never touch memory outside it.
"""

from __future__ import annotations

import functools
import itertools
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..runtime.env import usable_cores
from .ir import Item, Strided, packed_size

__all__ = [
    "Kernel",
    "flatten",
    "copy_kernels",
    "copy_op",
    "run_copies",
    "replay",
    "strided_copy",
    "copy_array",
]

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
    kernels: list[Kernel],
    unpacked: np.ndarray,
    packed: np.ndarray,
    origin: int,
    pack: bool,
    keys: tuple[Any, Any] | None = None,
) -> list[tuple[Any, np.ndarray, np.ndarray]]:
    """Run the kernels between ``unpacked`` (origin at byte ``origin``) and ``packed``.

    Both are 1-D uint8 arrays; ``pack`` copies into ``packed``, otherwise out of it.

    Returns:
        The copies it made as ``(copy, dst, src)``: ``run_copies`` repeats them (the
        caller keeps the buffers alive while it holds them).
    """
    if len(kernels) == 1 and not kernels[0].dims:  # one contiguous block: a plain slice copy
        k = kernels[0]
        user = unpacked[origin + k.src : origin + k.src + k.size]
        flat = packed[k.dst : k.dst + k.size]
        ops = [(np.copyto, flat, user) if pack else (np.copyto, user, flat)]
    else:
        ops = [copy_op(flat, user) if pack else copy_op(user, flat)
               for user, flat in _views(kernels, unpacked, packed, origin, keys)]  # fmt: skip
    run_copies(ops)
    return ops


def run_copies(ops: list[tuple[Any, np.ndarray, np.ndarray]]) -> None:
    """Run copies that ``copy_kernels`` or ``copy_op`` prepared."""
    for copy, dst, src in ops:
        copy(dst, src)


def replay(ops: list[tuple[Any, np.ndarray, np.ndarray]]) -> Any:
    """A function of no arguments that runs ``ops`` again, with as little Python as possible.

    One contiguous copy becomes a memoryview slice assignment (a memmove), about half a
    microsecond cheaper than ``np.copyto``: on a 128 KiB face that is a sixth of the time.
    """
    if len(ops) != 1:
        return functools.partial(run_copies, ops)
    copy, dst, src = ops[0]
    if (
        copy is np.copyto
        and dst.ndim == src.ndim == 1
        and dst.dtype == src.dtype == np.uint8
        and dst.size == src.size
        and dst.flags.c_contiguous
        and src.flags.c_contiguous
        and dst.size < PARALLEL_BYTES
    ):
        return functools.partial(memoryview(dst).__setitem__, slice(None), memoryview(src))
    return functools.partial(copy, dst, src)


def strided_copy(dst: np.ndarray, src: np.ndarray) -> None:
    """``np.copyto(dst, src)`` for arrays of one shape, faster when they are large."""
    copy, d, s = copy_op(dst, src)
    copy(d, s)


def copy_op(dst: np.ndarray, src: np.ndarray) -> tuple[Any, np.ndarray, np.ndarray]:
    """How to copy ``src`` into ``dst`` (same shape): ``(copy, dst', src')``.

    From ``COMPILED_BYTES`` a compiled loop (elements of 1, 2, 4 or 8 bytes, 2 to 4
    dimensions, rows of at most ``LOOP_ROW_BYTES``: numpy copies longer rows with
    memcpy, faster than the loop; others go to numpy), from ``PARALLEL_BYTES`` split
    over the cores.
    """
    copy: Any = np.copyto
    while dst.ndim > 1 and dst.shape[-1] == 1:  # single words: numpy's 1-D strided loop
        dst, src = dst[..., 0], src[..., 0]
    if (
        dst.nbytes >= COMPILED_BYTES
        and dst.dtype.itemsize in _WORDS
        and dst.shape[-1] * dst.dtype.itemsize <= LOOP_ROW_BYTES
    ):
        loop = _compiled(dst)
        if loop is not None:
            word = _WORDS[dst.dtype.itemsize]
            dst, src, copy = dst.view(word), src.view(word), loop
    if dst.nbytes >= PARALLEL_BYTES and dst.ndim > 1 and dst.shape[0] >= 2 and _threads() > 1:
        return functools.partial(_parallel_copy, copy=copy), dst, src
    return copy, dst, src


PARALLEL_BYTES = 1 << 20  # copies this large are split across threads (both copies drop the GIL)
COMPILED_BYTES = 1 << 20  # strided copies this large run a compiled loop (numba) ...
LOOP_ROW_BYTES = 1 << 14  # ... when their rows are this short (longer rows: memcpy wins)
_pool: list[Any] = []
_loops: dict[int, Any] = {}


def _compiled(dst: np.ndarray) -> Any:
    """A compiled strided copy for arrays of ``dst.ndim`` dimensions, or None.

    numpy's copy pays a per-row cost that a compiled loop does not: on rows of a few
    hundred words (the interior of a 3-D block, 16 MB) the loop runs about 1.4x faster
    single threaded, and it scales over threads where numpy's does not. Below about
    1 MiB numpy is faster (calling the loop costs microseconds, and numpy copies rows
    that sit in cache with memcpy). Compiled once per dimension count and word type
    (cached on disk by numba).
    """
    if not 2 <= dst.ndim <= 4:
        return None
    if dst.ndim not in _loops:
        try:
            _loops[dst.ndim] = _build(dst.ndim)
        except ImportError:  # numba missing: numpy's copy is right, only slower
            _loops[dst.ndim] = None
    return _loops[dst.ndim]


def _build(ndim: int) -> Any:
    from numba import njit

    if ndim == 2:

        def loop2(dst: Any, src: Any) -> None:
            for i in range(dst.shape[0]):
                for j in range(dst.shape[1]):
                    dst[i, j] = src[i, j]

        return njit(nogil=True, cache=True)(loop2)
    if ndim == 3:

        def loop3(dst: Any, src: Any) -> None:
            for i in range(dst.shape[0]):
                for j in range(dst.shape[1]):
                    for k in range(dst.shape[2]):
                        dst[i, j, k] = src[i, j, k]

        return njit(nogil=True, cache=True)(loop3)

    def loop4(dst: Any, src: Any) -> None:
        for i in range(dst.shape[0]):
            for j in range(dst.shape[1]):
                for k in range(dst.shape[2]):
                    for m in range(dst.shape[3]):
                        dst[i, j, k, m] = src[i, j, k, m]

    return njit(nogil=True, cache=True)(loop4)


_LOCAL_RANKS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_LOCAL_SIZE")
_thread_count: list[int] = []


def _threads() -> int:
    """Threads for one large copy: this rank's share of the node's cores (1 to 8).

    ``HPCPAR_COPY_THREADS`` sets it; otherwise the cores this process may run on,
    divided by the ranks the launcher says share its node (Hydra's ``MPI_LOCALNRANKS``,
    Open MPI's ``OMPI_COMM_WORLD_LOCAL_SIZE``), so ranks that share cores do not each
    start a thread per core. Read once.
    """
    if not _thread_count:
        wanted = os.environ.get("HPCPAR_COPY_THREADS", "")
        if wanted.isdigit() and int(wanted) >= 1:
            count = int(wanted)
        else:
            local = next((int(v) for v in map(os.environ.get, _LOCAL_RANKS)
                          if v and v.isdigit() and int(v) >= 1), 1)  # fmt: skip
            count = max(1, usable_cores() // local)
        _thread_count.append(min(count, 8))
    return _thread_count[0]


def copy_array(dst: np.ndarray, src: np.ndarray) -> None:
    """``np.copyto(dst, src)``; contiguous copies of 1 MiB and more split over the cores.

    One thread copies at about half the machine's memory bandwidth; the checkpoint
    snapshot, which the caller waits for, uses every core.
    """
    if (
        dst.nbytes < PARALLEL_BYTES
        or _threads() < 2
        or dst.shape != src.shape
        or dst.dtype != src.dtype
        or dst.dtype.hasobject
        or not (dst.flags.c_contiguous and src.flags.c_contiguous)
    ):
        np.copyto(dst, src)
        return
    flat_dst, flat_src = dst.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8)
    cuts = [min(flat_dst.size, (flat_dst.size * i // _threads()) // 64 * 64)
            for i in range(_threads())] + [flat_dst.size]  # fmt: skip
    _on_threads(np.copyto, flat_dst, flat_src, cuts)


def _parallel_copy(dst: np.ndarray, src: np.ndarray, copy: Any = np.copyto) -> None:
    """Copy in slices of the outermost dimension, one per core."""
    bounds = np.linspace(0, dst.shape[0], min(_threads(), dst.shape[0]) + 1).astype(int)
    _on_threads(copy, dst, src, bounds)


def _on_threads(copy: Any, dst: np.ndarray, src: np.ndarray, cuts: Any) -> None:
    """``copy(dst[a:b], src[a:b])`` for consecutive cuts, each on a pool thread."""
    if not _pool:
        from concurrent.futures import ThreadPoolExecutor

        _pool.append(ThreadPoolExecutor(_threads(), thread_name_prefix="hpcpar-pack"))
    jobs = [_pool[0].submit(copy, dst[a:b], src[a:b])
            for a, b in itertools.pairwise(cuts) if b > a]  # fmt: skip
    for job in jobs:
        job.result()


# The strided views of recent (kernels, buffers) pairs: building them costs more than a
# small copy. Each entry holds the buffers, so their memory (and addresses) stay valid.
_RECENT: dict[tuple[int, ...], tuple[Any, ...]] = {}
_RECENT_MAX = 16


def _views(
    kernels: list[Kernel],
    unpacked: np.ndarray,
    packed: np.ndarray,
    origin: int,
    keys: tuple[Any, Any] | None,
) -> list[Any]:
    """The views for these buffers; reused when the same user objects come again.

    ``keys`` are the caller's own objects (the user's array and packed buffer): while an
    entry holds them, their ids cannot be reused by other objects.
    """
    key = None
    if keys is not None and keys[1] is not None:
        key = (id(kernels), id(keys[0]), id(keys[1]), origin, unpacked.size, packed.size)
        hit = _RECENT.get(key)
        if hit is not None and hit[0] is kernels and hit[1] is keys[0] and hit[2] is keys[1]:
            return hit[3]
    src_addr = unpacked.__array_interface__["data"][0]
    dst_addr = packed.__array_interface__["data"][0]
    views = []
    for k in kernels:
        if k.size == 0 or any(c == 0 for c, _, _ in k.dims):
            continue
        w = _word(k, src_addr + origin, dst_addr)
        user = _view(unpacked, origin + k.src, k, w, tuple(s for _, s, _ in k.dims))
        flat = _view(packed, k.dst, k, w, tuple(d for _, _, d in k.dims))
        views.append((user, flat))
    if key is not None:
        if len(_RECENT) >= _RECENT_MAX:
            _RECENT.pop(next(iter(_RECENT)))
        _RECENT[key] = (kernels, keys[0], keys[1], views)  # type: ignore[index]
    return views
