"""Distributed BFS (direction-optimising) and SSSP (delta-stepping) on a ``DistGraph``.

BFS is level-synchronous. Top-down: the frontier is gathered along each grid column,
every rank expands the frontier vertices of its column block into candidate (child,
parent) pairs for its row block, and candidates are folded along the row to their
owners, where the first one wins. Bottom-up: the frontier (as a bitmap) is gathered along
the row and the visited bitmap along the column; every unvisited vertex of the column
block looks for its first neighbour in the frontier (numba, early exit, probing the
frontier as a bitmap of one bit a vertex) and the finds are
folded along the column. The switch follows Beamer et al.: top-down -> bottom-up when
the frontier's edges exceed the unvisited vertices' edges / alpha, back when the frontier
holds fewer than n / beta vertices and shrinks. On a 1 x P grid (``_bfs_row``) a rank
holds its vertices' whole adjacency, so a level is one kernel, one exchange and one
allreduce: top-down candidates leave the kernel packed and grouped by owner; bottom-up,
members' frontier bitmaps are allgathered and the kernel sets parents itself.

SSSP is Meyer and Sanders' delta-stepping: buckets of width delta; light edges (w <
delta) are relaxed until the current bucket stops changing, then heavy edges once.
Relaxations travel like top-down candidates (gather along the column, fold along the row);
on a 1 x P grid a kernel packs them and groups them by owner, so nothing is sorted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from hpcpar.collectives import allgather

from .graph import DistGraph
from .kernels import (
    bitmap,
    bu_scan,
    bu_step,
    claim,
    claim_packed,
    frontier_bits,  # fmt: skip
    group_candidates,
    improve,
    improve_packed,
    join_bits,
    relax,
    td_expand,
    td_route,
)
from .kronecker import GraphError

__all__ = ["bfs", "sssp", "SearchResult"]


@dataclass
class SearchResult:
    """A search's answer for the owned vertices, and what it did."""

    root: int
    parent: np.ndarray  # global parent of each owned vertex, -1 when unreached
    dist: np.ndarray | None = None  # SSSP distances (inf when unreached)
    levels: list[str] = field(default_factory=list)  # "td"/"bu" per BFS level
    rounds: int = 0  # SSSP: relaxation rounds

    def traversed_edges(self, g: DistGraph) -> int:
        """Input edges (self-loops excluded) with both ends in the searched component."""
        local = int(g.degree[self.parent >= 0].sum())
        return g.comm.allreduce(local) // 2


def _check_root(g: DistGraph, root: int) -> None:
    if not 0 <= root < g.n:
        raise GraphError(f"root {root} is outside [0, {g.n})")
    lo = g.grid.lo
    degree = int(g.degree[root - lo]) if lo <= root < g.grid.hi else 0
    if g.comm.allreduce(degree) == 0:
        raise GraphError(f"root {root} has degree 0 (the specification searches from "
                         f"vertices with at least one edge that is not a self-loop)")  # fmt: skip


def _switch(direction: str, top_down: bool, n_f: int, m_f: int, m_u: int, previous: int,
            n: int, alpha: float, beta: float) -> bool:  # fmt: skip
    """Beamer's switch: whether the next level goes top-down (``direction`` "auto")."""
    if direction == "auto":
        if top_down and m_f > m_u / alpha:
            return False
        if not top_down and n_f < n / beta and n_f < previous:
            return True
    return top_down


