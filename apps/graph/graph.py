"""A distributed undirected graph in CSR form over a partition grid (see ``partition``).

``DistGraph.build(edges, comm=..., partition=...)`` is collective: each rank passes its
slice of the edge list; every undirected edge {a, b} (a != b) becomes the pairs (a, b)
and (b, a), each sent to the rank that stores it; self-loops are dropped from the CSR
(they never change a search) but stay in the edge list that validation reads.
Duplicates are kept. Within a vertex's adjacency edges are sorted by weight, so a
delta-stepping light/heavy split is a prefix.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from mpi4py import MPI

from hpcpar.collectives import allgather, alltoallv
from hpcpar.runtime.comm import resolve_comm
from hpcpar.topology import Hierarchy

from .kernels import scatter_rows, sort_segments
from .kronecker import EdgeList, GraphError
from .partition import PARTITIONS, Exchange, Grid, edge_balanced_bounds, grid_shape
from .sssp_kernels import light_ends

__all__ = ["DistGraph", "agree", "edge_chunks"]

_CHUNK = 1 << 22  # edges routed per alltoallv while building


def agree(comm: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run ``fn`` on every rank; if it raised ``GraphError`` anywhere, raise it everywhere."""
    error = None
    try:
        result = fn(*args, **kwargs)
    except GraphError as exc:
        error, result = str(exc), None
    errors = comm.allgather(error)
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise GraphError(first)
    return result


