"""The plan IR: strided blocks and repeated groups of them, in pack order, and its rewriting.

A layout is a tuple of items, each either

- ``Strided(offset, size, counts, strides)``: ``size`` contiguous bytes at ``offset``,
  repeated over the dimensions ``counts``/``strides`` (outermost first), or
- ``Repeat(count, stride, body)``: the items of ``body`` laid out ``count`` times,
  ``stride`` bytes apart (a struct of several fields repeated, say).

Bytes are packed in item order, and inside an item in row-major order of its dimensions:
exactly MPI's typemap order. ``canonical`` rewrites until nothing changes: drop
count-1 dimensions, fold an innermost dimension whose stride equals the block into a
larger block, merge neighbouring dimensions whose outer stride equals count x inner
stride, merge adjacent blocks that touch, turn runs of equal blocks at a constant
distance into a dimension, and turn a repeat of one strided item into a dimension of
it. Equivalent constructions of one layout therefore end as one identical plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

__all__ = ["Strided", "Repeat", "Item", "canonical", "shift", "replicate", "packed_size", "span"]


@dataclass(frozen=True)
class Strided:
    """``size`` contiguous bytes at ``offset``, over dimensions ``counts``/``strides``."""

    offset: int
    size: int
    counts: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()

    @property
    def nbytes(self) -> int:
        """Bytes this item packs."""
        return self.size * prod(self.counts)


@dataclass(frozen=True)
class Repeat:
    """The items of ``body``, ``count`` times, ``stride`` bytes apart."""

    count: int
    stride: int
    body: tuple[Item, ...]

    @property
    def nbytes(self) -> int:
        """Bytes this item packs."""
        return self.count * sum(item.nbytes for item in self.body)


Item = Strided | Repeat


def packed_size(items: tuple[Item, ...]) -> int:
    """Bytes a layout packs."""
    return sum(item.nbytes for item in items)


def span(items: tuple[Item, ...]) -> tuple[int, int]:
    """(lowest byte, one past the highest byte) the layout touches; (0, 0) when empty."""
    lo, hi = None, None
    for item in items:
        if item.nbytes == 0:
            continue
        if isinstance(item, Strided):
            start = item.offset + sum(
                min(0, (c - 1) * s) for c, s in zip(item.counts, item.strides, strict=True)
            )
            end = (
                item.offset
                + item.size
                + sum(max(0, (c - 1) * s) for c, s in zip(item.counts, item.strides, strict=True))
            )
        else:
            b_lo, b_hi = span(item.body)
            first, last = 0, (item.count - 1) * item.stride
            start, end = b_lo + min(first, last), b_hi + max(first, last)
        lo = start if lo is None else min(lo, start)
        hi = end if hi is None else max(hi, end)
    return (0, 0) if lo is None else (lo, hi)


def shift(items: tuple[Item, ...], delta: int) -> tuple[Item, ...]:
    """The same layout ``delta`` bytes further on."""
    out: list[Item] = []
    for item in items:
        if isinstance(item, Strided):
            out.append(Strided(item.offset + delta, item.size, item.counts, item.strides))
        else:
            out.append(Repeat(item.count, item.stride, shift(item.body, delta)))
    return tuple(out)


def replicate(items: tuple[Item, ...], count: int, stride: int) -> tuple[Item, ...]:
    """``count`` copies of a layout, ``stride`` bytes apart (then canonical)."""
    if count == 0:
        return ()
    if len(items) == 1 and isinstance(items[0], Strided):
        s = items[0]
        return canonical((Strided(s.offset, s.size, (count, *s.counts), (stride, *s.strides)),))
    return canonical((Repeat(count, stride, items),))


def _strided(s: Strided) -> Strided:
    if not s.counts and s.size:  # a plain block (most of an irregular layout) is canonical
        return s
    if len(s.counts) == 1 and s.size and s.counts[0] > 1 and s.strides[0] != s.size:
        return s  # one dimension that neither folds nor drops
    counts, strides, size = list(s.counts), list(s.strides), s.size
    changed = True
    while changed:
        changed = False
        # drop count-1 dimensions
        keep = [i for i, c in enumerate(counts) if c != 1]
        if len(keep) != len(counts):
            counts, strides = [counts[i] for i in keep], [strides[i] for i in keep]
            changed = True
        # fold an innermost dimension over dense data into the block
        if counts and strides[-1] == size:
            size *= counts.pop()
            strides.pop()
            changed = True
        # merge neighbours whose outer stride is count x inner stride
        for i in range(len(counts) - 1):
            if strides[i] == counts[i + 1] * strides[i + 1]:
                counts[i : i + 2] = [counts[i] * counts[i + 1]]
                strides[i : i + 2] = [strides[i + 1]]
                changed = True
                break
    if 0 in counts or size == 0:
        return Strided(s.offset, 0, (), ())
    return Strided(s.offset, size, tuple(counts), tuple(strides))


def _same_shape(a: Item, b: Item) -> bool:
    if isinstance(a, Strided) and isinstance(b, Strided):
        return a.size == b.size and a.counts == b.counts and a.strides == b.strides
    if isinstance(a, Repeat) and isinstance(b, Repeat):
        return (
            a.count == b.count
            and a.stride == b.stride
            and a.body == shift(b.body, _origin(a) - _origin(b))
        )
    return False


def _origin(item: Item) -> int:
    return item.offset if isinstance(item, Strided) else _origin(item.body[0])


def _merge_run(items: list[Item]) -> list[Item]:
    """Merge touching plain blocks; turn runs of equal items at a constant step into a dimension."""
    out: list[Item] = []
    i = 0
    while i < len(items):
        item = items[i]
        if isinstance(item, Strided) and not item.counts:
            # touching plain blocks become one block
            j, size = i, item.size
            while j + 1 < len(items):
                nxt = items[j + 1]
                if isinstance(nxt, Strided) and not nxt.counts and nxt.offset == item.offset + size:
                    size += nxt.size
                    j += 1
                else:
                    break
            if j > i:
                out.append(Strided(item.offset, size))
                i = j + 1
                continue
        # a run of equal items at a constant distance becomes a dimension
        j = i
        if i + 1 < len(items) and _same_shape(item, items[i + 1]):
            step = _origin(items[i + 1]) - _origin(item)
            while (
                j + 1 < len(items)
                and _same_shape(items[j], items[j + 1])
                and (_origin(items[j + 1]) - _origin(items[j]) == step)
            ):
                j += 1
            if j > i:
                out.extend(replicate((item,), j - i + 1, step))
                i = j + 1
                continue
        out.append(item)
        i += 1
    return out


def canonical(items: tuple[Item, ...]) -> tuple[Item, ...]:
    """Rewrite a layout until nothing changes (see the module docstring)."""
    current = items
    while True:
        flat: list[Item] = []
        for item in current:
            if isinstance(item, Strided):
                s = _strided(item)
                if s.size:
                    flat.append(s)
                continue
            body = canonical(item.body)
            if item.count == 0 or not body:
                continue
            if item.count == 1:
                flat.extend(body)
            elif len(body) == 1 and isinstance(body[0], Strided):
                b = body[0]
                flat.append(
                    _strided(
                        Strided(
                            b.offset, b.size, (item.count, *b.counts), (item.stride, *b.strides)
                        )
                    )
                )
            else:
                flat.append(Repeat(item.count, item.stride, body))
        merged = tuple(_merge_run(flat))
        if merged == current:
            return merged
        current = merged