def bfs(g: DistGraph, root: int, *, direction: str = "auto", alpha: float = 14.0,
        beta: float = 24.0) -> SearchResult:  # fmt: skip
    """Breadth-first search from ``root`` (collective); ``direction``: auto, top-down, bottom-up."""
    if direction not in ("auto", "top-down", "bottom-up"):
        raise GraphError(f"direction must be auto, top-down or bottom-up, not {direction!r}")
    _check_root(g, root)
    if g.grid.rows == 1 and g.n < 1 << 31:
        return _bfs_row(g, root, direction, alpha, beta)
    grid, lo = g.grid, g.grid.lo
    parent = np.full(g.own, -1, dtype=np.int64)
    frontier = np.empty(0, dtype=np.int64)
    if lo <= root < grid.hi:
        parent[root - lo] = root
        frontier = np.array([root - lo], dtype=np.int64)
    seen = np.zeros(grid.row_hi - grid.row_lo, dtype=bool)
    if grid.row_lo <= root < grid.row_hi:
        seen[root - grid.row_lo] = True
    row_sizes, col_sizes = g.row_sizes(), g.col_sizes()
    totals = np.array([1, int(g.degree.sum()), 0], dtype=np.int64)  # n_f, m_u, m_f
    g.comm.Allreduce(MPI.IN_PLACE, totals)
    n_f, m_u, m_f, previous = int(totals[0]), int(totals[1]), 0, 0
    top_down, levels = direction != "bottom-up", []
    while n_f > 0:
        top_down = _switch(direction, top_down, n_f, m_f, m_u, previous, g.n, alpha, beta)
        levels.append("td" if top_down else "bu")
        if top_down:
            glob = g.gather_col(frontier + lo)
            v, p = td_expand(g.indptr, g.adj, grid.to_col(glob), glob, seen)
            v += grid.row_lo
            got = g.row_x(grid.owner_slot(v) - grid.i * grid.cols, np.stack([v, p], axis=1))
        else:
            mask = np.zeros(g.own, dtype=bool)
            mask[frontier] = True
            front = g.gather_bits(g.row_h, mask, row_sizes)
            visited = g.gather_bits(g.col_h, parent >= 0, col_sizes)
            c, v = bu_scan(g.indptr, g.adj, np.flatnonzero(~visited), bitmap(front))
            u = grid.from_col(c)
            got = g.col_x(grid.owner_slot(u) // grid.cols, np.stack([u, v + grid.row_lo], axis=1))
        frontier = claim(parent, got[:, 0] - lo, got[:, 1])
        deg = g.degree[frontier]
        totals[:] = (frontier.size, -int(deg.sum()), int(deg.sum()))
        g.comm.Allreduce(MPI.IN_PLACE, totals)
        previous = n_f
        n_f, m_u, m_f = int(totals[0]), m_u + int(totals[1]), int(totals[2])
    return SearchResult(root, parent, levels=levels)


def _bfs_row(g: DistGraph, root: int, direction: str, alpha: float,
             beta: float) -> SearchResult:  # fmt: skip
    """``bfs`` on a 1 x P grid, where a rank holds its own vertices' whole adjacency.

    A level is one compiled kernel, one exchange and one small allreduce. Top-down sends
    candidates packed, (vertex << 32) | parent, grouped by owner in the kernel; bottom-up
    gathers the frontier as a bitmap over all vertices (each rank's bits, whole bytes)
    and every rank sets its own unvisited vertices' parents directly, scanning only the
    vertices with edges that earlier bottom-up levels left unvisited. Vertices in gathered
    frontiers join the ``seen`` bitmap, so later top-down levels do not send them again.
    """
    grid, lo = g.grid, g.grid.lo
    bounds = np.ascontiguousarray(grid.bounds, dtype=np.int64)
    sizes = np.diff(bounds)
    nbytes = [int(-(-s // 8)) for s in sizes]
    aligned = all(s % 8 == 0 for s in sizes[:-1])
    parent = np.full(g.own, -1, dtype=np.int64)
    frontier = np.empty(0, dtype=np.int64)
    seen = np.zeros((g.n + 7) >> 3, dtype=np.uint8)
    seen[root >> 3] |= np.uint8(1 << (root & 7))
    if lo <= root < grid.hi:
        parent[root - lo] = root
        frontier = np.array([root - lo], dtype=np.int64)
    totals = np.array([1, int(g.degree.sum()), 0], dtype=np.int64)  # n_f, m_u, m_f
    g.comm.Allreduce(MPI.IN_PLACE, totals)
    n_f, m_u, m_f, previous = int(totals[0]), int(totals[1]), 0, 0
    top_down, levels = direction != "bottom-up", []
    todo, left = None, 0  # owned vertices bottom-up still has to find
    while n_f > 0:
        top_down = _switch(direction, top_down, n_f, m_f, m_u, previous, g.n, alpha, beta)
        levels.append("td" if top_down else "bu")
        if top_down:
            cand, counts = td_route(g.indptr, g.adj, frontier, lo, parent, seen, bounds,
                                    grid.slot)  # fmt: skip
            got = g.row_x.grouped(cand, counts)
            frontier, edges = claim_packed(parent, got[:, 0], lo, g.degree)
        else:
            mine = frontier_bits(frontier, g.own)
            got = allgather(mine, counts=nbytes, comm=g.row_h) if g.row_h.size > 1 else mine
            if aligned:
                front = got
                seen[: front.size] |= front
            else:
                front = join_bits(got, sizes, np.zeros_like(seen))
                seen |= front
            if todo is None:
                todo = g.linked().copy()
                left = todo.size
            frontier, edges, left = bu_step(g.indptr, g.adj, parent, todo, left, front,
                                            g.degree)  # fmt: skip
        totals[:] = (frontier.size, -edges, edges)
        g.comm.Allreduce(MPI.IN_PLACE, totals)
        previous = n_f
        n_f, m_u, m_f = int(totals[0]), m_u + int(totals[1]), int(totals[2])
    return SearchResult(root, parent, levels=levels)


def sssp(g: DistGraph, root: int, *, delta: float = 0.1) -> SearchResult:
    """Single-source shortest paths from ``root`` by delta-stepping (collective).

    ``delta=inf`` is Bellman-Ford: one bucket, every edge light, rounds of relaxation
    until no distance changes.
    """
    if not delta > 0:
        raise GraphError(f"delta must be positive, not {delta}")
    _check_root(g, root)
    grid, lo = g.grid, g.grid.lo
    dist = np.full(g.own, np.inf)
    parent = np.full(g.own, -1, dtype=np.int64)
    done = np.zeros(g.own, dtype=bool)
    mark = np.zeros(g.own, dtype=bool)
    settled = np.zeros(g.own, dtype=bool)
    best = np.full(grid.row_hi - grid.row_lo, np.inf)
    if lo <= root < grid.hi:
        dist[root - lo], parent[root - lo] = 0.0, root
    if grid.row_lo <= root < grid.row_hi:
        best[root - grid.row_lo] = 0.0
    rounds = 0
    packed = grid.rows == 1 and g.n < 1 << 31  # candidates fit (vertex << 32) | parent
    bounds = np.ascontiguousarray(grid.bounds, dtype=np.int64)

    def step(active: np.ndarray, light: bool) -> np.ndarray:
        nonlocal rounds
        rounds += 1
        glob = g.gather_col(active + lo)
        d = g.gather_col(dist[active])
        v, nd, p = relax(g.indptr, g.adj, g.weight, grid.to_col(glob), d, glob, light,
                         delta, best)  # fmt: skip
        v += grid.row_lo
        if packed:  # one kernel groups them by owner: nothing to sort
            rows, counts = group_candidates(v, nd, p, bounds)
            return improve_packed(dist, parent, g.row_x.grouped(rows, counts), lo, mark)
        rows = np.stack([v, nd.view(np.int64), p], axis=1)
        got = g.row_x(grid.owner_slot(v) - grid.i * grid.cols, rows)
        return improve(dist, parent, got[:, 0] - lo, got[:, 1].view(np.float64), got[:, 2], mark)

    while True:
        pending = np.flatnonzero(~done & (parent >= 0))
        low = float(np.floor(dist[pending].min() / delta)) if pending.size else np.inf
        bucket = g.comm.allreduce(low, op=MPI.MIN)
        if bucket == np.inf:
            break
        active = pending[np.floor(dist[pending] / delta) == bucket]
        while g.comm.allreduce(active.size) > 0:
            done[active] = True
            settled[active] = True
            changed = step(active, True)
            done[changed] = False
            active = changed[np.floor(dist[changed] / delta) == bucket]
        members = np.flatnonzero(settled)  # every vertex settled in this bucket, once
        settled[members] = False
        done[step(members, False)] = False
    return SearchResult(root, parent, dist=dist, rounds=rounds)
