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

from pathlib import Path
from typing import Any

from ..sharding import Block
from ..sources import find_sources
from ..state import CheckpointError
from .move import transfer
from .plan import (
    PER_RANK,
    LayoutError,
    Leaf,
    add_layouts,
    choose,
    leaves_of,
    per_rank_problem,
    pick,
    servers_of,
    summary,
    target_blocks,
)

__all__ = ["restore_resharded", "PER_RANK", "LayoutError"]


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
        chosen = choose(names, seen, bad, old, step)
        summaries = _manifests(comm, openers, chosen, seen, old)
        failed = [r for r in range(old) if isinstance(summaries[r], str)]
        if failed:
            bad.update((r, chosen[r]) for r in failed)
            continue
        tree, leaves = leaves_of([summaries[r] for r in range(old)])
        problem = per_rank_problem(leaves, old, size, per_rank)
        if problem:
            raise LayoutError(problem)
        targets = _targets(comm, leaves, reshard)
        servers = servers_of(leaves, targets, seen, chosen, old, size)

        def serve(
            r: int, client: int, servers: dict[int, int] = servers, chosen: dict[int, str] = chosen
        ) -> int:
            """Who reads a move: its client if it sees the data (no message).

            Else the saved rank's server reads it and sends or broadcasts it.
            """
            return client if client >= 0 and chosen[r] in seen[client][r] else servers[r]

        flat, errors = transfer(comm, leaves, targets, serve, openers, chosen, old, per_rank, alloc)
        every = {}
        for part in comm.allgather(errors):
            every.update(part)
        if every:
            bad.update((r, chosen[r]) for r in every)
            continue
        add_layouts(flat, tree, leaves, {n: t[rank] for n, t in targets.items()})
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
        if pick([k for k in range(size) if chosen[r] in seen[k][r]], r % size) != rank:
            continue
        try:
            source = openers[r][chosen[r]]()
            mine[r] = summary(source)
            source.close()
        except CheckpointError as exc:
            mine[r] = str(exc)
    summaries: dict[int, Any] = {}
    for part in comm.allgather(mine):
        summaries.update(part)
    return summaries


def _targets(comm: Any, leaves: dict[str, Leaf], reshard: Any) -> dict[str, list[Block]]:
    """Every rank's target block of every sharded leaf (all ranks agree, or all raise)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    every = comm.allgather(target_blocks(leaves, reshard, rank, size))
    problems = [p for _, p in every if p]
    if problems:
        raise LayoutError(problems[0])
    return {name: [every[k][0][name] for k in range(size)] for name in every[0][0]}
