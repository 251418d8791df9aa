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
from dataclasses import dataclass
from typing import Any

import numpy as np

from .ir import Item, Strided, packed_size
from .threads import PARALLEL_BYTES, copy_threads, local_ranks, parallel_copy

__all__ = [
    "Kernel",
    "flatten",
    "copy_kernels",
    "assignment",
    "copy_op",
    "run_copies",
    "replay",
    "user_view",
]

_WORDS = {8: np.uint64, 4: np.uint32, 2: np.uint16, 1: np.uint8}


@dataclass(frozen=True)
class Kernel:
    """One strided copy: ``size`` bytes per block over ``dims`` (count, src stride, dst stride)."""

    src: int
    dst: int
    size: int
    dims: tuple[tuple[int, int, int], ...]

    @functools.cached_property
    def empty(self) -> bool:
        """True when the kernel moves no bytes."""
        return self.size == 0 or any(c == 0 for c, _, _ in self.dims)

    @functools.cached_property
    def words(self) -> tuple[int, ...]:
        """Word sizes, widest first, that divide the block, the strides and both offsets.

        Whether the buffers' addresses allow a word is checked on the views themselves
        (numpy's ``aligned`` flag), which is cheaper than reading the addresses.
        """
        fits = [
            w
            for w in (8, 4, 2)
            if not (self.size % w or self.src % w or self.dst % w)
            and all(s % w == 0 and d % w == 0 for _, s, d in self.dims)
        ]
        return (*fits, 1)

    @functools.cached_property
    def shapes(self) -> dict[int, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
        """Per word size: (shape, source strides, packed strides) of the two views."""
        counts = tuple(c for c, _, _ in self.dims)
        return {
            w: (
                (*counts, self.size // w),
                (*(s for _, s, _ in self.dims), w),
                (*(d for _, _, d in self.dims), w),
            )
            for w in self.words
        }


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


def device_word(k: Kernel, src_addr: int, dst_addr: int) -> int:
    """The widest word of ``k.words`` that both base addresses allow (device buffers)."""
    return next(w for w in k.words if src_addr % w == 0 and dst_addr % w == 0)


def _kernel_views(
    k: Kernel, unpacked: np.ndarray, packed: np.ndarray, origin: int
) -> tuple[np.ndarray, np.ndarray]:
    """The (user, packed) strided views of one kernel, in the widest word both allow.

    ``numpy.ndarray(buffer=...)`` refuses any view that would reach outside its buffer.
    """
    for w in k.words:
        shape, _, dst_strides = k.shapes[w]
        user = _user_side(k, w, unpacked, origin)
        flat = np.ndarray(shape, _WORDS[w], buffer=packed, offset=k.dst, strides=dst_strides)
        if w == 1 or (user.flags.aligned and flat.flags.aligned):
            break
    return user, flat


def _user_side(k: Kernel, w: int, area: np.ndarray, origin: int) -> np.ndarray:
    """Kernel ``k``'s blocks in ``area`` as ``w``-byte words: its counts, then the words."""
    shape, src_strides, _ = k.shapes[w]
    return np.ndarray(shape, _WORDS[w], buffer=area, offset=origin + k.src, strides=src_strides)


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
        once = keys is None  # buffers used once: nothing is replayed
        ops = [
            copy_op(flat, user, once=once) if pack else copy_op(user, flat, once=once)
            for user, flat in _views(kernels, unpacked, packed, origin, keys)
        ]
    run_copies(ops)
    return ops


def run_copies(ops: list[tuple[Any, np.ndarray, np.ndarray]]) -> None:
    """Run copies that ``copy_kernels`` or ``copy_op`` prepared."""
    for copy, dst, src in ops:
        copy(dst, src)


def replay(ops: list[tuple[Any, np.ndarray, np.ndarray]]) -> Any:
    """A function of no arguments that runs ``ops`` again, with as little Python as possible.

    One contiguous copy becomes a memoryview slice assignment (a memmove), cheaper than
    ``np.copyto`` by its argument parsing, which on small faces is a sizeable share of
    the time. Other numpy copies become the destination's item assignment, the same
    copy without that parsing.
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
    if copy is np.copyto and dst.dtype == src.dtype and dst.shape == src.shape:
        return functools.partial(dst.__setitem__, Ellipsis, src)
    return functools.partial(copy, dst, src)


def assignment(again: Any) -> tuple[Any, Any]:
    """``(dst, src)`` where ``replay`` made ``again`` as ``dst[...] = src``, else Nones.

    A caller that writes ``dst[...] = src`` itself saves the call through the partial,
    which on small copies is a measurable share.
    """
    args = getattr(again, "args", ())
    if len(args) == 2 and args[0] is Ellipsis:
        return again.func.__self__, args[1]
    return None, None


def copy_op(
    dst: np.ndarray, src: np.ndarray, *, once: bool = False
) -> tuple[Any, np.ndarray, np.ndarray]:
    """How to copy ``src`` into ``dst`` (same shape): ``(copy, dst', src')``.

    ``once``: the copy runs once (a new buffer), so choosing it must cost little: rows
    move as void elements (``_as_rows``) only where that saves more than building
    those views costs.

    Four copies, chosen by measurement (``hpcpar bench datatypes`` runs every case
    against MPICH's Pack and numpy's copy):

    - numpy's copy (memcpy per row): below ``COMPILED_BYTES`` (there with each
      contiguous row as one void element, ``_as_rows``), and for rows of
      ``SHORT_ROW_BYTES`` and more while the copy fits in the cache;
    - a compiled look-ahead loop (``loops.ahead``) for ``AHEAD_WORDS`` or more single
      words a cache line or more apart on one side (z faces), below the streaming size;
    - a compiled loop with ordinary stores (``loops.py``) for shorter rows from
      ``COMPILED_BYTES``: numpy's per-row cost dominates there;
    - a compiled loop with streaming (non-temporal) stores from ``STREAMING_BYTES``,
      an eighth of this rank's share of the last-level cache (4 MiB alone, 1 MiB for
      each of four ranks): it neither reads the destination line first nor evicts
      the source. Where the copy would have stayed in the cache it costs a little,
      where it would not, ordinary stores cost up to twice as much: hence the low
      threshold, shared between the ranks of a node. Not into runs shorter than
      ``STREAM_RUN_BYTES`` (partial cache lines), and not for rows of
      ``SHORT_ROW_BYTES`` to ``LONG_ROW_BYTES`` that fill under 3/4 of their stride in
      the source, where reading dominates and numpy's memcpy reads faster; dense rows
      (the interior) and rows of 64 KiB and more stream.

    From ``PARALLEL_BYTES`` the copy is split over this rank's share of the cores,
    the calling thread taking one part (below it, handing work to a thread costs more
    than it saves). Elements of 1, 2, 4
    or 8 bytes in 1 to 4 dimensions can take a loop; others, and copies where both
    sides are one contiguous block (memcpy), go to numpy.
    """
    copy: Any = np.copyto
    if dst.dtype.fields is not None and dst.dtype == src.dtype and not dst.dtype.hasobject:
        # records: their bytes as they are (numpy copies field by field and leaves the
        # destination's padding as it was: uninitialised bytes in a new buffer)
        record = _void(dst.dtype.itemsize)
        dst, src = dst.view(record), src.view(record)
    if dst.dtype.itemsize < 8 and dst.nbytes >= WIDEN_BYTES:
        dst, src = _widest(dst, src)
    while dst.ndim > 1 and dst.shape[-1] == 1:  # single words: a 1-D strided copy
        dst, src = dst[..., 0], src[..., 0]
    nbytes, item = dst.nbytes, dst.dtype.itemsize
    sparse = _sparse_words(dst, src) if item in _WORDS and dst.size >= AHEAD_WORDS else None
    if sparse is not None and nbytes < _streaming_from():
        word = _WORDS[item]
        dst, src, copy = dst.view(word), src.view(word), sparse
    elif nbytes >= COMPILED_BYTES and item in _WORDS and dst.ndim >= 1:
        row = dst.shape[-1] * item if dst.ndim > 1 else item  # 1-D: single words apart
        run = row if dst.strides[-1] == item else item  # bytes dst takes at a time
        if dst.flags.c_contiguous:
            run = nbytes
        streaming = nbytes >= _streaming_from() and run >= STREAM_RUN_BYTES
        if streaming and SHORT_ROW_BYTES <= row < LONG_ROW_BYTES and _sparse_rows(src):
            streaming = False  # reading dominates: numpy's memcpy per row reads faster
        loop = _compiled(dst.ndim, streaming) if streaming or row < SHORT_ROW_BYTES else None
        if run == nbytes and src.flags.c_contiguous:
            loop = None  # one block: numpy's memcpy
        if loop is not None:
            word = _WORDS[item]
            dst, src, copy = dst.view(word), src.view(word), loop
    worth_rows = not once or (nbytes >= ONCE_ROWS_BYTES and dst.shape[-1] * item < SHORT_ROW_BYTES)
    if copy is np.copyto and nbytes < COMPILED_BYTES and worth_rows:
        dst, src = _as_rows(dst, src)
    if nbytes >= PARALLEL_BYTES and dst.ndim >= 1 and dst.shape[0] >= 2 and copy_threads() > 1:
        return functools.partial(parallel_copy, copy=copy), dst, src
    return copy, dst, src


def _widest(dst: np.ndarray, src: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of small elements as the widest words they divide into (views' own dtypes).

    Rows of 8 bytes copied as bytes run several times slower than as one uint64: plans
    of byte views (or of 2- and 4-byte elements) would otherwise copy element by element.
    """
    item = dst.dtype.itemsize
    if dst.ndim == 0 or dst.dtype.hasobject or dst.dtype != src.dtype:
        return dst, src
    if dst.strides[-1] != item or src.strides[-1] != item:
        return dst, src
    row = dst.shape[-1] * item
    for w in (8, 4, 2):
        if w > item and row % w == 0:
            wide_dst, wide_src = dst.view(_WORDS[w]), src.view(_WORDS[w])
            if wide_dst.flags.aligned and wide_src.flags.aligned:
                return wide_dst, wide_src
    return dst, src


