"""Vertex partitions (1D vertex- or edge-balanced, 2D grids, node-first) and their exchanges.

Every partition is an R x C grid of *slots*; slot ``s = i * C + j`` owns the vertex
range ``[bounds[s], bounds[s + 1])`` and sits at grid row i, column j. Its row block
``R_i`` (slots ``i*C .. i*C + C - 1``) is one contiguous vertex range, its column block
``C_j`` the union of slots ``j, C + j, 2C + j, ...``. The rank at (i, j) stores every
adjacency pair (u, v) with u in ``C_j`` and v in ``R_i``, so:

- 1D (``1d-vertex``, ``1d-edge``, ``hier``) is the 1 x P grid: a rank keeps its own
  vertices' whole adjacency; candidates travel over the row (every rank).
- 2D is an R x C grid (R <= C, as square as the rank count allows): frontiers are
  gathered along a column, candidates folded along a row (Buluc and Madduri).

``hier`` orders the slots node by node (a node's ranks own one contiguous range, cut by
edges like ``1d-edge``) and routes each exchange through the node leaders, so exactly one
message crosses the network per pair of nodes per exchange.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from hpcpar.collectives import alltoallv
from hpcpar.topology import Hierarchy

from .kronecker import GraphError
from .names import PARTITIONS

__all__ = ["PARTITIONS", "Grid", "Exchange", "grid_shape", "edge_balanced_bounds"]


def grid_shape(size: int, grid: str | None = None) -> tuple[int, int]:
    """R x C for ``size`` ranks: ``grid`` ("RxC") when given, else the squarest R <= C."""
    if grid:
        try:
            rows, cols = (int(x) for x in grid.lower().split("x"))
        except ValueError:
            raise GraphError(f"--grid wants RxC (for example 2x2), not {grid!r}") from None
        if rows < 1 or cols < 1 or rows * cols != size:
            raise GraphError(f"grid {grid} does not have {size} ranks")
        return rows, cols
    rows = max(r for r in range(1, math.isqrt(size) + 1) if size % r == 0)
    return rows, size // rows


def edge_balanced_bounds(h: Hierarchy, n: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Slot bounds so that every one of ``comm``'s size slots holds about the same degree sum.

    Degrees (self-loops excluded, duplicates counted) are computed in equal vertex blocks
    (each rank counts the endpoints routed to it), then the cut points come from the
    global prefix sum (an exclusive scan), so no rank ever holds all n degrees.
    """
    size, rank = h.size, h.rank
    comm = h.comm
    block = np.linspace(0, n, size + 1).astype(np.int64)
    keep = src != dst
    ends = np.concatenate([src[keep], dst[keep]])
    owner = np.searchsorted(block, ends, side="right") - 1
    order = np.argsort(owner, kind="stable")
    got, _ = alltoallv(ends[order], np.bincount(owner, minlength=size).tolist(), comm=h)
    lo = int(block[rank])
    degree = np.bincount(got - lo, minlength=int(block[rank + 1]) - lo).astype(np.int64)
    before = comm.exscan(int(degree.sum())) or 0
    total = comm.allreduce(int(degree.sum()))
    cumulative = before + np.cumsum(degree)  # degree sum up to and including each vertex
    targets = total * np.arange(1, size, dtype=np.float64) / size
    cuts = np.zeros(size - 1, dtype=np.int64)
    inside = (targets > before) & (targets <= before + degree.sum())
    cuts[inside] = lo + np.searchsorted(cumulative, targets[inside], side="left") + 1
    comm.Allreduce(MPI.IN_PLACE, cuts, op=MPI.MAX)
    bounds = np.concatenate([[0], np.maximum.accumulate(cuts), [n]]).astype(np.int64)
    return np.minimum(bounds, n)


