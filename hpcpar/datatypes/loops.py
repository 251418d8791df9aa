"""Compiled strided copies (numba), with ordinary or non-temporal (streaming) stores.

Imported only when a copy is large enough to use them; numba compiles each loop once
per dimension count and word type and caches it on disk.

The streaming loops write every word with a non-temporal store (LLVM's ``!nontemporal``
hint: ``movnti`` on x86-64, ``stnp`` on AArch64) and end with a fence, so the stores
are visible to any thread that synchronises with this one afterwards. A streaming
store does not read the destination line first and does not evict the source from
the cache: on copies larger than the cache this moves a third less memory traffic.
On copies that fit in the cache it is slower, since the next reader has to fetch the
data from memory; ``kernels.copy_op`` decides.

The look-ahead loops copy single words that each lie in a cache line of their own (the
z face of a 3-D block): each step also loads the word some steps later on the
sparse side, so more of those lines are on their way at once than the core's own
reordering reaches; how far ahead (or whether at all) is measured once per process
(``distance``). A 1-D scatter runs as rows of ``ROW_WORDS`` (``_scatter1``), which
the compiler turns into a faster loop than one long one. ``hpcpar bench datatypes``
(the z face cases) measures both against numpy's copy and MPICH's Pack and Unpack.
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic
from numpy.lib.stride_tricks import as_strided

__all__ = ["DISTANCES", "ROW_WORDS", "ahead", "blocks", "distance", "loop"]


@intrinsic
def _store_streaming(typingctx: Any, array: Any, index: Any, value: Any) -> Any:
    """``array[index] = value`` with a non-temporal store (index: a tuple, no wrap-around)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        array_type = signature.args[0]
        data = context.make_array(array_type)(context, builder, args[0])
        indices = cgutils.unpack_tuple(builder, args[1], count=array_type.ndim)
        pointer = cgutils.get_item_pointer(
            context, builder, array_type, data, indices, wraparound=False, boundscheck=False
        )
        store = builder.store(args[2], pointer)
        hint = builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)])
        store.set_metadata("nontemporal", hint)
        return context.get_dummy_value()

    return types.void(array, index, value), codegen


