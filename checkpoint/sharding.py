"""The geometry of sharded arrays: blocks, their overlaps, the save-time checks, targets.

A block is ``(offset, shape)`` in a global array's index space. At save the ranks'
blocks of a ``Sharded`` array must tile the global shape (``check_layouts``); at a
resharding restore each rank names the block it wants (``target_block``) and receives
the overlaps (``intersect``) of the saved blocks with it.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "Block",
    "intersect",
    "even_block",
    "split_axis",
    "check_layouts",
    "target_block",
    "split_box",
]

Block = tuple[tuple[int, ...], tuple[int, ...]]  # (offset, shape)


def intersect(a: Block, b: Block) -> Block | None:
    """The overlap of two blocks, or None if they share no element."""
    lo = tuple(max(x, y) for x, y in zip(a[0], b[0], strict=True))
    hi = tuple(min(x + n, y + m) for x, n, y, m in zip(a[0], a[1], b[0], b[1], strict=True))
    if any(h <= low for low, h in zip(lo, hi, strict=True)):
        return None
    return lo, tuple(h - low for low, h in zip(lo, hi, strict=True))


def even_block(shape: tuple[int, ...], axis: int, rank: int, size: int) -> Block:
    """Rank ``rank``'s part of ``shape`` cut into ``size`` near-equal blocks along ``axis``.

    The first ``shape[axis] % size`` ranks get one more index (``numpy.array_split``'s rule).
    """
    base, extra = divmod(shape[axis], size)
    start = rank * base + min(rank, extra)
    length = base + (1 if rank < extra else 0)
    offset = tuple(start if i == axis else 0 for i in range(len(shape)))
    return offset, tuple(length if i == axis else n for i, n in enumerate(shape))


def split_axis(blocks: list[Block]) -> int:
    """The one axis along which saved blocks were cut (0 if none or several)."""
    if not blocks or not blocks[0][0]:
        return 0
    cut = [i for i in range(len(blocks[0][0])) if len({b[0][i] for b in blocks}) > 1]
    return cut[0] if len(cut) == 1 else 0


def _ranks(ranks: list[int]) -> str:
    from hpcpar.layout import format_ranks

    return format_ranks(ranks)


def check_layouts(described: list[dict[str, Any]]) -> str:
    """Why the ranks' declared layouts cannot be saved, or "" if they can.

    Args:
        described: Per rank, leaf name -> ``(kind, global shape, offset, shape, dtype)``
            of each ``Sharded`` or ``Replicated`` leaf (``None`` for the others).

    The rules: every rank declares the same leaves the same way; a sharded leaf has one
    global shape and dtype on every rank, and its blocks tile the global shape (no
    overlap, no gap); a replicated leaf has one shape and dtype everywhere.
    """
    names = sorted({n for d in described for n in d})
    for name in names:
        per_rank = [d.get(name) for d in described]
        kinds = {(p[0] if p else "unmarked") for p in per_rank}
        if len(kinds) > 1:
            how = {
                k: [r for r, p in enumerate(per_rank) if (p[0] if p else "unmarked") == k]
                for k in sorted(kinds)
            }
            detail = "; ".join(f"{k} on rank(s) {_ranks(r)}" for k, r in how.items())
            return f"save: {name!r} is declared differently across ranks: {detail}"
        kind = per_rank[0][0] if per_rank[0] else "unmarked"
        if kind == "unmarked":
            continue
        for what, index in (
            (("global shape", 1), ("dtype", 4))
            if kind == "sharded"
            else (("shape", 3), ("dtype", 4))
        ):
            seen = {str(p[index]) for p in per_rank}
            if len(seen) > 1:
                return f"save: {kind} {name!r} has different {what}s across ranks: {sorted(seen)}"
        if kind == "replicated" and len({str(p[5:]) for p in per_rank}) > 1:
            return f"save: replicated {name!r} differs between ranks (found by HPCPAR_CHECK=1)"
        if kind == "sharded":
            problem = _tiles(name, per_rank)
            if problem:
                return problem
    return ""


def _tiles(name: str, per_rank: list[Any]) -> str:
    """Why the ranks' blocks of a sharded leaf do not tile its global shape, or ""."""
    glob = tuple(per_rank[0][1])
    blocks = [(tuple(p[2]), tuple(p[3])) for p in per_rank]
    covered = sum(math.prod(b[1]) for b in blocks)
    nonempty = [(r, b) for r, b in enumerate(blocks) if math.prod(b[1])]
    nonempty.sort(key=lambda rb: rb[1][0])
    for i, (r, a) in enumerate(nonempty):  # sorted by offset: stop once past a's end on axis 0
        for s, b in nonempty[i + 1 :]:
            if a[0] and b[0][0] >= a[0][0] + a[1][0]:
                break
            if intersect(a, b) is not None:
                return (
                    f"save: sharded {name!r}: the blocks of ranks {r} and {s} overlap "
                    f"(offset {a[0]} shape {a[1]}, offset {b[0]} shape {b[1]})"
                )
    total = math.prod(glob)
    if covered != total:
        return (
            f"save: sharded {name!r}: the blocks cover {covered} of the {total} elements of "
            f"global shape {glob} (a gap)"
        )
    return ""


Target = Any  # an axis (int), (offset, shape), or a callable giving one of those


def target_block(
    spec: Target, name: str, shape: tuple[int, ...], saved: list[Block], rank: int, size: int
) -> Block:
    """The block rank ``rank`` of ``size`` asks for, of the sharded leaf ``name``.

    Args:
        spec: ``None`` (the saved blocks when the rank count is unchanged, else near-equal
            blocks along the axis the saved blocks were cut on), an axis, ``(offset,
            shape)``, a dict of leaf name -> one of these, or a callable ``(name,
            global_shape) -> one of these``.
        name: The leaf's name (``"opt/m/0"``).
        shape: Its global shape.
        saved: The saved ranks' blocks.
        rank: The asking rank.
        size: The number of ranks restoring.

    Raises:
        ValueError: a target that does not fit the global shape (the message says why).
    """
    if isinstance(spec, dict):
        spec = spec.get(name)
    if callable(spec):
        spec = spec(name, shape)
    if spec is None:
        if len(saved) == size:
            return saved[rank]
        spec = split_axis(saved)
    if isinstance(spec, int) and not isinstance(spec, bool):
        if not -len(shape) <= spec < len(shape) or not shape:
            raise ValueError(f"{name!r}: axis {spec} does not exist in global shape {shape}")
        return even_block(shape, spec % len(shape), rank, size)
    try:
        offset, box = (tuple(int(x) for x in part) for part in spec)
    except (TypeError, ValueError):
        raise ValueError(
            f"{name!r}: a target is an axis or (offset, shape), not {spec!r}"
        ) from None
    if not len(offset) == len(box) == len(shape) or any(
        o < 0 or b < 0 or o + b > g for o, b, g in zip(offset, box, shape, strict=True)
    ):
        raise ValueError(
            f"{name!r}: target offset {offset} shape {box} does not fit global shape {shape}"
        )
    return offset, box


def split_box(box: tuple[int, ...], itemsize: int, limit: int) -> list[Block]:
    """Cut a box into sub-boxes of at most ``limit`` bytes, in C order (offsets relative).

    Whole slabs along the first axis where they fit; otherwise each index of the first
    axis is cut again along the next.
    """
    if not box or math.prod(box) * itemsize <= limit:
        return [((0,) * len(box), box)]
    inner = math.prod(box[1:]) * itemsize
    out: list[Block] = []
    if inner <= limit or len(box) == 1:
        rows = max(1, limit // max(inner, 1))
        for start in range(0, box[0], rows):
            out.append(((start,) + (0,) * (len(box) - 1), (min(rows, box[0] - start), *box[1:])))
        return out
    for start in range(box[0]):
        for off, sub in split_box(box[1:], itemsize, limit):
            out.append(((start, *off), (1, *sub)))
    return out