@dataclass
class Grid:
    """Where slot, row and column blocks lie, and which rank holds which slot."""

    rows: int
    cols: int
    bounds: np.ndarray  # P + 1 vertex bounds, in slot order
    slot_rank: np.ndarray  # rank of comm holding each slot
    slot: int  # this rank's slot
    col_offset: np.ndarray = field(init=False)  # start of slot (r, j) in C_j's local index

    def __post_init__(self) -> None:
        self.i, self.j = divmod(self.slot, self.cols)
        sizes = np.diff(self.bounds).reshape(self.rows, self.cols)
        self.col_offset = np.concatenate([[0], np.cumsum(sizes[:, self.j])]).astype(np.int64)

    @property
    def lo(self) -> int:
        """First vertex this slot owns."""
        return int(self.bounds[self.slot])

    @property
    def hi(self) -> int:
        """One past the last vertex this slot owns."""
        return int(self.bounds[self.slot + 1])

    @property
    def row_lo(self) -> int:
        """First vertex of the row block R_i."""
        return int(self.bounds[self.i * self.cols])

    @property
    def row_hi(self) -> int:
        """One past the last vertex of the row block R_i."""
        return int(self.bounds[(self.i + 1) * self.cols])

    @property
    def col_size(self) -> int:
        """Vertices in the column block C_j."""
        return int(self.col_offset[-1])

    def owner_slot(self, v: np.ndarray) -> np.ndarray:
        """Slot owning each global vertex of ``v``."""
        return np.searchsorted(self.bounds, v, side="right") - 1

    def to_col(self, v: np.ndarray) -> np.ndarray:
        """Column-local index of vertices known to lie in this rank's column block."""
        if self.rows == 1:  # 1 x P: the column block is this slot alone
            return v - self.bounds[self.j]
        r = self.owner_slot(v) // self.cols
        return v - self.bounds[r * self.cols + self.j] + self.col_offset[r]

    def from_col(self, c: np.ndarray) -> np.ndarray:
        """Global vertex of each column-local index (the inverse of ``to_col``)."""
        if self.rows == 1:
            return c + self.bounds[self.j]
        r = np.searchsorted(self.col_offset, c, side="right") - 1
        return c - self.col_offset[r] + self.bounds[r * self.cols + self.j]

    def own_in_col(self) -> int:
        """Column-local index of this rank's first vertex."""
        return int(self.col_offset[self.i])


