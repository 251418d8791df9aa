"""Resharding, planned: pure functions of the saved manifests and the wanted blocks.

Nothing here talks to other ranks or reads a file, so a plan can be checked without MPI:
``leaves_of`` reads the saved state's leaves from every saved rank's manifest summary,
``choose`` picks a level per saved rank, ``target_blocks`` says what a rank wants,
``servers_of`` who reads each saved rank, ``moves_of`` every box that moves (in one order
on every rank) and ``outputs_of`` where this rank's arrays land.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from ..sharding import Block, intersect, target_block
from ..state import LAYOUT, TREE, CheckpointError

__all__ = [
    "PER_RANK",
    "LayoutError",
    "Leaf",
    "summary",
    "leaves_of",
    "per_rank_problem",
    "add_layouts",
    "choose",
    "pick",
    "target_blocks",
    "servers_of",
    "moves_of",
    "outputs_of",
]

PER_RANK = (None, "all")  # what restore(per_rank=...) accepts


class LayoutError(CheckpointError):
    """A resharding restore that the saved state or the blocks asked for rule out.

    No older version would do better, so ``restore`` raises it at once.
    """


def summary(source: Any) -> dict[str, Any]:
    """A manifest as every rank needs it: values, and arrays' dtypes and shapes."""
    out = {}
    for name, entry in source.entries.items():
        if "value" in entry:
            out[name] = {"value": entry["value"]}
        else:
            dtype = entry["dtype_obj"]
            out[name] = {
                "dtype": dtype.descr if dtype.fields else dtype.str,
                "shape": list(entry["shape"]),
            }
    return out


def saved_dtype(spec: Any) -> np.dtype:
    """A dtype from its saved description (a string, or the fields of a record)."""
    return np.dtype(spec if isinstance(spec, str) else [tuple(f) for f in spec])


class Leaf:
    """What a leaf of the saved state is and where its parts are."""

    def __init__(self, name: str, kind: str) -> None:
        self.name, self.kind = name, kind  # sharded, replicated, array, value
        self.dtype: np.dtype | None = None
        self.global_shape: tuple[int, ...] = ()
        self.blocks: list[Block] = []  # sharded: per saved rank
        self.shapes: list[tuple[int, ...]] = []  # per-rank arrays: per saved rank
        self.dtypes: list[np.dtype] = []  # per-rank arrays: per saved rank
        self.values: list[Any] = []  # values: per saved rank


def leaves_of(summaries: list[dict[str, Any]]) -> tuple[Any, dict[str, Leaf]]:
    """The saved state's tree and leaves, checked for agreement across saved ranks.

    Raises:
        CheckpointError: the saved ranks' states disagree in structure or layout.
    """
    trees = {json.dumps(s.get(TREE, {}).get("value")) for s in summaries}
    if len(trees) > 1:
        raise LayoutError(
            "the saved ranks' states have different structures (keys, lists, tuples); a "
            "restore on another number of ranks needs the same structure on every rank"
        )
    tree = summaries[0].get(TREE, {}).get("value")
    layouts: dict[str, Any] = {}
    for name, entry in summaries[0].items():
        if name.startswith(LAYOUT):
            try:
                layouts[name[len(LAYOUT) :]] = json.loads(entry["value"])
            except (KeyError, TypeError, ValueError, RecursionError):
                raise CheckpointError(f"layout of {name[len(LAYOUT) :]!r} is unreadable") from None
    names = sorted({n for s in summaries for n in s if not n.startswith(".")} | set(layouts))
    leaves: dict[str, Leaf] = {}
    for name in names:
        layout = layouts.get(name) or {}
        kind = layout.get("kind") if isinstance(layout, dict) else None
        entries = [s.get(name) for s in summaries]
        if kind == "replicated":
            leaf = Leaf(name, "replicated")
            if entries[0] is None or "value" in entries[0]:
                raise CheckpointError(f"replicated {name!r} is missing from saved rank 0")
            leaf.dtype, leaf.global_shape = (
                saved_dtype(entries[0]["dtype"]),
                tuple(entries[0]["shape"]),
            )
        elif kind == "sharded":
            leaf = sharded_leaf(name, summaries)
        elif all(e is not None and "value" in e for e in entries):
            leaf = Leaf(name, "value")
            leaf.values = [e["value"] for e in entries]  # type: ignore[index]
        elif all(e is not None and "value" not in e for e in entries):
            leaf = Leaf(name, "array")
            leaf.dtype = saved_dtype(entries[0]["dtype"])  # type: ignore[index]
            leaf.shapes = [tuple(e["shape"]) for e in entries]  # type: ignore[index]
            leaf.dtypes = [saved_dtype(e["dtype"]) for e in entries]  # type: ignore[index]
        else:
            raise CheckpointError(f"{name!r} is not saved the same way by every saved rank")
        leaves[name] = leaf
    return tree, leaves