@intrinsic
def _fence(typingctx: Any) -> Any:
    """A full memory fence: orders the streaming stores before anything after it."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.void(), codegen


_JIT = njit(nogil=True, cache=True)


@_JIT
def _stream1(dst: Any, src: Any) -> None:
    for i in range(dst.shape[0]):
        _store_streaming(dst, (i,), src[i])
    _fence()


@_JIT
def _copy1(dst: Any, src: Any) -> None:
    for i in range(dst.shape[0]):
        dst[i] = src[i]


@_JIT
def _copy2(dst: Any, src: Any) -> None:
    for i in range(dst.shape[0]):
        for j in range(dst.shape[1]):
            dst[i, j] = src[i, j]


@_JIT
def _stream2(dst: Any, src: Any) -> None:
    for i in range(dst.shape[0]):
        for j in range(dst.shape[1]):
            _store_streaming(dst, (i, j), src[i, j])
    _fence()


@_JIT
def _copy3(dst: Any, src: Any) -> None:
    for i in range(dst.shape[0]):
        for j in range(dst.shape[1]):
            for k in range(dst.shape[2]):
                dst[i, j, k] = src[i, j, k]


@_JIT
def _stream3(dst: Any, src: Any) -> None:
    for i in range(dst.shape[0]):
        for j in range(dst.shape[1]):
            for k in range(dst.shape[2]):
                _store_streaming(dst, (i, j, k), src[i, j, k])
    _fence()


@_JIT
def _copy4(dst: Any, src: Any) -> None:
    for i in range(dst.shape[0]):
        for j in range(dst.shape[1]):
            for k in range(dst.shape[2]):
                for m in range(dst.shape[3]):
                    dst[i, j, k, m] = src[i, j, k, m]


@_JIT
def _stream4(dst: Any, src: Any) -> None:
    for i in range(dst.shape[0]):
        for j in range(dst.shape[1]):
            for k in range(dst.shape[2]):
                for m in range(dst.shape[3]):
                    _store_streaming(dst, (i, j, k, m), src[i, j, k, m])
    _fence()


DISTANCES = (0, 4, 8, 16, 32)  # words a look-ahead loop may load ahead (0: none)
PROBE_WORDS = 128 * 128  # the probe: a 128^3 block's z face ...
PROBE_STRIDE = 128  # ... one word every 1 KiB


# The distance is an argument, not the constant: compiled with it known, the 1-D loop
# ran slower.


@_JIT
def _ahead1(dst: Any, src: Any, look: Any, ahead: int) -> Any:
    n = dst.shape[0]
    seen = 0  # returned, so that the loads ahead are not optimised away
    for i in range(max(0, n - ahead)):
        seen |= look[i + ahead]
        dst[i] = src[i]
    for i in range(max(0, n - ahead), n):
        dst[i] = src[i]
    return seen


@_JIT
def _ahead2(dst: Any, src: Any, look: Any, ahead: int) -> Any:
    rows, columns = dst.shape
    seen = 0
    ahead_row, ahead_column = divmod(ahead, columns)  # where the load ahead is
    for i in range(rows):
        for j in range(columns):
            if ahead_row < rows:
                seen |= look[ahead_row, ahead_column]
                ahead_column += 1
                if ahead_column == columns:
                    ahead_column = 0
                    ahead_row += 1
            dst[i, j] = src[i, j]
    return seen


@functools.cache
def distance(gather: bool) -> int:
    """How many words ahead the sparse side is loaded on this machine (0: not at all).

    Whether loads ahead help depends on the core's prefetchers: on some CPUs they
    halve a z face's copy, on others the plain loop is faster. So each process measures
    once, on first use, a gather (``gather``) or a scatter of a 128^3 block's z face in
    a 16 MiB scratch array, with every distance in ``DISTANCES``, and keeps the
    fastest (the median of seven rounds, the candidates interleaved).
    """
    sparse = np.ones(PROBE_WORDS * PROBE_STRIDE, dtype=np.uint64)
    sparse = as_strided(sparse, (PROBE_WORDS,), (PROBE_STRIDE * 8,))
    dense = np.ones(PROBE_WORDS, dtype=np.uint64)
    dst, src = (dense, sparse) if gather else (sparse, dense)
    runs = {d: _probe_copy(d, gather) for d in DISTANCES}
    times: dict[int, list[float]] = {d: [] for d in DISTANCES}
    for copy in runs.values():
        copy(dst, src)  # compiled (or loaded from numba's cache) outside the timing
    for _ in range(7):
        for d, copy in runs.items():
            start = time.perf_counter()
            copy(dst, src)
            times[d].append(time.perf_counter() - start)
    return min(DISTANCES, key=lambda d: (statistics.median(times[d]), d))


def _probe_copy(d: int, gather: bool) -> Any:
    if d == 0:
        return _copy1
    if gather:
        return lambda dst, src: _ahead1(dst, src, src, d)
    return lambda dst, src: _scatter1(dst, src, d)


ROW_WORDS = 64  # the row length ``_scatter1`` cuts a 1-D scatter into


@_JIT
def _scatter1(dst: Any, src: Any, ahead: int) -> Any:
    """``_ahead2`` over rows of ``ROW_WORDS`` of the 1-D ``dst``, looking ahead in ``dst``.

    The same stores in the same order as ``_ahead1`` (the tail after the last whole row
    without loads ahead), run as a 2-D loop:
    unpacking the z face of an N^3 block (standalone, us, 1-D / 2-D; MPICH's Unpack
    128-129 at 128): N = 128 110 / 91, 160 170 / 161, 192 238 / 212, 96 37-42 / 35-45.
    Packing gains nothing that way (128: 102 / 109), so gathers stay 1-D.
    """
    n = dst.shape[0]
    rows = n // ROW_WORDS
    step = dst.strides[0]
    rows_dst = as_strided(dst, (rows, ROW_WORDS), (ROW_WORDS * step, step))
    rows_src = as_strided(src, (rows, ROW_WORDS), (ROW_WORDS * src.strides[0], src.strides[0]))
    seen = _ahead2(rows_dst, rows_src, rows_dst, ahead)
    for i in range(rows * ROW_WORDS, n):
        dst[i] = src[i]
    return seen


def ahead(ndim: int, gather: bool) -> Any:
    """The look-ahead ``copy(dst, src)`` for ``ndim`` (1 or 2) dimensions, or None.

    It loads ``distance(gather)`` words ahead in ``src`` (gather, packing) or in ``dst``
    (scatter, unpacking); None where that distance is 0 (the ordinary copy is faster
    here) or for other dimension counts.
    """
    loop = {1: _ahead1, 2: _ahead2}.get(ndim)
    if loop is None:
        return None
    d = distance(gather)
    if d == 0:
        return None
    if ndim == 1 and not gather:
        return lambda dst, src: _scatter1(dst, src, d)

    def ahead_copy(dst: Any, src: Any) -> Any:
        return loop(dst, src, src, d) if gather else loop(dst, src, dst, d)

    return ahead_copy


_LOOPS = {
    (1, False): _copy1,
    (1, True): _stream1,
    (2, False): _copy2,
    (2, True): _stream2,
    (3, False): _copy3,
    (3, True): _stream3,
    (4, False): _copy4,
    (4, True): _stream4,
}


def loop(ndim: int, streaming: bool) -> Any:
    """The compiled ``copy(dst, src)`` for ``ndim``-dimensional arrays, or None."""
    return _LOOPS.get((ndim, streaming))


@_JIT
def _mixed(gather: bool, at: Any, length: Any, count: int, step: int, dst: Any, src: Any) -> None:
    k = 0
    for e in range(count):
        base = e * step
        for b in range(at.shape[0]):
            u = base + at[b]
            if gather:
                for i in range(length[b]):
                    dst[k + i] = src[u + i]
            else:
                for i in range(length[b]):
                    dst[u + i] = src[k + i]
            k += length[b]


@_JIT
def _even(gather: bool, at: Any, n: int, count: int, step: int, dst: Any, src: Any) -> None:
    k = 0
    for e in range(count):
        base = e * step
        if n == 1:  # single words: no inner loop (several times faster on scattered words)
            if gather:
                for b in range(at.shape[0]):
                    dst[k + b] = src[base + at[b]]
            else:
                for b in range(at.shape[0]):
                    dst[base + at[b]] = src[k + b]
            k += at.shape[0]
            continue
        for b in range(at.shape[0]):
            u = base + at[b]
            if gather:
                for i in range(n):
                    dst[k + i] = src[u + i]
            else:
                for i in range(n):
                    dst[u + i] = src[k + i]
            k += n


def blocks(gather: bool, even: bool) -> Any:
    """The block-list copy (``blocks.py``): ``copy(at, length, count, step, dst, src)``.

    Block ``b`` of element ``e`` lies ``e * step + at[b]`` words into the user's side;
    the packed side is the blocks in order. ``even``: ``length`` is one number, every
    block's length in words, else ``length[b]`` is block ``b``'s. Gather packs (``src``
    the user's), scatter unpacks; the branch on it stays outside the loops' hot paths
    (as fast as a loop of each kind).
    """
    return functools.partial(_even if even else _mixed, gather)
