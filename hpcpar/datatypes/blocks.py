"""Irregular layouts as one list of blocks, copied by one compiled loop.

A layout whose copy kernels are many and small (an indexed type with scattered
displacements, most of a struct's fields in a padded record, an unstructured mesh's
ghost cells) would take one numpy copy per kernel, and build the views each time a
buffer is new: far slower than MPICH's Pack on such layouts.

Here the element's blocks are listed once (their offsets in the user's buffer and
their lengths, in the widest word that divides every offset, length, the extent and
both buffers' addresses; adjacent blocks merged) and one loop copies them, element
after element (numba, ``loops.blocks``); where numba is missing, numpy's ``take`` and
``put`` at the index of every word. ``hpcpar bench datatypes`` (the indexed cases)
measures it against MPICH's Pack and numpy's ``take``. The packed side is
always sequential: blocks are listed in pack order.

The loop does not check bounds: ``block_op`` refuses buffers that do not hold every
byte the blocks reach (the plan checks them first, with a clear error).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .kernels import Kernel, numba_loop
from .threads import PARALLEL_BYTES, copy_threads, run_parts

__all__ = [
    "Blocks",
    "blocks_of",
    "block_op",
    "expand",
    "worth_blocks",
    "MANY_KERNELS",
    "SMALL_KERNEL_BYTES",
]

_WORDS = {8: np.uint64, 4: np.uint32, 2: np.uint16, 1: np.uint8}
# An element's kernels go through the block loop when there are this many or more ...
MANY_KERNELS = 8
# ... carrying fewer bytes than this each on average (larger ones: numpy's strided copy
# per kernel costs little next to the bytes it moves, and may use the threads)
SMALL_KERNEL_BYTES = 4096


@dataclass(frozen=True)
class Blocks:
    """An element's blocks in pack order: ``at[b]`` bytes from the origin, ``length[b]`` long."""

    at: np.ndarray
    length: np.ndarray
    lo: int  # lowest byte reached, from the origin
    hi: int  # one past the highest
    unit: int  # the widest word (8, 4, 2 or 1) dividing every offset and length
    size: int  # packed bytes
    _in_words: dict[tuple[int, int], tuple[np.ndarray, Any]] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )
    _ends: dict[int, np.ndarray] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )

    @functools.cached_property
    def even(self) -> tuple[np.ndarray, int]:
        """The blocks cut into pieces of one length (the lengths' greatest common divisor).

        Their offsets from the origin in bytes, and that length: the GPU kernel's form
        (one thread a word, the word's block found by division).
        """
        piece = int(np.gcd.reduce(self.length)) if self.length.size else 1
        return _cut(self.at, self.length, piece), piece

    def packed_ends(self, word: int) -> np.ndarray:
        """Packed ``word``-byte words before each block, then the total (cached)."""
        if word not in self._ends:
            self._ends[word] = np.concatenate(([0], np.cumsum(self.length // word)))
        return self._ends[word]

    def in_words(self, word: int, start: int) -> tuple[np.ndarray, Any]:
        """Offsets from byte ``start`` in ``word``-byte words, and the lengths in words.

        The lengths as one number when they are all the same (cached per word and start).
        """
        key = (word, start)
        known = self._in_words.get(key)
        if known is None:
            at, length = (self.at - start) // word, self.length // word
            if at.size and at.max() < 2**31 and length.max() < 2**31:
                at, length = at.astype(np.int32), length.astype(np.int32)  # half the reads
            if at.size and length.min() == length.max():
                length = int(length[0])
            known = self._in_words[key] = (at, length)
        return known


def worth_blocks(kernels: list[Kernel], size: int) -> bool:
    """Whether an element of ``size`` packed bytes in these kernels takes the block loop."""
    live = sum(1 for k in kernels if not k.empty)
    return live >= MANY_KERNELS and size < SMALL_KERNEL_BYTES * live


def blocks_of(kernels: list[Kernel]) -> Blocks:
    """The blocks of one element's kernels, adjacent ones merged, in pack order.

    Kernels inside a repeat interleave in pack order, so all blocks are sorted by their
    packed offset, which then runs without gaps.
    """
    sources, packed, lengths = expand(kernels)
    if not sources.size:
        return Blocks(np.zeros(0, np.int64), np.zeros(0, np.int64), 0, 0, 8, 0)
    order = np.argsort(packed, kind="stable")
    at = sources[order]
    length = lengths[order]
    ends = np.cumsum(length)
    if not np.array_equal(packed[order], ends - length):
        raise AssertionError("the kernels' packed bytes do not run without gaps")
    if at.size > 1:  # merge blocks that continue one another in the user's buffer
        joins = at[:-1] + length[:-1] == at[1:]
        first = np.flatnonzero(np.concatenate(([True], ~joins)))
        length = np.add.reduceat(length, first)
        at = at[first]
        # blocks of one length unless that more than doubles their number: the loop then
        # runs a fixed count per block, with no branch on a varying length
        even = int(np.gcd.reduce(length))
        if (length // even).sum() <= 2 * at.size and not (length == even).all():
            at = _cut(at, length, even)
            length = np.full(at.size, even, np.int64)
    unit = 8
    while unit > 1 and (np.any(at % unit) or np.any(length % unit)):
        unit //= 2
    return Blocks(at, length, int(at.min()), int((at + length).max()), unit, int(ends[-1]))


def expand(kernels: list[Kernel]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every block of the kernels: user-side and packed-side byte offsets, and lengths.

    In the kernels' order, each kernel's blocks row by row.

    Kernels of at most one dimension (most of a scattered layout) in numpy operations
    over all of them at once, the others one by one.
    """
    live = [k for k in kernels if not k.empty]
    flat = [k for k in live if len(k.dims) <= 1]
    fields = np.array(
        [(k.src, k.dst, k.size, *(k.dims[0] if k.dims else (1, 0, 0))) for k in flat], np.int64
    ).reshape(-1, 6)
    src, dst, size, count, src_stride, dst_stride = fields.T
    step = np.arange(int(count.sum()), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    sources = [np.repeat(src, count) + step * np.repeat(src_stride, count)]
    packed = [np.repeat(dst, count) + step * np.repeat(dst_stride, count)]
    lengths = [np.repeat(size, count)]
    for k in live:
        if len(k.dims) <= 1:
            continue
        at, to = np.array([k.src], np.int64), np.array([k.dst], np.int64)
        for n, src_stride_k, dst_stride_k in k.dims:
            steps = np.arange(n, dtype=np.int64)
            at = (at[:, None] + steps * src_stride_k).reshape(-1)
            to = (to[:, None] + steps * dst_stride_k).reshape(-1)
        sources.append(at)
        packed.append(to)
        lengths.append(np.full(at.size, k.size, np.int64))
    return np.concatenate(sources), np.concatenate(packed), np.concatenate(lengths)


def _cut(at: np.ndarray, length: np.ndarray, piece: int) -> np.ndarray:
    """The offsets of ``piece``-byte pieces of blocks (each length a multiple of it)."""
    pieces = length // piece
    first = np.repeat(np.cumsum(pieces) - pieces, pieces)
    return np.repeat(at, pieces) + (np.arange(int(pieces.sum())) - first) * piece


def block_op(
    b: Blocks,
    unpacked: np.ndarray,
    packed: np.ndarray,
    origin: int,
    count: int,
    extent: int,
    reach: tuple[int, int],
    pack: bool,
) -> tuple[Any, np.ndarray, np.ndarray]:
    """``(copy, dst, src)`` copying ``count`` elements between the buffers (1-D uint8).

    ``reach``: the bytes the elements reach from the origin (the plan's ``_reach``).
    """
    lo, hi = reach
    user = unpacked[origin + lo : origin + hi]
    size = b.size
    flat = packed[: size * count]
    if origin + lo < 0 or user.size != hi - lo or flat.size != size * count:
        raise ValueError("the buffers do not hold every byte the blocks reach")
    word = b.unit
    while word > 1 and (extent % word or size % word):
        word //= 2
    while word > 1:
        wide_user, wide_flat = user.view(_WORDS[word]), flat.view(_WORDS[word])
        if wide_user.flags.aligned and wide_flat.flags.aligned:
            user, flat = wide_user, wide_flat
            break
        word //= 2
    at, length = b.in_words(word, lo)
    step = extent // word
    loop = numba_loop("blocks", pack, isinstance(length, int))
    if loop is None:
        index = _word_index(at, length, count, step)
        copy = functools.partial(_take if pack else _put, index)
    elif size * count >= PARALLEL_BYTES and copy_threads() > 1:
        ends = b.packed_ends(word) if count == 1 else None
        parts = _parts(loop, at, length, ends, count, step, user, flat, pack)
        copy = functools.partial(_run_parts, parts)
    else:
        copy = functools.partial(loop, at, length, count, step)
    return (copy, flat, user) if pack else (copy, user, flat)


def _parts(
    loop: Any,
    at: np.ndarray,
    length: Any,
    ends: np.ndarray | None,
    count: int,
    step: int,
    user: Any,
    flat: Any,
    pack: bool,
) -> list[tuple[Any, Any, Any]]:
    """The copy split over this rank's share of the cores: ``(copy, dst, src)`` per part.

    One element: its blocks in runs of about equal packed words; several (a positive
    step): runs of elements. The packed side of a part is its own slice; the user's
    side is all of it (a run of elements: from its first element on).
    """
    threads = copy_threads()
    if ends is not None:  # one element: ``ends``, packed words before each block, then all
        total = int(ends[-1])
        cuts = [int(np.searchsorted(ends, total * i // threads)) for i in range(threads + 1)]
        parts = []
        for a, z in itertools.pairwise(cuts):
            if z == a:
                continue
            lengths = length if isinstance(length, int) else length[a:z]
            copy = functools.partial(loop, at[a:z], lengths, 1, step)
            packed = flat[int(ends[a]) : int(ends[z])]
            parts.append((copy, packed, user) if pack else (copy, user, packed))
        return parts
    whole = functools.partial(loop, at, length, count, step)
    if step <= 0:  # elements that run backwards or on the spot: one part
        return [(whole, flat, user) if pack else (whole, user, flat)]
    per = flat.size // count
    cuts = sorted({count * i // threads for i in range(threads + 1)})
    parts = []
    for a, z in itertools.pairwise(cuts):
        copy = functools.partial(loop, at, length, z - a, step)
        packed, mine = flat[a * per : z * per], user[a * step :]
        parts.append((copy, packed, mine) if pack else (copy, mine, packed))
    return parts


def _run_parts(parts: list[tuple[Any, Any, Any]], dst: Any, src: Any) -> None:
    """The block copy as ``_parts`` split it (``dst`` and ``src``: in the parts already)."""
    run_parts(parts)


def _word_index(at: np.ndarray, length: Any, count: int, step: int) -> np.ndarray:
    """The user-side word of every packed word (numpy's fallback; ``count`` elements)."""
    if isinstance(length, int):
        length = np.full(at.size, length, np.int64)
    total = int(length.sum())
    first = np.concatenate(([0], np.cumsum(length)[:-1]))
    one = np.arange(total, dtype=np.int64) + np.repeat(at - first, length)
    return (one[None, :] + np.arange(count, dtype=np.int64)[:, None] * step).reshape(-1)


def _take(index: np.ndarray, dst: np.ndarray, src: np.ndarray) -> None:
    np.take(src, index, out=dst)


def _put(index: np.ndarray, dst: np.ndarray, src: np.ndarray) -> None:
    dst[index] = src
