"""What the count formulas are written in: per-rank tallies, layouts, and a rank's groups.

Pure; no MPI. An algorithm's ``counts`` function (in its module) adds to a ``Counts``
what one rank sends and reduces in one call, over the ``Groups`` of that rank: a group
(a communicator) is the node index of each of its members in communicator order, and
``me`` is the rank's position in it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property, lru_cache

import numpy as np

__all__ = ["Counts", "Layout", "Groups", "groups_of", "send_blocks", "whole_node", "one_per_node"]


@dataclass
class Counts:
    """What one rank sends and reduces in one collective call."""

    messages_intra: int = 0
    bytes_intra: int = 0
    messages_inter: int = 0
    bytes_inter: int = 0
    reduced_bytes: int = 0
    rounds_intra: int = 0
    rounds_inter: int = 0
    # bytes this rank waits to receive before it can go on (a fold's whole vector);
    # priced on its path, not counted as its messages
    waited_intra: int = 0
    waited_inter: int = 0

    def round(self, same_node: bool, k: int = 1) -> None:
        """Count ``k`` communication rounds on this rank's critical path (latency terms).

        A round costs one latency even when its message is empty: the next round
        waits for it (a ring's blocks travel one hop per round).
        """
        if same_node:
            self.rounds_intra += k
        else:
            self.rounds_inter += k

    @property
    def rounds(self) -> int:
        """All rounds."""
        return self.rounds_intra + self.rounds_inter

    def send(self, nbytes: int, same_node: bool) -> None:
        """Count one message (empty ones are never sent)."""
        if nbytes <= 0:
            return
        if same_node:
            self.messages_intra += 1
            self.bytes_intra += nbytes
        else:
            self.messages_inter += 1
            self.bytes_inter += nbytes

    def wait(self, nbytes: int, same_node: bool) -> None:
        """Count bytes this rank must receive before it can go on (not its messages)."""
        if same_node:
            self.waited_intra += nbytes
        else:
            self.waited_inter += nbytes

    def __iadd__(self, other: Counts) -> Counts:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def as_tuple(self) -> tuple[int, int, int, int, int]:
        """(messages_intra, bytes_intra, messages_inter, bytes_inter, reduced_bytes)."""
        return (
            self.messages_intra,
            self.bytes_intra,
            self.messages_inter,
            self.bytes_inter,
            self.reduced_bytes,
        )


@dataclass(frozen=True)
class Layout:
    """Which node each rank is on (the whole job), with the derived groups."""

    node_of: tuple[int, ...]

    @property
    def size(self) -> int:
        """Ranks in the job."""
        return len(self.node_of)

    @cached_property
    def node_ranks(self) -> list[list[int]]:
        """Ranks of each node, in rank order."""
        out: list[list[int]] = [[] for _ in range(max(self.node_of) + 1)]
        for r, node in enumerate(self.node_of):
            out[node].append(r)
        return out

    @cached_property
    def local_rank(self) -> list[int]:
        """Each rank's position on its node."""
        out = [0] * self.size
        for ranks in self.node_ranks:
            for i, r in enumerate(ranks):
                out[r] = i
        return out

    @property
    def contiguous(self) -> bool:
        """Whether every node holds a contiguous run of ranks."""
        return list(self.node_of) == sorted(self.node_of)


@dataclass(frozen=True)
class Groups:
    """One rank's groups (each as the node of every member) and its place in them.

    Attributes:
        flat: Every rank of the job.
        node: The rank's node; ``local`` is its place there.
        leaders: One rank per node (None unless the rank is its node's leader);
            ``node_index`` is the rank's node.
        rail: The ranks with the rank's local rank, one per node that has one;
            ``rail_me`` is its place there.
        node_ranks: The ranks of every node.
    """

    flat: list[int]
    node: list[int]
    local: int
    leaders: list[int] | None
    node_index: int
    rail: list[int]
    rail_me: int
    node_ranks: list[list[int]]


@lru_cache(maxsize=4096)
def groups_of(layout: Layout, rank: int) -> Groups:
    """The groups of ``rank`` on ``layout`` (cached)."""
    node_ranks = layout.node_ranks
    my_node = layout.node_of[rank]
    local = layout.local_rank[rank]
    rail_members = [ranks[local] for ranks in node_ranks if len(ranks) > local]
    return Groups(
        flat=list(layout.node_of),
        node=[my_node] * len(node_ranks[my_node]),
        local=local,
        leaders=list(range(len(node_ranks))) if local == 0 else None,
        node_index=my_node,
        rail=[layout.node_of[r] for r in rail_members],
        rail_me=sum(1 for ranks in node_ranks[:my_node] if len(ranks) > local),
        node_ranks=node_ranks,
    )


def send_blocks(c: Counts, counts: list[int], skipped: int, item: int, same_node: bool) -> None:
    """Every block but one goes to the same neighbour: count them all at once."""
    blocks = np.asarray(counts, dtype=np.int64)
    total = int(blocks.sum()) - int(blocks[skipped])
    messages = int(np.count_nonzero(blocks)) - (1 if blocks[skipped] else 0)
    if same_node:
        c.messages_intra += messages
        c.bytes_intra += total * item
    else:
        c.messages_inter += messages
        c.bytes_inter += total * item


def whole_node(layout: Layout, rank: int) -> int:
    """Every rank of the node drives the link (flat exchanges): the default."""
    return len(layout.node_ranks[layout.node_of[rank]])


def one_per_node(layout: Layout, rank: int) -> int:
    """Only the node's leader crosses the network."""
    return 1
