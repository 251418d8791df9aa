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
Relaxations travel like top-down candidates (gather along the column, fold along the row).
On a 1 x P grid (``_sssp_row``) owned targets are improved inside the relaxing kernel,
the others travel packed and grouped by owner, and a settled bucket's heavy edges are
pushed or pulled (Chakaravarthy et al.), whichever scans fewer edges.
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
    frontier_bits,
    improve,
    join_bits,
    relax,
    td_expand,
    td_route,
)
from .kronecker import GraphError
from .sssp_kernels import (
    HEAVY,
    MEMBERS,
    NXT,
    PEND,
    UNREACHED,
    UNREACHED_EDGES,
    sssp_apply,
    sssp_mark,
    sssp_pull,
    sssp_relax,
    sssp_settle,
    sssp_take,
    sssp_unmark,
)

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
        raise GraphError(
            f"root {root} has degree 0 (the specification searches from "
            f"vertices with at least one edge that is not a self-loop)"
        )


def _switch(
    direction: str,
    top_down: bool,
    n_f: int,
    m_f: int,
    m_u: int,
    previous: int,
    n: int,
    alpha: float,
    beta: float,
) -> bool:
    """Beamer's switch: whether the next level goes top-down (``direction`` "auto")."""
    if direction == "auto":
        if top_down and m_f > m_u / alpha:
            return False
        if not top_down and n_f < n / beta and n_f < previous:
            return True
    return top_down


def bfs(
    g: DistGraph, root: int, *, direction: str = "auto", alpha: float = 14.0, beta: float = 24.0
) -> SearchResult:
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


def _bfs_row(g: DistGraph, root: int, direction: str, alpha: float, beta: float) -> SearchResult:
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
            cand, counts = td_route(g.indptr, g.adj, frontier, lo, parent, seen, bounds, grid.slot)
            got = g.row_x.grouped(cand, counts)
            frontier, edges = claim_packed(parent, got[:, 0], lo, g.degree)
        else:
            mine = frontier_bits(frontier, g.own)
            got = mine
            if g.row_h.size > 1:
                g.sent_to_all(g.row_h, mine.nbytes)
                got = allgather(mine, counts=nbytes, comm=g.row_h)
            if aligned:
                front = got
                seen[: front.size] |= front
            else:
                front = join_bits(got, sizes, np.zeros_like(seen))
                seen |= front
            if todo is None:
                todo = g.linked().copy()
                left = todo.size
            frontier, edges, left = bu_step(g.indptr, g.adj, parent, todo, left, front, g.degree)
        totals[:] = (frontier.size, -edges, edges)
        g.comm.Allreduce(MPI.IN_PLACE, totals)
        previous = n_f
        n_f, m_u, m_f = int(totals[0]), m_u + int(totals[1]), int(totals[2])
    return SearchResult(root, parent, levels=levels)


def sssp(g: DistGraph, root: int, *, delta: float = 0.1, direction: str = "auto") -> SearchResult:
    """Single-source shortest paths from ``root`` by delta-stepping (collective).

    ``delta=inf`` is Bellman-Ford: one bucket, every edge light, rounds of relaxation
    until no distance changes. ``direction`` says how a settled bucket's heavy edges are
    relaxed on a 1 x P grid: ``push`` (its members send), ``pull`` (waiting vertices
    look for members) or ``auto`` (whichever scans fewer edges, bucket by bucket); 2D
    grids push.

    Raises:
        GraphError: delta not positive, an unknown direction, ``pull`` on a 2D grid, or
            a root outside the graph or without edges.
    """
    if not delta > 0:
        raise GraphError(f"delta must be positive, not {delta}")
    if direction not in ("auto", "push", "pull"):
        raise GraphError(f"direction must be auto, push or pull, not {direction!r}")
    row = g.grid.rows == 1 and g.n < 1 << 31
    if direction == "pull" and not row:
        raise GraphError(f"SSSP pulls only on a 1 x P grid, not {g.grid.rows} x {g.grid.cols}")
    _check_root(g, root)
    if row:
        return _sssp_row(g, root, delta, direction)
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

    def step(active: np.ndarray, light: bool) -> np.ndarray:
        nonlocal rounds
        rounds += 1
        glob = g.gather_col(active + lo)
        d = g.gather_col(dist[active])
        v, nd, p = relax(g.indptr, g.adj, g.weight, grid.to_col(glob), d, glob, light, delta, best)
        v += grid.row_lo
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