class DistGraph:
    """One rank's share of a partitioned graph (build with ``DistGraph.build``).

    Attributes:
        grid: The partition (slot bounds, grid position, slot owners).
        indptr, adj, weight: CSR over this rank's column block; ``adj`` is row-block-local.
        degree: Degree (self-loops excluded, duplicates counted) of each owned vertex.
        n: Vertices; ``m``: edges of the input list (all ranks).
        row_x, col_x: Exchanges along the grid row and column; ``world_x`` over all ranks.
        build_seconds: Wall time of ``build`` (the spec's construction time).
    """

    def __init__(self) -> None:
        raise TypeError("use DistGraph.build(...)")

    @classmethod
    def build(
        cls,
        edges: EdgeList,
        *,
        comm: Any = None,
        partition: str = "1d-vertex",
        grid: str | None = None,
        layout: str | None = None,
    ) -> DistGraph:
        """Partition and distribute ``edges`` (this rank's slice); collective.

        ``comm`` may be a ``Hierarchy`` (its layout is used); otherwise ``layout`` or
        ``HPCPAR_LAYOUT`` or the real nodes say which ranks share a node.

        Raises:
            GraphError: unknown partition, a grid that does not fit, vertex ids outside
                [0, n), or a graph too large to index.
        """
        if partition not in PARTITIONS:
            raise GraphError(
                f"unknown partition {partition!r}; choose from {', '.join(PARTITIONS)}"
            )
        self = object.__new__(cls)
        start = time.perf_counter()
        if isinstance(comm, Hierarchy):
            comm, layout = comm.comm, comm.layout
        self.comm = resolve_comm(comm).Dup()
        size, rank = self.comm.Get_size(), self.comm.Get_rank()
        self.h = Hierarchy(self.comm, layout=layout)
        node_of = list(self.h.node_of)
        n = int(edges.n_vertices)
        self.n, self.m, self.partition = n, int(self.comm.allreduce(edges.src.size)), partition
        agree(self.comm, _check_ids, edges)
        rows, cols = grid_shape(size, grid) if partition == "2d" else (1, size)
        if partition in ("1d-edge", "hier"):
            bounds = edge_balanced_bounds(self.h, n, edges.src, edges.dst)
        else:
            bounds = np.linspace(0, n, size + 1).astype(np.int64)
        if partition == "hier":
            slot_rank = np.array(sorted(range(size), key=lambda r: (node_of[r], r)))
        else:
            slot_rank = np.arange(size)
        slot = int(np.flatnonzero(slot_rank == rank)[0])
        self.grid = g = Grid(rows, cols, bounds, slot_rank, slot)
        # Row and column communicators, ranks in slot order along each.
        self.row_h = self.h.split(g.i, g.j)
        self.col_h = self.h.split(g.j, g.i)
        self.row_comm, self.col_comm = self.row_h.comm, self.col_h.comm
        self.row_x = Exchange(self.row_h, hier=partition == "hier")
        self.col_x = Exchange(self.col_h)
        self.world_x = Exchange(self.h)
        self._distribute(edges)
        self.build_seconds = time.perf_counter() - start
        return self

    def _distribute(self, edges: EdgeList) -> None:
        """Route both directions of every edge to the rank storing it, then build the CSR.

        Each chunk received is narrowed at once (column-local source and row-local target
        as int32 where they fit, weight as float64) and freed as it is scattered into the
        CSR, so the peak is about the narrowed pairs plus the CSR.
        """
        g = self.grid
        col_type = np.int32 if g.col_size < 1 << 31 else np.int64
        # row-block-local targets: 4 bytes each while the row block has under 2^31 vertices
        row_type = np.int32 if g.row_hi - g.row_lo < 1 << 31 else np.int64
        parts = []
        counts = np.zeros(g.col_size, dtype=np.int64)
        for a, b, w in edge_chunks(self.comm, edges, _CHUNK):
            u, v = np.concatenate([a, b]), np.concatenate([b, a])
            su, sv = g.owner_slot(u), g.owner_slot(v)
            dest = g.slot_rank[(sv // g.cols) * g.cols + su % g.cols]
            rows = np.stack([u, v, np.concatenate([w, w]).view(np.int64)], axis=1)
            del a, b, w, u, v, su, sv
            got = self.world_x(dest, rows)
            del rows, dest
            ucol = g.to_col(got[:, 0]).astype(col_type)
            parts.append(
                (ucol, (got[:, 1] - g.row_lo).astype(row_type), got[:, 2].view(np.float64).copy())
            )
            counts += np.bincount(ucol, minlength=g.col_size)
            del got
        self.indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.adj = np.empty(int(self.indptr[-1]), dtype=row_type)
        self.weight = np.empty(int(self.indptr[-1]))
        pos = self.indptr[:-1].copy()
        while parts:  # in arrival order, each part freed once placed
            scatter_rows(*parts.pop(0), pos, self.adj, self.weight)
        sort_segments(self.indptr, self.adj, self.weight)
        if self.col_comm.Get_size() > 1:  # degrees: this column block's counts, summed
            self.col_comm.Allreduce(MPI.IN_PLACE, counts, op=MPI.SUM)
        start = g.own_in_col()
        self.degree = counts[start : start + g.hi - g.lo].copy()

    # ---- small collectives every kernel uses ----------------------------------------

    @property
    def own(self) -> int:
        """Number of vertices this rank owns."""
        return self.grid.hi - self.grid.lo

    def gather_col(self, x: np.ndarray) -> np.ndarray:
        """Concatenate every column member's ``x`` (1-D int64/float64), in row order."""
        if self.col_h.size == 1:
            return x
        counts = self.col_comm.allgather(x.size)
        self.sent_to_all(self.col_h, x.nbytes)
        return allgather(x, counts=counts, comm=self.col_h)

    def sent_to_all(self, h: Hierarchy, nbytes: int) -> None:
        """Count an allgather over the row or column ``h`` that sent ``nbytes`` a member."""
        x = self.row_x if h is self.row_h else self.col_x
        x.count(np.full(h.size, nbytes, dtype=np.int64))

    def gather_bits(self, h: Hierarchy, mask: np.ndarray, sizes: list[int]) -> np.ndarray:
        """Concatenate members' boolean masks (sent as bits) into one bool array."""
        if h.size == 1:
            return mask
        packed = np.packbits(mask)
        counts = [-(-s // 8) for s in sizes]
        self.sent_to_all(h, packed.nbytes)
        got = allgather(packed, counts=counts, comm=h)
        out, at = [], 0
        for s, c in zip(sizes, counts, strict=True):
            out.append(np.unpackbits(got[at : at + c], count=s).view(bool))
            at += c
        return np.concatenate(out)

    def linked(self) -> np.ndarray:
        """The owned vertices (local indices) with at least one edge, computed once."""
        if getattr(self, "_linked", None) is None:
            self._linked = np.flatnonzero(self.degree > 0)
        return self._linked

    def light_ends(self, delta: float) -> np.ndarray:
        """Where each CSR row's edges lighter than ``delta`` end (kept for the last delta)."""
        kept = getattr(self, "_light", None)
        if kept is None or kept[0] != delta:
            self._light = kept = (delta, light_ends(self.indptr, self.weight, delta))
        return kept[1]

    def weight_cdf(self) -> np.ndarray:
        """The fraction of this rank's edges lighter than ``i * top / 1024``, i = 0..1024.

        ``top``, the heaviest finite weight, is appended; estimated from 4,096 weights
        drawn at random (seeded) and computed once.
        """
        if getattr(self, "_cdf", None) is None:
            finite = self.weight[np.isfinite(self.weight)]
            top = float(finite.max()) if finite.size else 0.0
            sample = np.sort(np.random.default_rng(0).choice(self.weight, 4096)) if top else []
            steps = np.linspace(0.0, top, 1025)
            self._cdf = np.append(np.searchsorted(sample, steps) / 4096, top)
        return self._cdf

    def row_sizes(self) -> list[int]:
        """Vertices owned by each member of this rank's grid row, in row order."""
        g = self.grid
        return [
            int(g.bounds[g.i * g.cols + jj + 1] - g.bounds[g.i * g.cols + jj])
            for jj in range(g.cols)
        ]

    def col_sizes(self) -> list[int]:
        """Vertices owned by each member of this rank's grid column, in column order."""
        g = self.grid
        return [
            int(g.bounds[r * g.cols + g.j + 1] - g.bounds[r * g.cols + g.j]) for r in range(g.rows)
        ]

    def owner_rank(self, v: np.ndarray) -> np.ndarray:
        """Rank (of ``comm``) owning each global vertex of ``v``."""
        return self.grid.slot_rank[self.grid.owner_slot(v)]

    def lookup(self, values: list[np.ndarray], query: np.ndarray) -> list[np.ndarray]:
        """Each owned-vertex array of ``values`` (int64 or float64) read at global ``query``."""
        dest = self.owner_rank(query)
        order = np.argsort(dest, kind="stable")
        size = self.comm.Get_size()
        counts = np.bincount(dest, minlength=size).tolist()
        asked, asked_counts = alltoallv(query[order], counts, comm=self.h)
        local = asked - self.grid.lo
        reply = (
            np.stack([np.asarray(a)[local].view(np.int64) for a in values], axis=1)
            if values
            else np.empty((asked.size, 0), dtype=np.int64)
        )
        width = reply.shape[1]
        back, _ = alltoallv(reply.reshape(-1), [c * width for c in asked_counts], comm=self.h)
        back = back.reshape(-1, width)
        out = np.empty_like(back)
        out[order] = back
        return [
            out[:, k].view(a.dtype) if a.dtype == np.float64 else out[:, k]
            for k, a in enumerate(values)
        ]

    def send_to_owner(self, query: np.ndarray) -> np.ndarray:
        """Global vertex ids sent to their owners; the owned ones received, as local indices."""
        rows = self.world_x(self.owner_rank(query), query[:, None])
        return rows[:, 0] - self.grid.lo

    def load_imbalance(self) -> dict[str, Any]:
        """Per-rank vertices, stored adjacency entries, exchange volume and graph bytes."""
        held = sum(a.nbytes for a in (self.indptr, self.adj, self.weight, self.degree))
        mine = [
            self.own,
            int(self.adj.size),
            self.row_x.intra + self.col_x.intra,
            self.row_x.inter + self.col_x.inter,
            held,
        ]
        table = np.array(self.comm.allgather(mine), dtype=np.int64)
        names = ("vertices", "entries", "bytes_intra", "bytes_inter", "graph_bytes")
        return {name: table[:, k].tolist() for k, name in enumerate(names)}

    def reset_volume(self) -> None:
        """Zero the exchange byte counters (before a measured search)."""
        self.row_x.reset()
        self.col_x.reset()

    def free(self) -> None:
        """Free the communicators (collective)."""
        for x in (self.row_x, self.col_x, self.world_x):
            x.free()
        for h in (self.row_h, self.col_h, self.h):
            h.free()
        for c in (self.row_comm, self.col_comm, self.comm):
            c.Free()


def edge_chunks(comm: Any, edges: EdgeList, size: int) -> Any:
    """This rank's edges ``size`` at a time as (src, dst, weight), self-loops dropped.

    Every rank gets as many chunks (some empty), so a collective per chunk is safe.
    """
    rounds = max(1, -(-int(comm.allreduce(edges.src.size, op=MPI.MAX)) // size))
    for k in range(rounds):
        part = slice(k * size, (k + 1) * size)
        a, b, w = edges.src[part], edges.dst[part], edges.weight[part]
        keep = a != b
        yield a[keep], b[keep], w[keep]


def _check_ids(edges: EdgeList) -> None:
    n = edges.n_vertices
    for name, x in (("source", edges.src), ("destination", edges.dst)):
        if x.size and (x.min() < 0 or x.max() >= n):
            bad = x[(x < 0) | (x >= n)][0]
            raise GraphError(f"{name} vertex {bad} is outside [0, {n})")
