"""Graph500 BFS and SSSP at 1-4 ranks: every partition and layout against scipy.sparse.csgraph.

Parents may legitimately differ from scipy's (any BFS tree is valid), so levels and
distances are compared exactly (levels) or to 1e-12 (distances), and the parent arrays
go through the validator, which in turn must reject each kind of wrong answer.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp
from hpcpar.apps.graph import EdgeList, GraphError, kronecker
from hpcpar.apps.graph import validate as validate_module
from hpcpar.apps.graph.graph import DistGraph
from hpcpar.apps.graph.search import bfs, sssp
from hpcpar.apps.graph.validate import validate
from mpi4py import MPI
from scipy.sparse import csgraph

import hpcpar
from hpcpar.testing import assert_all, assert_allclose_all, assert_equal_all, layouts_for

pytestmark = pytest.mark.mpi

PARTITIONS = ["1d-vertex", "1d-edge", "2d", "hier"]


def _slice(src, dst, w, n, comm):
    m, p, r = src.size, comm.Get_size(), comm.Get_rank()
    lo, hi = m * r // p, m * (r + 1) // p
    return EdgeList(src[lo:hi], dst[lo:hi], w[lo:hi], n, m, lo)


def _awkward_graph():
    """Isolated vertices, self-loops, duplicates (with different weights), 3 components."""
    rng = np.random.default_rng(4)
    n = 90
    a = rng.integers(0, 40, 300)
    b = rng.integers(0, 40, 300)  # component on 0..39 (mostly)
    c = np.arange(50, 59)
    path_a, path_b = c, c + 1  # a path 50-59: deep levels
    src = np.concatenate([a, path_a, [70, 70, 71, 80, 80], a[:20]])
    dst = np.concatenate([b, path_b, [71, 71, 72, 80, 80], b[:20]])  # dups, self-loops
    w = rng.random(src.size)
    return src.astype(np.int64), dst.astype(np.int64), w, n


def _reference(src, dst, w, n):
    keep = src != dst
    s, d, ww = src[keep], dst[keep], w[keep]
    s, d, ww = np.concatenate([s, d]), np.concatenate([d, s]), np.concatenate([ww, ww])
    order = np.lexsort((ww, d, s))
    s, d, ww = s[order], d[order], ww[order]
    first = np.ones(s.size, dtype=bool)
    first[1:] = (s[1:] != s[:-1]) | (d[1:] != d[:-1])  # the lightest of duplicate edges
    return sp.csr_matrix((ww[first], (s[first], d[first])), shape=(n, n))


def _gather(g, x, fill):
    out = np.full(g.n, fill, dtype=x.dtype)
    for lo, part in g.comm.allgather((g.grid.lo, x)):
        out[lo : lo + part.size] = part
    return out


def _levels_from(parent, root):
    depth = np.full(parent.size, -1)
    depth[root] = 0
    for _ in range(parent.size):
        todo = (depth < 0) & (parent >= 0)
        ready = todo & (depth[np.maximum(parent, 0)] >= 0)
        if not ready.any():
            break
        depth[ready] = depth[parent[ready]] + 1
    return depth


def _graphs(comm):
    k = kronecker(8, 8, seed=3, part=comm.Get_rank(), parts=comm.Get_size())
    full = kronecker(8, 8, seed=3)
    src, dst, w, n = _awkward_graph()
    return [
        (k, (full.src, full.dst, full.weight, full.n_vertices)),
        (_slice(src, dst, w, n, comm), (src, dst, w, n)),
    ]


@pytest.mark.parametrize("partition", PARTITIONS)
@pytest.mark.parametrize("layout", layouts_for(hpcpar.default_comm().Get_size())[:6])
def test_bfs_and_sssp_match_scipy_and_validate(comm, partition, layout):
    for edges, whole in _graphs(comm):
        g = DistGraph.build(edges, comm=comm, partition=partition, layout=layout)
        ref = _reference(*whole)
        degree = np.diff(ref.indptr)
        roots = [int(v) for v in np.flatnonzero(degree)[[0, -1]]]
        if whole[3] == 90:
            roots.append(50)  # the end of the path: 9 levels deep
        for root in roots:
            levels = csgraph.shortest_path(ref, unweighted=True, indices=root)
            levels = np.where(np.isinf(levels), -1, levels).astype(np.int64)
            for direction in ("auto", "top-down", "bottom-up"):
                found = bfs(g, root, direction=direction)
                check = validate(g, edges, root, found.parent)
                assert_all(check.ok, f"{direction} BFS from {root}: {check.examples}", comm)
                parent = _gather(g, found.parent, -2)
                assert_equal_all(_levels_from(parent, root), levels, comm)
                assert check.traversed_edges == found.traversed_edges(g)
            dist = csgraph.dijkstra(ref, indices=root)
            ways = ("auto", "push", "pull") if g.grid.rows == 1 else ("auto", "push")
            # every delta from the first root; each direction from every root
            deltas = (0.05, 0.3, np.inf) if root == roots[0] else (0.3,)
            for delta, direction in itertools.product(deltas, ways):
                found = sssp(g, root, delta=delta, direction=direction)  # inf: Bellman-Ford
                check = validate(g, edges, root, found.parent, found.dist)
                assert_all(
                    check.ok, f"SSSP {direction} delta {delta} from {root}: {check.examples}", comm
                )
                assert_allclose_all(_gather(g, found.dist, np.nan), dist, comm, rtol=1e-12)
        if g.grid.rows > 1:
            with pytest.raises(GraphError, match="1 x P grid"):
                sssp(g, roots[0], direction="pull")
        g.free()


@pytest.mark.parametrize("partition", PARTITIONS)
def test_every_rank_stores_its_edges_in_rows_sorted_by_weight(comm, partition):
    """The CSR of all ranks together holds each non-loop edge in both directions, once
    each, duplicates included, and every row is sorted by weight."""
    src, dst, w, n = _awkward_graph()
    g = DistGraph.build(_slice(src, dst, w, n, comm), comm=comm, partition=partition)
    rows = g.grid.from_col(np.repeat(np.arange(g.indptr.size - 1), np.diff(g.indptr)))
    mine = np.stack([rows, g.adj + g.grid.row_lo, g.weight.view(np.int64)], axis=1)
    runs = np.split(g.weight, g.indptr[1:-1])
    assert_all(all(np.all(np.diff(r) >= 0) for r in runs), "a row out of weight order", comm)
    held = np.concatenate(comm.allgather(mine))
    keep = src != dst
    want = np.stack(
        [
            np.concatenate([src[keep], dst[keep]]),
            np.concatenate([dst[keep], src[keep]]),
            np.concatenate([w[keep], w[keep]]).view(np.int64),
        ],
        axis=1,
    )
    for a, b in zip(
        np.unique(held, axis=0, return_counts=True),
        np.unique(want, axis=0, return_counts=True),
        strict=True,
    ):
        assert_equal_all(a, b, comm)
    g.free()


def test_the_2d_grid_and_uneven_grids(comm):
    size = comm.Get_size()
    edges = kronecker(7, 8, seed=9, part=comm.Get_rank(), parts=size)
    full = kronecker(7, 8, seed=9)
    ref = _reference(full.src, full.dst, full.weight, full.n_vertices)
    root = int(np.flatnonzero(np.diff(ref.indptr))[0])
    levels = csgraph.shortest_path(ref, unweighted=True, indices=root)
    levels = np.where(np.isinf(levels), -1, levels).astype(np.int64)
    for grid in dict.fromkeys([f"{size}x1", f"1x{size}"]):  # same order on every rank
        g = DistGraph.build(edges, comm=comm, partition="2d", grid=grid)
        assert (g.grid.rows, g.grid.cols) == tuple(int(x) for x in grid.split("x"))
        found = bfs(g, root)
        assert_equal_all(_levels_from(_gather(g, found.parent, -2), root), levels, comm)
        assert_all(validate(g, edges, root, found.parent).ok, f"grid {grid}", comm)
        g.free()
    with pytest.raises(GraphError, match="does not have"):
        DistGraph.build(edges, comm=comm, partition="2d", grid=f"{size + 1}x1")


def _corrupt(comm, g, edges, root, parent, dist, change):
    """Apply ``change`` on the last rank that owns a suitable vertex; the validator's verdict."""
    parent, dist = parent.copy(), None if dist is None else dist.copy()
    owners = comm.allgather(bool(np.any((parent >= 0) & (np.arange(g.own) + g.grid.lo != root))))
    who = max(r for r, ok in enumerate(owners) if ok)
    if comm.Get_rank() == who:
        change(parent, dist)
    return validate(g, edges, root, parent, dist)