def _sssp_row(g: DistGraph, root: int, delta: float, direction: str) -> SearchResult:
    """``sssp`` on a 1 x P grid, where a rank holds its own vertices' whole adjacency.

    Light edges are pushed: owned targets are improved inside the relaxing kernel and
    only the others travel, packed. After a bucket settles, its heavy edges are pushed
    the same way, or pulled (Chakaravarthy et al.) when that scans fewer edges: the
    members and their distances are allgathered and every waiting or unreached vertex
    looks for a member along its edges lighter than its distance less the members'
    least distance, a prefix of its weight-sorted row. Waiting vertices sit in a list
    scanned once per bucket; the kernels keep the lowest bucket of the rest as distances
    fall, so no pass over every vertex is made. A round is one kernel, one exchange and
    one small allgather or allreduce.
    """
    run = _Buckets(g, root, delta)
    both = np.array([0.0, run.low[0]])  # -(vertices reopened), lowest bucket
    g.comm.Allreduce(MPI.IN_PLACE, both, op=MPI.MIN)
    while both[1] != np.inf:
        pull_edges = run.take(both[1])
        while True:  # light rounds, then the members' heavy edges, until nothing reopens
            table = run.light_rounds(pull_edges)
            pulls, pushes = table[:, 2].sum(), table[:, 1].sum()
            if direction == "pull" or (direction == "auto" and pulls < pushes):
                run.pull(table[:, 3])
            else:
                run.push(run.members, int(run.size[MEMBERS]), light=False)
            both[:] = -run.size[NXT], run.low[0]
            g.comm.Allreduce(MPI.IN_PLACE, both, op=MPI.MIN)
            if both[0] == 0:
                break
    return SearchResult(root, run.parent, dist=run.dist.copy(), rounds=run.rounds)


