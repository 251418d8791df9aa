"""The loops that cannot be vectorised (early exits, first-wins claims), compiled by numba.

Vertex indices here are local: ``cols`` index a rank's column block (CSR rows), the
adjacency holds row-block-local indices. Each kernel returns exactly-sized arrays.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["counting_order", "td_expand", "bu_scan", "bitmap", "relax", "claim", "improve"]


@njit(cache=True)
def counting_order(keys: np.ndarray, indptr: np.ndarray) -> np.ndarray:
    """Stable counting sort: positions of ``keys`` grouped by key (``indptr`` from bincount)."""
    pos = indptr[:-1].copy()
    out = np.empty(keys.size, dtype=np.int64)
    for k in range(keys.size):
        key = keys[k]
        out[pos[key]] = k
        pos[key] += 1
    return out


@njit(cache=True)
def td_expand(indptr, adj, cols, globs, seen):
    """Top-down: neighbours of frontier vertices not yet sent, with the frontier parent."""
    total = 0
    for c in cols:
        total += indptr[c + 1] - indptr[c]
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
def relax(indptr, adj, weight, cols, dist, globs, light, delta, best):
    """Delta-stepping: tentative distances over light (w < delta) or heavy edges.

    Segments are sorted by weight, so light edges are a prefix. ``best`` (row-local)
    holds the smallest distance this rank has sent for each target; a candidate no
    better than it cannot improve the owner's distance and is not sent. Indices are
    unsigned, so numba adds no negative-index check to the loops.
    """
    one = np.uint64(1)
    total = 0
    for c in cols:
        total += indptr[c + 1] - indptr[c]
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