class Exchange:
    """Rows of int64 sent to members of a ``Hierarchy``: flat alltoallv, or through leaders.

    With ``hier=True`` a member's off-node rows go first to its node leader, leaders
    exchange one message per node pair, and leaders hand rows out on arrival (rows for the
    member's own node go straight there in the first step). ``intra``/``inter`` count the
    bytes each step moved within and between nodes, ``messages_inter`` the messages that
    crossed nodes. Every step is an ``hpcpar.alltoallv``, so its algorithm choice applies.
    """

    def __init__(self, h: Hierarchy, hier: bool = False) -> None:
        self.h = h
        self.size, self.rank = h.size, h.rank
        self.node_of = np.asarray(h.node_of, dtype=np.int64)
        self.hier = hier and h.n_nodes > 1
        self.reset()
        if self.hier:
            self.node_h = h.split(h.node_index, self.rank)
            self.lead_h = h.split(0 if h.is_leader else 1, self.rank)
            self.local_index = np.full(self.size, -1, dtype=np.int64)
            self.local_index[h.ranks_of_node(h.node_index)] = np.arange(h.local_size)
            self.leader = h.ranks_of_node(h.node_index)[0]

    def reset(self) -> None:
        """Zero the byte and message counters."""
        self.intra = self.inter = self.messages_inter = 0

    def free(self) -> None:
        """Free the communicators of the leader route (collective)."""
        if self.hier:
            for sub in (self.node_h, self.lead_h):
                comm = sub.comm
                sub.free()
                comm.Free()

    def __call__(self, dest: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Send ``rows[k]`` (an (m, w) int64 array) to member ``dest[k]``; rows received."""
        if self.hier:
            return self._through_leaders(dest, rows)
        return self._flat(self.h, dest, rows, self.node_of)

    def grouped(self, rows: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Like calling the exchange, for ``rows`` already grouped by member.

        ``counts[m]`` rows for member m, in member order: nothing is sorted.
        """
        if self.hier:
            return self._through_leaders(np.repeat(np.arange(self.size), counts), rows)
        return self._send(self.h, rows, counts, self.node_of)

    def count(
        self, nbytes: np.ndarray, h: Hierarchy | None = None, node_of: np.ndarray | None = None
    ) -> None:
        """Count ``nbytes[m]`` bytes sent to member m of ``h`` (by default this exchange's).

        Exchanges count themselves; callers count the allgathers they make beside them.
        """
        h = self.h if h is None else h
        node_of = self.node_of if node_of is None else node_of
        same = node_of == node_of[h.rank]
        self.intra += int(nbytes[same].sum() - nbytes[h.rank])
        self.inter += int(nbytes[~same].sum())
        self.messages_inter += int(np.count_nonzero(nbytes[~same]))

    def _flat(
        self, h: Hierarchy, dest: np.ndarray, rows: np.ndarray, node_of: np.ndarray
    ) -> np.ndarray:
        if h.size == 1:  # to this rank alone: nothing to sort or send
            return rows
        counts = np.bincount(dest, minlength=h.size)
        return self._send(h, rows[np.argsort(dest, kind="stable")], counts, node_of)

    def _send(
        self, h: Hierarchy, rows: np.ndarray, counts: np.ndarray, node_of: np.ndarray
    ) -> np.ndarray:
        width = rows.shape[1]
        if h.size == 1:
            return rows
        self.count(counts * width * 8, h, node_of)
        got, _ = alltoallv(rows.reshape(-1), (counts * width).tolist(), comm=h)
        return got.reshape(-1, width)

    def _labelled(
        self,
        h: Hierarchy,
        dest: np.ndarray,
        label: np.ndarray,
        rows: np.ndarray,
        node_of: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Send rows with a final-destination label each, as one message per member.

        Each message starts with the count of rows per label (P counts, padded to whole
        rows) followed by the rows sorted by label, so labels cost P counts per message
        instead of one column per row. Returns the rows received and their labels.
        """
        size, width = self.size, rows.shape[1]
        head = -(-size // width)  # rows of counts at the start of every message
        order = np.lexsort((label, dest))
        dest, label, rows = dest[order], label[order], rows[order]
        counts = np.zeros((h.size, head * width), dtype=np.int64)
        np.add.at(counts, (dest, label), 1)
        parts, targets = [], []
        bounds = np.searchsorted(dest, np.arange(h.size + 1))
        for m in range(h.size):
            parts += [counts[m].reshape(head, width), rows[bounds[m] : bounds[m + 1]]]
            targets.append(np.full(head + bounds[m + 1] - bounds[m], m, dtype=np.int64))
        got = self._flat(h, np.concatenate(targets), np.concatenate(parts), node_of)
        out, labels, at = [], [], 0
        while at < got.shape[0]:
            cnt = got[at : at + head].reshape(-1)[:size]
            n = int(cnt.sum())
            out.append(got[at + head : at + head + n])
            labels.append(np.repeat(np.arange(size), cnt))
            at += head + n
        if not out:
            return got[:0], np.empty(0, dtype=np.int64)
        return np.concatenate(out), np.concatenate(labels)

    def _through_leaders(self, dest: np.ndarray, rows: np.ndarray) -> np.ndarray:
        node_h, one_node = self.node_h, np.zeros(self.node_h.size, dtype=np.int64)
        local = self.local_index[dest]
        got, label = self._labelled(node_h, np.where(local < 0, 0, local), dest, rows, one_node)
        if self.h.is_leader:  # leaders' communicator: one leader per node, in node order
            keep = label == self.rank
            onward, onward_label = got[~keep], label[~keep]
            nodes = np.arange(self.lead_h.size)
            moved, moved_label = self._labelled(
                self.lead_h, self.node_of[onward_label], onward_label, onward, nodes
            )
            got, label = got[keep], label[keep]
        else:  # rows from this node's members, for this rank
            moved = np.empty((0, rows.shape[1]), dtype=np.int64)
            moved_label = np.empty(0, dtype=np.int64)
        out, _ = self._labelled(node_h, self.local_index[moved_label], moved_label, moved, one_node)
        return np.concatenate([got, out])