def sharded_leaf(name: str, summaries: list[dict[str, Any]]) -> Leaf:
    """A sharded leaf: every saved rank's block, one global shape and dtype."""
    leaf = Leaf(name, "sharded")
    for r, s in enumerate(summaries):
        try:
            spec = json.loads(s[LAYOUT + name]["value"])
            glob, offset = tuple(spec["global"]), tuple(spec["offset"])
            dtype, shape = saved_dtype(s[name]["dtype"]), tuple(s[name]["shape"])
        except (KeyError, TypeError, ValueError, RecursionError):
            raise CheckpointError(
                f"sharded {name!r}: saved rank {r} has no readable block of it"
            ) from None
        if r and (glob != leaf.global_shape or dtype != leaf.dtype):
            raise CheckpointError(
                f"sharded {name!r}: saved ranks disagree on its global shape or dtype"
            )
        leaf.global_shape, leaf.dtype = glob, dtype
        leaf.blocks.append((offset, shape))
    return leaf


def per_rank_problem(leaves: dict[str, Leaf], old: int, size: int, per_rank: Any) -> str:
    """Why per-rank leaves cannot be restored on ``size`` ranks (empty: they can)."""
    if old == size or per_rank == "all":
        return ""
    arrays = [n for n, leaf in leaves.items() if leaf.kind == "array"]
    values = [
        n
        for n, leaf in leaves.items()
        if leaf.kind == "value" and any(v != leaf.values[0] for v in leaf.values)
    ]
    if not arrays and not values:
        return ""
    what = ", ".join(repr(n) for n in (arrays + values)[:6])
    more = " and others" if len(arrays) + len(values) > 6 else ""
    return (
        f"version saved by {old} ranks, restored on {size}: per-rank leaves {what}{more} "
        "cannot be split (declare arrays Sharded or Replicated, or restore with "
        "per_rank='all' for a list of every saved rank's value)"
    )


def add_layouts(
    flat: dict[str, Any], tree: Any, leaves: dict[str, Leaf], blocks: dict[str, Block]
) -> None:
    """Add the tree and the leaves' (new) layouts to a restored flat state."""
    if tree is not None:
        flat[TREE] = tree
    for name, leaf in leaves.items():
        if leaf.kind == "sharded":
            layout = {"kind": "sharded", "global": list(leaf.global_shape)}
            layout["offset"] = list(blocks[name][0])
            flat[LAYOUT + name] = json.dumps(layout)
        elif leaf.kind == "replicated":
            flat[LAYOUT + name] = json.dumps({"kind": "replicated"})


def choose(
    names: list[str], seen: list[Any], bad: set[tuple[int, str]], old: int, step: int
) -> dict[int, str]:
    """Per saved rank, the fastest level some rank sees that has not failed yet.

    Raises:
        CheckpointError: a saved rank whose data no level holds whole.
    """
    chosen: dict[int, str] = {}
    for r in range(old):
        visible = [n for n in names if any(n in s[r] for s in seen)]
        level = next((n for n in visible if (r, n) not in bad), None)
        if level is None:
            why = f"damaged at {', '.join(visible)}" if visible else "not found at any level"
            raise CheckpointError(f"version {step}: saved rank {r}'s data is {why}")
        chosen[r] = level
    return chosen


def pick(candidates: list[int], preferred: int) -> int:
    """``preferred`` if it is a candidate, else the first candidate."""
    return preferred if preferred in candidates else candidates[0]