def _victim(parent, g, root, pick=0):
    ok = np.flatnonzero((parent >= 0) & (np.arange(parent.size) + g.grid.lo != root))
    return int(ok[pick])


@pytest.mark.parametrize("chunk", [None, 13])  # 13: many rounds, a different count per rank
@pytest.mark.parametrize("partition", ["1d-vertex", "2d"])
def test_the_validator_catches_each_kind_of_wrong_answer(comm, partition, chunk, monkeypatch):
    if chunk:
        monkeypatch.setattr(validate_module, "_CHUNK", chunk)
    src, dst, w, n = _awkward_graph()
    edges = _slice(src, dst, w, n, comm)
    g = DistGraph.build(edges, comm=comm, partition=partition)
    root = 50  # the path 50-59 gives vertices two and more levels deep
    found = bfs(g, root)
    lo = g.grid.lo
    check = validate(g, edges, root, found.parent)
    assert_all(check.ok and check.traversed_edges == found.traversed_edges(g), "", comm)

    def missed(p, d):
        p[_victim(p, g, root, -1)] = -1

    def cycle(p, d):
        k = _victim(p, g, root, -1)
        p[k] = k + lo  # its own parent: a cycle of one

    def wrong_parent(p, d):  # a parent at the right level that is not a neighbour
        k = _victim(p, g, root, -1)
        p[k] = root if p[k] != root else 0

    def out_of_range(p, d):
        p[_victim(p, g, root, -1)] = n + 5

    cases = {
        "missed vertex": missed,
        "a cycle": cycle,
        "wrong parent": wrong_parent,
        "out of range": out_of_range,
    }
    for rule, change in cases.items():
        check = _corrupt(comm, g, edges, root, found.parent, None, change)
        assert_all(
            not check.ok and any(rule in k for k, v in check.errors.items() if v),
            f"{rule} not caught: {check.errors}",
            comm,
        )
    s = sssp(g, root, delta=0.1)

    def longer(p, d):
        d[_victim(p, g, root, -1)] += 0.25

    def shorter(p, d):
        d[_victim(p, g, root, -1)] -= 0.25

    for change in (longer, shorter):
        check = _corrupt(comm, g, edges, root, s.parent, s.dist, change)
        assert_all(not check.ok, f"distance change not caught: {check.errors}", comm)
    g.free()


