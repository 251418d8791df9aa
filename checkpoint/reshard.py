"""Restoring a version on another number of ranks, or into other blocks (resharding).

Collective over the restoring job. In rounds, until every saved rank's data is whole:

1. Each rank lists what it can see of the version (``sources.find_sources``: own
   shards, partner copies, XOR rebuilds, HDF5 files, per saved rank and level); the
   fastest level anyone sees is chosen per saved rank.
2. One rank per saved rank reads that shard's manifest (its tail only); all manifests
   are shared, so every rank knows every saved block, dtype and value.
3. Each rank computes the blocks it wants (``sharding.target_block``); every saved
   rank gets a server: of the ranks that can read it, the one that needs most of it.
4. Servers read the overlaps of their saved blocks with each rank's target, in pieces
   of at most ``PIECE_BYTES`` (whole checksum blocks, each verified), and send them;
   a piece a server needs itself is read straight into place. Replicated arrays (kept
   in saved rank 0's shard) are broadcast piece by piece.

A saved rank whose data turns out damaged is retried from the next level. Memory: the
new state, one piece and one checksum block.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from .levels.base import PIECE_BYTES
from .sharding import Block, intersect, split_box, target_block
from .sources import find_sources
from .state import LAYOUT, TREE, CheckpointError

__all__ = ["restore_resharded", "PER_RANK", "LayoutError"]

PER_RANK = (None, "all")  # what restore(per_rank=...) accepts
_TAG = 73


class LayoutError(CheckpointError):
    """A resharding restore that the saved state or the blocks asked for rule out.

    No older version would do better, so ``restore`` raises it at once.
    """


def _summary(source: Any) -> dict[str, Any]:
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


def _dtype(spec: Any) -> np.dtype:
    return np.dtype(spec if isinstance(spec, str) else [tuple(f) for f in spec])


class _Leaf:
    """What a leaf of the saved state is and where its parts are."""

    def __init__(self, name: str, kind: str) -> None:
        self.name, self.kind = name, kind  # sharded, replicated, array, value
        self.dtype: np.dtype | None = None
        self.global_shape: tuple[int, ...] = ()
        self.blocks: list[Block] = []  # sharded: per saved rank
        self.shapes: list[tuple[int, ...]] = []  # per-rank arrays: per saved rank
        self.dtypes: list[np.dtype] = []  # per-rank arrays: per saved rank
        self.values: list[Any] = []  # values: per saved rank


def _leaves(summaries: list[dict[str, Any]]) -> tuple[Any, dict[str, _Leaf]]:
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
    leaves: dict[str, _Leaf] = {}
    for name in names:
        layout = layouts.get(name) or {}
        kind = layout.get("kind") if isinstance(layout, dict) else None
        entries = [s.get(name) for s in summaries]
        if kind == "replicated":
            leaf = _Leaf(name, "replicated")
            if entries[0] is None or "value" in entries[0]:
                raise CheckpointError(f"replicated {name!r} is missing from saved rank 0")
            leaf.dtype, leaf.global_shape = _dtype(entries[0]["dtype"]), tuple(entries[0]["shape"])
        elif kind == "sharded":
            leaf = _sharded(name, summaries)
        elif all(e is not None and "value" in e for e in entries):
            leaf = _Leaf(name, "value")
            leaf.values = [e["value"] for e in entries]  # type: ignore[index]
        elif all(e is not None and "value" not in e for e in entries):
            leaf = _Leaf(name, "array")
            leaf.dtype = _dtype(entries[0]["dtype"])  # type: ignore[index]
            leaf.shapes = [tuple(e["shape"]) for e in entries]  # type: ignore[index]
            leaf.dtypes = [_dtype(e["dtype"]) for e in entries]  # type: ignore[index]
        else:
            raise CheckpointError(f"{name!r} is not saved the same way by every saved rank")
        leaves[name] = leaf
    return tree, leaves


def _sharded(name: str, summaries: list[dict[str, Any]]) -> _Leaf:
    """A sharded leaf: every saved rank's block, one global shape and dtype."""
    leaf = _Leaf(name, "sharded")
    for r, s in enumerate(summaries):
        try:
            spec = json.loads(s[LAYOUT + name]["value"])
            glob, offset = tuple(spec["global"]), tuple(spec["offset"])
            dtype, shape = _dtype(s[name]["dtype"]), tuple(s[name]["shape"])
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


