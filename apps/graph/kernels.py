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
    "join_bits",
    "light_ends",
    "sssp_relax",
    "sssp_apply",
    "sssp_settle",
    "sssp_take",
    "sssp_mark",
    "sssp_unmark",
    "sssp_pull",
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
def _slot_of(bounds, v):
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
def _group(rows, slot, counts):
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
                s = _slot_of(bounds, w)
            cand[k, 0] = (w << 32) | p
            owner[k] = s
            counts[s] += 1
            k += 1
    return _group(cand[:k], owner, counts), counts


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


# ---- delta-stepping on 1 x P grids ----------------------------------------------------
# Per owned vertex, ``state`` is 0 (unreached), 1 (reached, waiting in ``pend``) or 2
# (settled: taken into a bucket). ``pend`` lists each vertex once, from its first
# distance on; entries that have since settled are dropped when it is compacted. ``nxt``
# collects the vertices whose distance fell into the current bucket in this round
# (``mark`` keeps each once), ``size`` holds the lengths [pend, nxt, members].


@njit(cache=True)
def light_ends(indptr, weight, delta):
    """Where each CSR row's light edges (w < delta) end; rows are sorted by weight."""
    out = np.empty(indptr.size - 1, dtype=np.int64)
    for r in range(out.size):
        a, b = indptr[r], indptr[r + 1]
        while a < b:
            mid = (a + b) >> 1
            if weight[mid] < delta:
                a = mid + 1
            else:
                b = mid
        out[r] = a
    return out


@njit(cache=True)
def _book(xs, n, dist, state, pend, nxt, mark, size, low, top, delta, degree):
    """Book the owned vertices ``xs[:n]``, whose distances just fell (repeats are fine).

    One joins ``pend`` if it was unreached, and ``nxt`` if its distance lies in the
    current bucket (or it had settled); otherwise ``low`` takes its bucket.
    """
    for t in range(n):
        x = xs[t]
        if state[x] == 0:
            state[x] = 1
            pend[size[0]] = x
            size[0] += 1
            size[5] -= degree[x]
        b = dist[x] / delta
        if state[x] == 2 or b < top:
            if not mark[x]:
                mark[x] = True
                nxt[size[1]] = x
                size[1] += 1
        elif b < low[0]:
            low[0] = np.floor(b)


@njit(cache=True)
def sssp_relax(indptr, adj, weight, ends, active, count, light, best, parent, state, pend,
               nxt, mark, size, low, top, delta, lo, bounds, degree):  # fmt: skip
    """Relax the light (or heavy) edges of ``active[:count]`` (owned, local).

    ``best`` spans all vertices: over the owned range it is the distance array itself,
    elsewhere the smallest distance this rank has sent each vertex, so one test filters
    both. An owned target is improved in place and booked (``_book``: ``pend``, and
    ``nxt`` when its distance is below ``top``, the current bucket's end in units of
    delta) after the loop, which a call per improvement would slow. Other targets
    become packed rows, ``(vertex << 32) | parent`` and the distance's bits, grouped by
    owner slot. Returns the rows and the count per slot. Indices are unsigned, so numba
    adds no negative-index check to the edge loop.
    """
    one = np.uint64(1)
    total = 0
    for t in range(count):
        c = active[t]
        total += ends[c] - indptr[c] if light else indptr[c + 1] - ends[c]
    rows = np.empty((total, 2), dtype=np.int64)
    bits = rows.view(np.float64)
    slot = np.empty(total, dtype=np.int32)
    counts = np.zeros(bounds.size - 1, dtype=np.int64)
    mine = np.empty(total, dtype=np.uint64)  # owned targets improved, booked after the loop
    ulo, uhi = np.uint64(lo), np.uint64(lo + parent.size)
    k = n = 0
    for t in range(count):
        c = np.uint64(active[t])
        d, p = best[c + ulo], np.int64(c) + lo
        if light:
            e, stop = np.uint64(indptr[c]), np.uint64(ends[c])
        else:
            e, stop = np.uint64(ends[c]), np.uint64(indptr[c + one])
        while e < stop:
            v = np.uint64(adj[e])
            nd = d + weight[e]
            e += one
            if nd < best[v]:
                best[v] = nd
                if ulo <= v < uhi:
                    parent[v - ulo] = p
                    mine[n] = v - ulo
                    n += 1
                else:
                    w = np.int64(v)
                    s = _slot_of(bounds, w)
                    rows[k, 0] = (w << 32) | p
                    bits[k, 1] = nd
                    slot[k] = s
                    counts[s] += 1
                    k += 1
    _book(mine, n, best[ulo:uhi], state, pend, nxt, mark, size, low, top, delta, degree)
    return _group(rows[:k], slot, counts), counts


@njit(cache=True)
def sssp_apply(rows, lo, dist, parent, state, pend, nxt, mark, size, low, top, delta,
               degree):  # fmt: skip
    """Rows from ``sssp_relax`` of other ranks applied to owned vertices, then booked."""
    bits = rows.view(np.float64)
    half = np.int64(0xFFFFFFFF)
    mine = np.empty(rows.shape[0], dtype=np.int64)
    n = 0
    for t in range(rows.shape[0]):
        x = (rows[t, 0] >> 32) - lo
        nd = bits[t, 1]
        if nd < dist[x]:
            dist[x] = nd
            parent[x] = rows[t, 0] & half
            mine[n] = x
            n += 1
    _book(mine, n, dist, state, pend, nxt, mark, size, low, top, delta, degree)