def test_a_bfs_tree_with_a_level_jump_is_rejected(comm):
    # The path 0-1-2-3 and the chord 0-2: BFS levels 0, 1, 1, 2 and parents 0, 0, 0, 2.
    # Hanging 2 below 1 still gives a tree of real edges, but the chord 0-2 then joins
    # levels 0 and 2: the triangle rule must catch it.
    src, dst = np.array([0, 1, 2, 0]), np.array([1, 2, 3, 2])
    edges = _slice(src, dst, np.ones(4), 4, comm)
    g = DistGraph.build(edges, comm=comm)
    parent = _gather(g, bfs(g, 0).parent, -2)
    assert list(parent) == [0, 0, 0, 2]
    wrong = np.array([0, 0, 1, 2])[g.grid.lo : g.grid.hi]
    check = validate(g, edges, 0, wrong)
    assert_all(
        check.errors["edge violates the triangle rule (level jump or distance too large)"] > 0,
        f"level jump not caught: {check.errors}",
        comm,
    )
    g.free()


def test_hier_partition_sends_one_message_per_node_pair(comm):
    size = comm.Get_size()
    if size < 2:
        pytest.skip("needs 2 virtual nodes (run at 2-4 ranks)")
    edges = kronecker(9, 8, seed=2, part=comm.Get_rank(), parts=size)
    layout = "roundrobin:2"
    counts = {}
    for partition in ("1d-edge", "hier"):
        g = DistGraph.build(edges, comm=comm, partition=partition, layout=layout)
        root = int(
            comm.bcast(
                int(np.flatnonzero(g.degree)[0] + g.grid.lo) if comm.Get_rank() == 0 else None
            )
        )
        g.reset_volume()
        bfs(g, root, direction="top-down")
        counts[partition] = comm.allreduce(g.row_x.messages_inter)
        levels = len(bfs(g, root, direction="top-down").levels)
        g.free()
    # hier: at most one inter-node message per ordered pair of nodes per exchange
    assert counts["hier"] <= 2 * levels
    if size >= 3:
        assert counts["1d-edge"] > counts["hier"]


def test_bounds_balance_edges_and_every_rank_agrees(comm):
    edges = kronecker(10, 16, seed=1, part=comm.Get_rank(), parts=comm.Get_size())
    table = {}
    for partition in ("1d-vertex", "1d-edge"):
        g = DistGraph.build(edges, comm=comm, partition=partition)
        bounds = comm.allgather(g.grid.bounds.tolist())
        assert_all(all(b == bounds[0] for b in bounds), "bounds differ between ranks", comm)
        table[partition] = g.load_imbalance()["entries"]
        top = comm.allreduce(int(g.degree.max(initial=0)), op=MPI.MAX)
        assert sum(table[partition]) == 2 * comm.allreduce(int(np.sum(edges.src != edges.dst)))
        g.free()
    e = np.array(table["1d-edge"])
    assert e.max() <= e.mean() + top  # cut by degree: balanced up to one vertex's edges