def _per_rank_problem(leaves: dict[str, _Leaf], old: int, size: int, per_rank: Any) -> str:
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


def restore_resharded(
    comm: Any,
    root: Path,
    local_dir: Path,
    step: int,
    old: int,
    levels: list[Any],
    reshard: Any = None,
    per_rank: Any = None,
    alloc: Any = None,
) -> tuple[dict[str, Any], list[str]]:
    """Version ``step`` (saved by ``old`` ranks) as this rank's new flat state (collective).

    Args:
        comm: The restoring job's communicator.
        root: The checkpoint root.
        local_dir: The node-local storage.
        step: The version.
        old: The number of ranks that saved it.
        levels: The level classes to read from, fastest first.
        reshard: What each rank wants of each sharded leaf (``sharding.target_block``).
        per_rank: ``"all"``: per-rank leaves come back as a list of every saved rank's.
        alloc: ``alloc(key, shape, dtype)`` -> where to put a leaf (default: a new
            numpy array); ``key`` is a leaf name, or ``(name, saved rank)``.

    Returns:
        ``(flat state, the level that served each saved rank)``.

    Raises:
        CheckpointError: on every rank: a saved rank whose data no level has whole,
            saved states that disagree, per-rank leaves that cannot be split, or a target
            block that does not fit.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    names = [cls.name for cls in levels]
    openers = find_sources(root, local_dir, step, old, levels)
    seen = comm.allgather({r: [n for n in names if n in openers[r]] for r in range(old)})
    bad: set[tuple[int, str]] = set()
    for _ in range(len(names) + 1):
        chosen = _choose(names, seen, bad, old, step)
        summaries = _manifests(comm, openers, chosen, seen, old)
        failed = [r for r in range(old) if isinstance(summaries[r], str)]
        if failed:
            bad.update((r, chosen[r]) for r in failed)
            continue
        tree, leaves = _leaves([summaries[r] for r in range(old)])
        problem = _per_rank_problem(leaves, old, size, per_rank)
        if problem:
            raise LayoutError(problem)
        targets = _targets(comm, leaves, reshard)
        servers = _servers(leaves, targets, seen, chosen, old, size)

        def serve(
            r: int, client: int, servers: dict[int, int] = servers, chosen: dict[int, str] = chosen
        ) -> int:
            """Who reads a move: its client if it sees the data (no message).

            Else the saved rank's server reads it and sends or broadcasts it.
            """
            return client if client >= 0 and chosen[r] in seen[client][r] else servers[r]

        flat, errors = _transfer(
            comm, leaves, targets, serve, openers, chosen, old, per_rank, alloc
        )
        every = {}
        for part in comm.allgather(errors):
            every.update(part)
        if every:
            bad.update((r, chosen[r]) for r in every)
            continue
        _describe(flat, tree, leaves, {n: t[rank] for n, t in targets.items()})
        return flat, [chosen[r] for r in range(old)]
    raise CheckpointError(f"version {step}: no level holds every saved rank's data whole")


def _manifests(
    comm: Any, openers: dict[int, Any], chosen: dict[int, str], seen: list[Any], old: int
) -> dict[int, Any]:
    """Every saved rank's manifest summary (or why it could not be read), on every rank.

    The rank with the saved rank's number reads it if it can see it, else the first
    rank that can.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    mine: dict[int, Any] = {}
    for r in range(old):
        if _pick([k for k in range(size) if chosen[r] in seen[k][r]], r % size) != rank:
            continue
        try:
            source = openers[r][chosen[r]]()
            mine[r] = _summary(source)
            source.close()
        except CheckpointError as exc:
            mine[r] = str(exc)
    summaries: dict[int, Any] = {}
    for part in comm.allgather(mine):
        summaries.update(part)
    return summaries