class _Buckets:
    """The state of one ``_sssp_row`` search (owned vertices, local indices).

    The arrays are those ``sssp_kernels`` describes: ``state``, ``pend``, ``nxt`` and
    ``mark``, ``members``, ``unreached`` and the lengths in ``size``.
    """

    def __init__(self, g: DistGraph, root: int, delta: float) -> None:
        self.g, self.delta, own, lo = g, delta, g.own, g.grid.lo
        self.lo = lo
        self.bounds = np.ascontiguousarray(g.grid.bounds, dtype=np.int64)
        self.ends, self.cdf = g.light_ends(delta), g.weight_cdf()
        self.best = np.full(g.n, np.inf)  # owned: the distances; others: least sent or known
        self.dist = self.best[lo : g.grid.hi]
        self.parent = np.full(own, -1, dtype=np.int64)
        self.state = np.zeros(own, dtype=np.uint8)
        self.mark = np.zeros(own, dtype=bool)
        self.stamp = np.zeros(own, dtype=np.int64)  # the bucket pass a member last joined
        self.pend, self.nxt, self.active, self.members = (
            np.empty(own, dtype=np.int64) for _ in range(4)
        )
        self.unreached = g.linked().copy()
        self.size = np.zeros(6, np.int64)  # the lengths at sssp_kernels' named slots
        self.size[UNREACHED], self.size[UNREACHED_EDGES] = self.unreached.size, g.degree.sum()
        self.low = np.array([np.inf])  # the lowest bucket waiting here
        self.member = np.zeros((g.n + 7) >> 3, dtype=np.uint8)  # when pulling
        self.mine = np.zeros(4, dtype=np.int64)  # reopened, push edges, pull edges, members
        self.table = np.zeros((g.row_comm.Get_size(), 4), dtype=np.int64)
        self.rounds, self.epoch, self.top = 0, 0, 0.0
        if lo <= root < g.grid.hi:
            x = root - lo
            self.dist[x], self.parent[x], self.state[x] = 0.0, root, 1
            self.pend[0], self.size[PEND], self.low[0] = x, 1, 0.0
            self.size[UNREACHED_EDGES] -= g.degree[x]

    def take(self, bucket: float) -> float:
        """Start ``bucket``: its waiting members go to ``nxt``.

        Returns the pull estimate of the waiting vertices' rows (``sssp_take``).
        """
        self.top = bucket + 1.0
        return sssp_take(
            self.pend,
            self.size,
            self.state,
            self.dist,
            self.delta,
            bucket,
            self.nxt,
            self.mark,
            self.low,
            self.g.degree,
            self.cdf,
        )

    def light_rounds(self, pull_edges: float) -> np.ndarray:
        """Settle ``nxt`` and push its light edges until no rank reopens a vertex.

        Returns every rank's [reopened, push edges, pull edges, members] of the last round.
        """
        self.epoch += 1
        self.size[MEMBERS] = self.size[HEAVY] = 0
        size, g = self.size, self.g
        while True:
            count = sssp_settle(
                self.nxt,
                int(size[NXT]),
                self.state,
                self.mark,
                self.stamp,
                self.epoch,
                self.members,
                size,
                g.indptr,
                self.ends,
                self.active,
            )
            size[NXT] = 0
            self.push(self.active, count, light=True)
            self.mine[:] = (
                size[NXT],
                size[HEAVY],
                int(pull_edges) + size[UNREACHED_EDGES],
                size[MEMBERS],
            )
            g.row_comm.Allgather(self.mine, self.table)
            if self.table[:, 0].sum() == 0:
                return self.table

    def push(self, todo: np.ndarray, count: int, light: bool) -> None:
        """Relax the light or heavy edges of ``todo[:count]``; exchange the others'."""
        g, lo, top, delta = self.g, self.lo, self.top, self.delta
        self.rounds += 1
        rows, counts = sssp_relax(
            g.indptr,
            g.adj,
            g.weight,
            self.ends,
            todo,
            count,
            light,
            self.best,
            self.parent,
            self.state,
            self.pend,
            self.nxt,
            self.mark,
            self.size,
            self.low,
            top,
            delta,
            lo,
            self.bounds,
            g.degree,
        )
        got = g.row_x.grouped(rows, counts)
        sssp_apply(
            got,
            lo,
            self.dist,
            self.parent,
            self.state,
            self.pend,
            self.nxt,
            self.mark,
            self.size,
            self.low,
            top,
            delta,
            g.degree,
        )

    def pull(self, counts: np.ndarray) -> None:
        """Every waiting or unreached vertex pulls through the members (``counts`` a rank)."""
        g, lo, m = self.g, self.lo, int(self.size[MEMBERS])
        self.rounds += 1
        rows = np.empty((m, 2), dtype=np.int64)
        rows[:, 0] = self.members[:m] + lo
        rows[:, 1] = self.dist[self.members[:m]].view(np.int64)
        got = rows
        if counts.size > 1:
            g.sent_to_all(g.row_h, rows.nbytes)
            got = allgather(rows.reshape(-1), counts=(2 * counts).tolist(), comm=g.row_h)
        got = got.reshape(-1, 2)
        floor = sssp_mark(got, lo, g.own, self.best, self.member)  # least member distance
        sssp_pull(
            g.indptr,
            g.adj,
            g.weight,
            self.pend,
            self.size,
            self.unreached,
            self.state,
            self.best,
            self.member,
            self.parent,
            self.nxt,
            self.mark,
            self.low,
            self.top,
            floor,
            self.delta,
            lo,
            g.degree,
        )
        sssp_unmark(got, self.member)
