"""Delta-stepping kernels for 1 x P grids (``search._sssp_row``), compiled by numba.

Per owned vertex (local index), ``state`` is 0 (unreached), 1 (reached, waiting in
``pend``) or 2 (settled: taken into a bucket). ``pend`` lists each vertex once, from its
first distance on; entries that have since settled are dropped when it is compacted.
``nxt`` collects the vertices whose distance fell into the current bucket during a round
(``mark`` keeps each once). ``size`` holds, at its named slots, the lengths of ``pend``
(``PEND``), ``nxt`` (``NXT``) and the bucket's members (``MEMBERS``), the members' heavy
edges (``HEAVY``), the length of the unreached list (``UNREACHED``) and the unreached
vertices' edges (``UNREACHED_EDGES``); ``search._Buckets`` owns them all.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .kernels import group_by_slot, slot_of

__all__ = [
    "PEND",
    "NXT",
    "MEMBERS",
    "HEAVY",
    "UNREACHED",
    "UNREACHED_EDGES",
    "light_ends",
    "sssp_relax",
    "sssp_apply",
    "sssp_settle",
    "sssp_take",
    "sssp_mark",
    "sssp_unmark",
    "sssp_pull",
]

# the slots of ``size`` (compile-time constants to numba)
PEND, NXT, MEMBERS, HEAVY, UNREACHED, UNREACHED_EDGES = range(6)


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
            pend[size[PEND]] = x
            size[PEND] += 1
            size[UNREACHED_EDGES] -= degree[x]
        b = dist[x] / delta
        if state[x] == 2 or b < top:
            if not mark[x]:
                mark[x] = True
                nxt[size[NXT]] = x
                size[NXT] += 1
        elif b < low[0]:
            low[0] = np.floor(b)


@njit(cache=True)
def sssp_relax(
    indptr,
    adj,
    weight,
    ends,
    active,
    count,
    light,
    best,
    parent,
    state,
    pend,
    nxt,
    mark,
    size,
    low,
    top,
    delta,
    lo,
    bounds,
    degree,
):
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
                    s = slot_of(bounds, w)
                    rows[k, 0] = (w << 32) | p
                    bits[k, 1] = nd
                    slot[k] = s
                    counts[s] += 1
                    k += 1
    _book(mine, n, best[ulo:uhi], state, pend, nxt, mark, size, low, top, delta, degree)
    return group_by_slot(rows[:k], slot, counts), counts


@njit(cache=True)
def sssp_apply(rows, lo, dist, parent, state, pend, nxt, mark, size, low, top, delta, degree):
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

    Those not yet members of this bucket pass (``epoch``) join ``members``, and ``size[HEAVY]``
    adds up their heavy edges.
    """
    k = 0
    for t in range(count):
        x = nxt[t]
        mark[x] = False
        state[x] = 2
        if stamp[x] != epoch:
            stamp[x] = epoch
            members[size[MEMBERS]] = x
            size[MEMBERS] += 1
            size[HEAVY] += indptr[x + 1] - ends[x]
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
    says). The unreached vertices' edges (all scanned) are counted in ``size[UNREACHED_EDGES]``.
    """
    k = 0
    least = np.inf
    floor = bucket * delta
    edges = 0.0
    for t in range(size[PEND]):
        x = pend[t]
        if state[x] != 1:
            continue
        b = np.floor(dist[x] / delta)
        if b <= bucket:
            mark[x] = True
            nxt[size[NXT]] = x
            size[NXT] += 1
        else:
            pend[k] = x
            k += 1
            edges += degree[x] * _below(cdf, dist[x] - floor)
            least = min(least, b)
    size[PEND] = k
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
def sssp_pull(
    indptr,
    adj,
    weight,
    pend,
    size,
    unreached,
    state,
    best,
    member,
    parent,
    nxt,
    mark,
    low,
    top,
    floor,
    delta,
    lo,
    degree,
):
    """Every waiting or unreached owned vertex takes its best path through the members.

    Members are the bits of ``member``, their distances in ``best``. A member improves v
    only along an edge lighter than v's distance less ``floor``, the members' least
    distance, and rows are sorted by weight, so each row is scanned only that far. The
    unreached list is compacted on the way. Improved vertices are booked at the end, as
    ``sssp_relax`` books owned targets.
    """
    one, three, seven = np.uint64(1), np.uint64(3), np.uint64(7)
    ulo = np.uint64(lo)
    n = size[PEND]
    kept = m = 0
    mine = np.empty(n + size[UNREACHED], dtype=np.int64)  # the vertices improved, booked at the end
    for which in range(2):
        count = n if which == 0 else size[UNREACHED]
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
    size[UNREACHED] = kept
    _book(
        mine, m, best[ulo : ulo + state.size], state, pend, nxt, mark, size, low, top, delta, degree
    )