@njit(cache=True)
def sssp_settle(nxt, count, state, mark, stamp, epoch, members, size, indptr, ends, active):
    """Settle ``nxt[:count]``; those with light edges go to ``active``, how many returned.

    Those not yet members of this bucket pass (``epoch``) join ``members``, and ``size[3]``
    adds up their heavy edges.
    """
    k = 0
    for t in range(count):
        x = nxt[t]
        mark[x] = False
        state[x] = 2
        if stamp[x] != epoch:
            stamp[x] = epoch
            members[size[2]] = x
            size[2] += 1
            size[3] += indptr[x + 1] - ends[x]
        if ends[x] > indptr[x]:
            active[k] = x
            k += 1
    return k


@njit(cache=True)
def _below(cdf, x):
    """The fraction of edges lighter than ``x``, from ``DistGraph.weight_cdf``'s table."""
    top = cdf[-1]
    if x >= top:
        return 1.0
    if x <= 0.0:
        return 0.0
    return cdf[int(x / top * (cdf.size - 2))]


@njit(cache=True)
def sssp_take(pend, size, state, dist, delta, bucket, nxt, mark, low, degree, cdf):
    """Move the waiting entries of ``pend`` in ``bucket`` to ``nxt``; start the bucket.

    Settled entries of ``pend`` are dropped; ``low[0]`` becomes the lowest bucket of the
    entries left (inf if none). Returns an estimate of the edges a pull of this bucket
    would scan in the rows of waiting vertices: for each, the edges lighter than its
    distance less the bucket's floor (the fraction ``cdf``, ``DistGraph.weight_cdf``,
    says). The unreached vertices' edges (all scanned) are counted in ``size[5]``.
    """
    k = 0
    least = np.inf
    floor = bucket * delta
    edges = 0.0
    for t in range(size[0]):
        x = pend[t]
        if state[x] != 1:
            continue
        b = np.floor(dist[x] / delta)
        if b <= bucket:
            mark[x] = True
            nxt[size[1]] = x
            size[1] += 1
        else:
            pend[k] = x
            k += 1
            edges += degree[x] * _below(cdf, dist[x] - floor)
            least = min(least, b)
    size[0] = k
    low[0] = least
    return edges


@njit(cache=True)
def sssp_mark(got, lo, own, best, member):
    """Take in the gathered members ``(vertex, distance bits)`` of all ranks.

    Their distances (final) go into ``best`` for the vertices of others, and their bits
    are set in ``member``. Returns the least of their distances (inf if none).
    """
    bits = got.view(np.float64)
    least = np.inf
    for t in range(got.shape[0]):
        v = got[t, 0]
        if not lo <= v < lo + own:
            best[v] = bits[t, 1]
        member[v >> 3] |= np.uint8(1 << (v & 7))
        least = min(least, bits[t, 1])
    return least


@njit(cache=True)
def sssp_unmark(got, member):
    """Clear the bits ``sssp_mark`` set."""
    for t in range(got.shape[0]):
        member[got[t, 0] >> 3] = 0


@njit(cache=True)
def sssp_pull(indptr, adj, weight, pend, size, unreached, state, best, member, parent,
              nxt, mark, low, top, floor, delta, lo, degree):  # fmt: skip
    """Every waiting or unreached owned vertex takes its best path through the members.

    Members are the bits of ``member``, their distances in ``best``. A member improves v
    only along an edge lighter than v's distance less ``floor``, the members' least
    distance, and rows are sorted by weight, so each row is scanned only that far. The
    unreached list is compacted on the way. Improved vertices are booked at the end, as
    ``sssp_relax`` books owned targets.
    """
    one, three, seven = np.uint64(1), np.uint64(3), np.uint64(7)
    ulo = np.uint64(lo)
    n = size[0]
    kept = m = 0
    mine = np.empty(n + size[4], dtype=np.int64)  # the vertices improved, booked at the end
    for which in range(2):
        count = n if which == 0 else size[4]
        for t in range(count):
            x = pend[t] if which == 0 else unreached[t]
            if state[x] != (1 if which == 0 else 0):
                continue
            if which == 1:
                unreached[kept] = x
                kept += 1
            ux = np.uint64(x)
            here = best[ux + ulo]
            improved = False
            e, stop = np.uint64(indptr[ux]), np.uint64(indptr[ux + one])
            while e < stop and weight[e] < here - floor:
                u = np.uint64(adj[e])
                if (member[u >> three] >> (u & seven)) & one:
                    nd = best[u] + weight[e]
                    if nd < here:
                        here = nd
                        parent[x] = np.int64(u)
                        improved = True
                e += one
            if not improved:
                continue
            best[ux + ulo] = here
            mine[m] = x
            m += 1
    size[4] = kept
    _book(mine, m, best[ulo : ulo + state.size], state, pend, nxt, mark, size, low, top, delta,
          degree)  # fmt: skip