def _describe(
    flat: dict[str, Any], tree: Any, leaves: dict[str, _Leaf], blocks: dict[str, Block]
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


def _choose(
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


def _pick(candidates: list[int], preferred: int) -> int:
    return preferred if preferred in candidates else candidates[0]


def _targets(comm: Any, leaves: dict[str, _Leaf], reshard: Any) -> dict[str, list[Block]]:
    """Every rank's target block of every sharded leaf (all ranks agree, or all raise)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    mine: dict[str, Block] = {}
    problem = ""
    for name, leaf in leaves.items():
        if leaf.kind != "sharded":
            continue
        try:
            mine[name] = target_block(reshard, name, leaf.global_shape, leaf.blocks, rank, size)
        except (ValueError, TypeError) as exc:
            problem = f"rank {rank}: restore: {exc}"
            break
    every = comm.allgather((mine, problem))
    problems = [p for _, p in every if p]
    if problems:
        raise LayoutError(problems[0])
    return {name: [every[k][0][name] for k in range(size)] for name in mine}


def _servers(
    leaves: dict[str, _Leaf],
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


def _transfers(
    leaves: dict[str, _Leaf], targets: dict[str, list[Block]], old: int, size: int, per_rank: Any
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


def _outputs(
    leaves: dict[str, _Leaf],
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


class _Mover:
    """Runs the moves on one rank: reads what it serves, sends, receives, places."""

    def __init__(self, comm: Any, openers: dict[int, Any], chosen: dict[int, str]) -> None:
        self.comm, self.rank = comm, comm.Get_rank()
        self.openers, self.chosen = openers, chosen
        self.sources: dict[int, Any] = {}
        self.errors: dict[int, str] = {}  # saved rank -> why its data could not be read
        self.pieces = [np.empty(0, dtype=np.uint8), np.empty(0, dtype=np.uint8)]
        self.pending: list[Any] = [None, None]  # the send of each piece buffer
        self.turn = 0

    def open(self, r: int) -> None:
        """Open saved rank ``r``'s source (once; a failure is noted, not raised)."""
        if r not in self.sources and r not in self.errors:
            try:
                self.sources[r] = self.openers[r][self.chosen[r]]()
            except CheckpointError as exc:
                self.errors[r] = str(exc)

    def prefetch(self, r: int, name: str, src: tuple[int, ...], box: tuple[int, ...]) -> None:
        """Tell saved rank ``r``'s source what will be read."""
        self.open(r)
        if r in self.sources:
            self.sources[r].prefetch(name, src, box)

    def move(
        self,
        name: str,
        r: int,
        server: int,
        src: tuple[int, ...],
        box: tuple[int, ...],
        client: int,
        target: Any,
        dst: tuple[int, ...],
    ) -> None:
        """Move saved rank ``r``'s ``box`` of leaf ``name``, piece by piece.

        ``server`` reads it at ``src``; it goes to ``target`` at ``dst`` on ``client``
        (-1: every rank). Pieces land in place where the target's part is contiguous;
        the server sends one piece while it reads the next (two half pieces in turn).
        """
        if self.rank == server:
            self.open(r)
        dtype = target.dtype
        for sub_off, sub in split_box(box, dtype.itemsize, PIECE_BYTES // 2):
            at = tuple(slice(d + o, d + o + n) for d, o, n in zip(dst, sub_off, sub, strict=True))
            origin = tuple(s + o for s, o in zip(src, sub_off, strict=True))
            nbytes = math.prod(sub) * dtype.itemsize
            view = None
            if client in (self.rank, -1) and isinstance(target, np.ndarray) and target.ndim:
                view = target[at]
                view = view if view.flags.c_contiguous else None
            if self.rank == server:
                if client == self.rank and view is not None:  # read straight into place
                    self.read(r, name, origin, sub, view)
                    continue
                raw = self._buffer(nbytes)
                buf = raw.view(dtype).reshape(sub)
                self.read(r, name, origin, sub, buf)
                if client == -1:
                    self.comm.Bcast(raw, root=server)
                elif client != server:
                    self.pending[self.turn] = self.comm.Isend(raw, dest=client, tag=_TAG)
                    continue
                target[at] = buf
                continue
            raw = view.reshape(-1).view(np.uint8) if view is not None else self._buffer(nbytes)
            if client == -1:
                self.comm.Bcast(raw, root=server)
            else:
                self.comm.Recv(raw, source=server, tag=_TAG)
            if view is None:
                target[at] = raw.view(dtype).reshape(sub)

    def _buffer(self, nbytes: int) -> np.ndarray:
        """The next of the two piece buffers, once its last send is done."""
        self.turn ^= 1
        if self.pending[self.turn] is not None:
            self.pending[self.turn].Wait()
            self.pending[self.turn] = None
        if self.pieces[self.turn].size < nbytes:
            self.pieces[self.turn] = np.empty(max(nbytes, 1 << 20), dtype=np.uint8)
        return self.pieces[self.turn][:nbytes]

    def finish(self) -> None:
        """Wait for the sends still in flight."""
        for i, request in enumerate(self.pending):
            if request is not None:
                request.Wait()
                self.pending[i] = None

    def read(
        self, r: int, name: str, origin: tuple[int, ...], box: tuple[int, ...], out: np.ndarray
    ) -> None:
        """Read a box of saved rank ``r``'s leaf.

        After a failure: zeros (the round is then retried from another level).
        """
        if r not in self.errors:
            try:
                self.sources[r].read_box(name, origin, box, out)
                return
            except CheckpointError as exc:
                self.errors[r] = str(exc)
            except KeyError:
                self.errors[r] = f"{name!r} is missing from saved rank {r}'s data"
        out.reshape(-1).view(np.uint8)[:] = 0

    def close(self) -> None:
        """Close the sources read."""
        for source in self.sources.values():
            source.close()


def _transfer(
    comm: Any,
    leaves: dict[str, _Leaf],
    targets: dict[str, list[Block]],
    serve: Any,
    openers: dict[int, Any],
    chosen: dict[int, str],
    old: int,
    per_rank: Any,
    alloc: Any,
) -> tuple[dict[str, Any], dict[int, str]]:
    """Run the moves; this rank's new flat state and the saved ranks it found damaged."""
    rank, size = comm.Get_rank(), comm.Get_size()
    alloc = alloc or (lambda key, shape, dtype: np.empty(shape, dtype))
    outputs, flat = _outputs(leaves, targets, rank, size, old, per_rank, alloc)
    mover = _Mover(comm, openers, chosen)
    # every rank runs the moves in one order, so a rank blocked in a send or receive
    # waits only for its partner's earlier moves: the moves between ranks go first, and
    # each rank's reads for itself after them run at the same time as the others'
    moves = sorted(
        _transfers(leaves, targets, old, size, per_rank), key=lambda m: serve(m[1], m[4]) == m[4]
    )
    try:
        for name, r, src, box, client, _, _ in moves:  # the disk reads ahead while we work
            if serve(r, client) == rank and math.prod(box):
                mover.prefetch(r, name, src, box)
        for name, r, src, box, client, key, dst in moves:
            server = serve(r, client)
            if (client not in (rank, -1) and rank != server) or not math.prod(box):
                continue
            mover.move(name, r, server, src, box, client, outputs[key], dst)
        mover.finish()
    finally:
        mover.close()
    for key, value in outputs.items():
        if isinstance(key, tuple):
            flat.setdefault(key[0], [None] * old)[key[1]] = value
        else:
            flat[key] = value
    return flat, mover.errors