def _sparse_words(dst: np.ndarray, src: np.ndarray) -> Any:
    """The look-ahead loop (``loops.ahead``) for single words a cache line or more apart.

    Loads ahead on the sparse side: ``src`` when packing, ``dst`` when unpacking. None
    for copies in more than two dimensions, where neither side is sparse, or without numba.
    """
    if dst.ndim > 2 or dst.ndim == 0:
        return None
    if abs(src.strides[-1]) >= _LINE:
        gather = True
    elif abs(dst.strides[-1]) >= _LINE:
        gather = False
    else:
        return None
    return numba_loop("ahead", dst.ndim, gather)


def _as_rows(dst: np.ndarray, src: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Contiguous rows of both sides as single elements of one opaque (void) type.

    numpy then moves each row with one fixed-size copy instead of running its inner
    loop over the row's elements: much faster for short rows in the cache, a little for
    rows of 1 KiB, the same from 4 KiB. Only below ``COMPILED_BYTES``: numpy holds the
    GIL while it copies void elements, so split across threads they would run one at a
    time.
    """
    item = dst.dtype.itemsize
    if (
        dst.ndim < 2
        or dst.shape[-1] < 2
        or dst.dtype != src.dtype
        or dst.dtype.hasobject
        or dst.strides[-1] != item
        or src.strides[-1] != item
    ):
        return dst, src
    row = _void(dst.shape[-1] * item)
    return dst.view(row)[..., 0], src.view(row)[..., 0]


@functools.lru_cache(maxsize=64)
def _void(nbytes: int) -> np.dtype:
    """The opaque type of ``nbytes`` bytes (cached: building one costs more than a copy)."""
    return np.dtype((np.void, nbytes))


def _sparse_rows(src: np.ndarray) -> bool:
    """True where ``src`` has contiguous rows that fill less than 3/4 of their stride."""
    if src.ndim < 2 or src.strides[-1] != src.dtype.itemsize:
        return False
    row = src.shape[-1] * src.dtype.itemsize
    return 4 * row < 3 * abs(src.strides[-2])


def _last_level_cache() -> int:
    """Bytes of the largest CPU cache (Linux sysfs), 32 MiB where it cannot be read."""
    import glob

    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            with open(path) as f:
                text = f.read().strip().upper()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=32 << 20)


WIDEN_BYTES = 4096  # copies this large of 1-4 byte elements move as wider words
COMPILED_BYTES = 1 << 20  # strided copies this large may run a compiled loop ...
SHORT_ROW_BYTES = 256  # ... when their rows are this short (in the cache) ...
STREAM_RUN_BYTES = 256  # ... or stream into runs this long from STREAMING_BYTES
LONG_ROW_BYTES = 1 << 16  # (rows shorter than this, read sparsely, go to numpy)


def streaming_bytes() -> int:
    """An eighth of this rank's share of the last-level cache, at least ``COMPILED_BYTES``."""
    return max(COMPILED_BYTES, _last_level_cache() // (8 * local_ranks()))


# Copies this large stream (into long runs): ``streaming_bytes()``, read on first use
# rather than at import (it reads sysfs).
STREAMING_BYTES: int | None = None


def _streaming_from() -> int:
    global STREAMING_BYTES
    if STREAMING_BYTES is None:
        STREAMING_BYTES = streaming_bytes()
    return STREAMING_BYTES


_loops: dict[tuple[Any, ...], Any] = {}
# Single words a cache line or more apart, this many and more, take the look-ahead loop
# (``loops.ahead``); fewer lines than this mostly stay in the L2 cache, where it gains
# nothing (the z faces of 64^3 and 96^3 blocks in ``hpcpar bench datatypes --n``)
AHEAD_WORDS = 8192
# A copy made once moves rows shorter than SHORT_ROW_BYTES as void elements from this
# size: below it building the views costs more than they save
ONCE_ROWS_BYTES = 32 << 10
_LINE = 64


def _compiled(ndim: int, streaming: bool) -> Any:
    """The compiled strided copy for ``ndim`` dimensions (``loops.loop``), or None.

    None also where numba is missing: numpy's copy is right, only slower.
    """
    return numba_loop("loop", ndim, streaming)


def numba_loop(maker: str, *args: Any) -> Any:
    """``loops.<maker>(*args)``, made once; None where numba (``loops``) cannot load."""
    key = (maker, *args)
    if key not in _loops:
        try:
            from . import loops
        except ImportError:
            _loops[key] = None
        else:
            _loops[key] = getattr(loops, maker)(*args)
    return _loops[key]


def user_view(k: Kernel, area: np.ndarray, keep: Any, origin: int) -> np.ndarray:
    """The user's side of kernel ``k`` in ``area`` (origin at byte ``origin``), as a view.

    Its shape is the kernel's counts and the block's words, so its C-order copy is the
    packed bytes. Kept for the last ``_RECENT_MAX`` buffers (``keep``: the caller's own
    object, held while its entry is; a read-only and a writable ``area`` are separate).
    """
    key = (id(k), id(keep), origin, area.size, area.flags.writeable)
    hit = _USER_VIEWS.get(key)
    if hit is not None and hit[0] is k and hit[1] is keep:  # (inline: on every new buffer)
        return hit[2]
    for w in k.words:
        view = _user_side(k, w, area, origin)
        if w == 1 or view.flags.aligned:
            break
    _remember(_USER_VIEWS, key, (k, keep), view)
    return view


_USER_VIEWS: dict[tuple[Any, ...], tuple[Any, Any, np.ndarray]] = {}


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
    if keys is None or keys[1] is None:
        return [_kernel_views(k, unpacked, packed, origin) for k in kernels if not k.empty]
    key = (id(kernels), id(keys[0]), id(keys[1]), origin, unpacked.size, packed.size)
    hit = _RECENT.get(key)
    if hit is not None and hit[0] is kernels and hit[1] is keys[0] and hit[2] is keys[1]:
        return hit[3]
    views = [_kernel_views(k, unpacked, packed, origin) for k in kernels if not k.empty]
    _remember(_RECENT, key, (kernels, *keys), views)
    return views


def _remember(
    cache: dict[Any, tuple[Any, ...]], key: Any, owners: tuple[Any, ...], value: Any
) -> None:
    """Keep ``value`` for ``owners`` (held, so their ids stay theirs): the last ``_RECENT_MAX``."""
    if len(cache) >= _RECENT_MAX:
        cache.pop(next(iter(cache)))
    cache[key] = (*owners, value)
