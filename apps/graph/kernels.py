"""The loops that cannot be vectorised (early exits, first-wins claims), compiled by numba.

Vertex indices here are local: ``cols`` index a rank's column block (CSR rows), the
adjacency holds row-block-local indices. Each kernel returns exactly-sized arrays.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = [
    "scatter_rows",
    "sort_segments",
    "td_expand",
    "bu_scan",
    "bitmap",
    "relax",
    "claim",
    "improve",
    "td_route",
    "claim_packed",
    "bu_step",
    "frontier_bits",
    "slot_of",
    "group_by_slot",
    "join_bits",
]


@njit(cache=True)
def scatter_rows(ucol, vloc, w, pos, adj, weight):
    """Counting-sort step: entry k goes to ``adj``/``weight`` at ``pos[ucol[k]]``.

    ``pos`` starts as the CSR row starts and advances, keeping arrival order within a row.
    """
    for k in range(ucol.size):
        r = ucol[k]
        at = pos[r]
        adj[at] = vloc[k]
        weight[at] = w[k]
        pos[r] = at + 1


@njit(cache=True)
def sort_segments(indptr, adj, weight):
    """Sort each CSR row by weight, stably (ties keep their order), in place."""
    for r in range(indptr.size - 1):
        a, b = indptr[r], indptr[r + 1]
        if b - a < 2:
            continue
        seg = weight[a:b]
        ordered = True
        for k in range(1, b - a):
            if seg[k] < seg[k - 1]:
                ordered = False
                break
        if ordered:
            continue
        order = np.argsort(seg, kind="mergesort")
        adj[a:b] = adj[a:b][order]
        weight[a:b] = seg[order]


@njit(cache=True)
def td_expand(indptr, adj, cols, globs, seen):
    """Top-down: neighbours of frontier vertices not yet sent, with the frontier parent."""
    total = _edges_of(indptr, cols)
    out_v = np.empty(total, dtype=np.int64)
    out_p = np.empty(total, dtype=np.int64)
    k = 0
    for t in range(cols.size):
        c, g = cols[t], globs[t]
        for e in range(indptr[c], indptr[c + 1]):
            v = adj[e]
            if not seen[v]:
                seen[v] = True
                out_v[k] = v
                out_p[k] = g
                k += 1
    return out_v[:k], out_p[:k]


@njit(cache=True)
def bu_scan(indptr, adj, cols, frontier):
    """Bottom-up: for each unvisited vertex, its first neighbour in the frontier (if any).

    ``frontier`` is a bitmap (bit ``v & 7`` of byte ``v >> 3``, ``bitmap``'s layout): an
    eighth of a bool array, so more of it stays in cache under the scan's random
    probes. Indices are unsigned, so numba adds no negative-index check to the loop.
    """
    out_c = np.empty(cols.size, dtype=np.int64)
    out_v = np.empty(cols.size, dtype=np.int64)
    one, three, seven = np.uint64(1), np.uint64(3), np.uint64(7)
    k = 0
    for t in range(cols.size):
        c = np.uint64(cols[t])
        e, stop = np.uint64(indptr[c]), np.uint64(indptr[c + one])
        while e < stop:
            v = np.uint64(adj[e])
            if (frontier[v >> three] >> (v & seven)) & one:
                out_c[k] = c
                out_v[k] = v
                k += 1
                break
            e += one
    return out_c[:k], out_v[:k]


def bitmap(mask: np.ndarray) -> np.ndarray:
    """``mask`` (bools) as ``bu_scan``'s bitmap: bit ``v & 7`` of byte ``v >> 3``."""
    return np.packbits(mask, bitorder="little")


@njit(cache=True)
def _edges_of(indptr, cols):
    """The adjacency entries of CSR rows ``cols``, counted."""
    total = 0
    for c in cols:
        total += indptr[c + 1] - indptr[c]
    return total


@njit(cache=True)
def relax(indptr, adj, weight, cols, dist, globs, light, delta, best):
    """Delta-stepping: tentative distances over light (w < delta) or heavy edges.

    Segments are sorted by weight, so light edges are a prefix. ``best`` (row-local)
    holds the smallest distance this rank has sent for each target; a candidate no
    better than it cannot improve the owner's distance and is not sent. Indices are
    unsigned, so numba adds no negative-index check to the loops.
    """
    one = np.uint64(1)
    total = _edges_of(indptr, cols)
    out_v = np.empty(total, dtype=np.int64)
    out_d = np.empty(total, dtype=np.float64)
    out_p = np.empty(total, dtype=np.int64)
    k = 0
    for t in range(cols.size):
        c, d, g = np.uint64(cols[t]), dist[t], globs[t]
        start, stop = np.uint64(indptr[c]), np.uint64(indptr[c + one])
        split = start
        while split < stop and weight[split] < delta:
            split += one
        e, hi = (start, split) if light else (split, stop)
        while e < hi:
            v = np.uint64(adj[e])
            nd = d + weight[e]
            if nd < best[v]:
                best[v] = nd
                out_v[k] = v
                out_d[k] = nd
                out_p[k] = g
                k += 1
            e += one
    return out_v[:k], out_d[:k], out_p[:k]


@njit(cache=True)
def claim(parent, local, par):
    """First candidate wins: set unvisited vertices' parents; the newly visited, in order."""
    out = np.empty(local.size, dtype=np.int64)
    k = 0
    for t in range(local.size):
        v = local[t]
        if parent[v] < 0:
            parent[v] = par[t]
            out[k] = v
            k += 1
    return out[:k]


@njit(cache=True)
def improve(dist, parent, local, cand, par, mark):
    """Keep the smallest tentative distance (ties: the earlier candidate); changed vertices."""
    out = np.empty(local.size, dtype=np.int64)
    k = 0
    for t in range(local.size):
        v = local[t]
        if cand[t] < dist[v]:
            dist[v] = cand[t]
            parent[v] = par[t]
            if not mark[v]:
                mark[v] = True
                out[k] = v
                k += 1
    for t in range(k):
        mark[out[t]] = False
    return out[:k]


# ---- 1 x P grids: a rank holds its own vertices' whole adjacency ----------------------
# Candidates travel packed, (vertex << 32) | parent, one int64 each (n < 2^31 there).


@njit(cache=True)
def slot_of(bounds, v):
    """The slot s with bounds[s] <= v < bounds[s + 1] (``searchsorted(.., 'right') - 1``)."""
    lo, hi = 0, bounds.size - 1
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if bounds[mid] <= v:
            lo = mid
        else:
            hi = mid
    return lo


@njit(cache=True)
def group_by_slot(rows, slot, counts):
    """``rows`` reordered by ``slot`` (``counts[s]`` rows each), keeping arrival order."""
    start = np.zeros(counts.size, dtype=np.int64)
    for s in range(1, counts.size):
        start[s] = start[s - 1] + counts[s - 1]
    out = np.empty_like(rows)
    for t in range(rows.shape[0]):
        s = slot[t]
        out[start[s]] = rows[t]
        start[s] += 1
    return out


@njit(cache=True)
def td_route(indptr, adj, frontier, lo, parent, seen, bounds, me):
    """Top-down on a 1 x P grid: packed candidates grouped by owner slot, and the counts.

    The candidates are (k, 1) rows. ``frontier`` holds owned (local) vertices; ``adj``
    global ids; ``seen`` is a bitmap over all vertices of the candidates already sent (and
    the visited vertices this rank knows of); an owned neighbour (slot ``me``) is checked
    against ``parent`` directly.
    """
    one, three, seven = np.uint64(1), np.uint64(3), np.uint64(7)
    hi = lo + parent.size
    total = _edges_of(indptr, frontier)
    cand = np.empty((total, 1), dtype=np.int64)
    owner = np.empty(total, dtype=np.int32)
    counts = np.zeros(bounds.size - 1, dtype=np.int64)
    k = 0
    for t in range(frontier.size):
        c = np.uint64(frontier[t])
        p = np.int64(c) + lo
        e, stop = np.uint64(indptr[c]), np.uint64(indptr[c + one])
        while e < stop:
            v = np.uint64(adj[e])
            e += one
            byte, bit = v >> three, np.uint8(one << (v & seven))
            if seen[byte] & bit:
                continue
            seen[byte] |= bit
            w = np.int64(v)
            if lo <= w < hi:
                if parent[w - lo] >= 0:
                    continue
                s = me
            else:
                s = slot_of(bounds, w)
            cand[k, 0] = (w << 32) | p
            owner[k] = s
            counts[s] += 1
            k += 1
    return group_by_slot(cand[:k], owner, counts), counts


@njit(cache=True)
def claim_packed(parent, got, lo, degree):
    """First packed candidate wins; the newly visited (local) and their degree sum."""
    out = np.empty(got.size, dtype=np.int64)
    low = np.int64(0xFFFFFFFF)
    k = 0
    edges = 0
    for t in range(got.size):
        x = got[t]
        v = (x >> 32) - lo
        if parent[v] < 0:
            parent[v] = x & low
            out[k] = v
            edges += degree[v]
            k += 1
    return out[:k], edges


@njit(cache=True)
def bu_step(indptr, adj, parent, todo, count, front, degree):
    """Bottom-up on a 1 x P grid: vertices of ``todo[:count]`` find frontier parents.

    Every unvisited vertex of ``todo[:count]`` (owned, local) takes its first neighbour in
    the frontier bitmap ``front`` (over all vertices) as parent. Returns the newly visited
    and their degree sum, as ``claim_packed`` does, and how many stay unvisited: they are
    moved to the front of ``todo``, so each level scans only the vertices the previous
    one left.
    """
    one, three, seven = np.uint64(1), np.uint64(3), np.uint64(7)
    out = np.empty(count, dtype=np.int64)
    k = 0
    left = 0
    edges = 0
    for t in range(count):
        c = np.uint64(todo[t])
        if parent[c] >= 0:
            continue
        e, stop = np.uint64(indptr[c]), np.uint64(indptr[c + one])
        while e < stop:
            v = np.uint64(adj[e])
            if (front[v >> three] >> (v & seven)) & one:
                parent[c] = np.int64(v)
                out[k] = np.int64(c)
                edges += degree[c]
                k += 1
                break
            e += one
        else:
            todo[left] = np.int64(c)
            left += 1
    return out[:k], edges, left


@njit(cache=True)
def frontier_bits(frontier, size):
    """The local ``frontier`` as a bitmap of ``size`` vertices (``bitmap``'s layout)."""
    out = np.zeros((size + 7) >> 3, dtype=np.uint8)
    for c in frontier:
        out[c >> 3] |= np.uint8(1 << (c & 7))
    return out


@njit(cache=True)
def join_bits(got, sizes, into):
    """OR members' bitmaps into one over their concatenated vertex ranges.

    ``got`` holds the members' bitmaps back to back, each whole bytes; ``into`` receives
    the result (and may already hold bits).
    """
    at = 0  # byte of got
    base = 0  # first vertex of this member
    for s in sizes:
        nbytes = (s + 7) >> 3
        shift = base & 7
        first = base >> 3
        for b in range(nbytes):
            x = np.uint16(got[at + b]) << shift
            into[first + b] |= np.uint8(x & 0xFF)
            if x >> 8:
                into[first + b + 1] |= np.uint8(x >> 8)
        at += nbytes
        base += s
    return into