def target_blocks(
    leaves: dict[str, Leaf], reshard: Any, rank: int, size: int
) -> tuple[dict[str, Block], str]:
    """This rank's target block of every sharded leaf, or why ``reshard`` cannot give one."""
    mine: dict[str, Block] = {}
    for name, leaf in leaves.items():
        if leaf.kind != "sharded":
            continue
        try:
            mine[name] = target_block(reshard, name, leaf.global_shape, leaf.blocks, rank, size)
        except (ValueError, TypeError) as exc:
            return mine, f"rank {rank}: restore: {exc}"
    return mine, ""


def servers_of(
    leaves: dict[str, Leaf],
    targets: dict[str, list[Block]],
    seen: list[Any],
    chosen: dict[int, str],
    old: int,
    size: int,
) -> dict[int, int]:
    """Per saved rank, the rank that reads it for broadcasts and for ranks that cannot.

    Of the ranks that can see it, the one needing most of it.
    """
    out = {}
    for r in range(old):
        able = [k for k in range(size) if chosen[r] in seen[k][r]]
        need = dict.fromkeys(able, 0)
        for name, leaf in leaves.items():
            if leaf.kind != "sharded":
                continue
            for k in able:
                box = intersect(leaf.blocks[r], targets[name][k])
                if box is not None:
                    need[k] += math.prod(box[1])
        if r < size and r in need:
            need[r] += 1  # ties: the rank with the same number
        out[r] = max(able, key=lambda k: (need[k], -abs(k - r)))
    return out


def moves_of(
    leaves: dict[str, Leaf], targets: dict[str, list[Block]], old: int, size: int, per_rank: Any
) -> list[tuple[Any, ...]]:
    """Every move, in one order on every rank.

    A move: (leaf, saved rank, source offset, box, client or -1 for all, output key,
    output offset).
    """
    moves: list[tuple[Any, ...]] = []
    for name, leaf in leaves.items():
        if leaf.kind == "sharded":
            for r in range(old):
                for c in range(size):
                    box = intersect(leaf.blocks[r], targets[name][c])
                    if box is None:
                        continue
                    src = tuple(a - b for a, b in zip(box[0], leaf.blocks[r][0], strict=True))
                    dst = tuple(a - b for a, b in zip(box[0], targets[name][c][0], strict=True))
                    moves.append((name, r, src, box[1], c, name, dst))
        elif leaf.kind == "replicated":
            zero = (0,) * len(leaf.global_shape)
            moves.append((name, 0, zero, leaf.global_shape, -1, name, zero))
        elif leaf.kind == "array":
            for r in range(old):
                zero = (0,) * len(leaf.shapes[r])
                if per_rank == "all":
                    moves.append((name, r, zero, leaf.shapes[r], -1, (name, r), zero))
                elif r < size:
                    moves.append((name, r, zero, leaf.shapes[r], r, name, zero))
    return moves


def outputs_of(
    leaves: dict[str, Leaf],
    targets: dict[str, list[Block]],
    rank: int,
    size: int,
    old: int,
    per_rank: Any,
    alloc: Any,
) -> tuple[dict[Any, Any], dict[str, Any]]:
    """Where this rank's arrays go (key -> array), and its plain values."""
    outputs: dict[Any, Any] = {}
    values: dict[str, Any] = {}
    for name, leaf in leaves.items():
        if leaf.kind == "sharded":
            outputs[name] = alloc(name, targets[name][rank][1], leaf.dtype)
        elif leaf.kind == "replicated":
            outputs[name] = alloc(name, leaf.global_shape, leaf.dtype)
        elif leaf.kind == "array" and per_rank == "all":
            for r in range(old):
                outputs[(name, r)] = alloc((name, r), leaf.shapes[r], leaf.dtypes[r])
        elif leaf.kind == "array":
            outputs[name] = alloc(name, leaf.shapes[rank], leaf.dtypes[rank])
        else:
            same = all(v == leaf.values[0] for v in leaf.values)
            if per_rank == "all" and not same:
                values[name] = list(leaf.values)
            else:
                values[name] = leaf.values[rank if old == size and not same else 0]
    return outputs, values
