"""The compiled inner loops of the local search (numba; flips are inherently sequential).

Variables are 0-based here. Per clause: ``numtrue`` (true literals) and ``critx``, the
XOR of the variables of its true literals, which is the critical variable whenever
``numtrue == 1`` (probSAT's trick: no scan of the clause). Per variable: ``brk``, the
clauses that become false if it flips, and for configuration checking ``make`` (false
clauses it would satisfy), ``conf`` (a neighbour flipped since it last did) and
``age`` (the flip at which it last flipped). False clauses live in ``false`` with
``where`` as their index in it: O(1) insertion and removal.

Randomness is xoshiro256** with its state in a uint64[4] array, so a run can be
checkpointed and continued flip for flip.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = [
    "ALG_PROBSAT",
    "ALG_WALKSAT",
    "ALG_CC",
    "seed_state",
    "init_state",
    "search",
    "search_probsat",
]

ALG_PROBSAT, ALG_WALKSAT, ALG_CC = 0, 1, 2


def seed_state(seed: int) -> np.ndarray:
    """A xoshiro256** state from ``seed`` (splitmix64, as the authors recommend)."""
    out = np.zeros(4, dtype=np.uint64)
    x = seed & 0xFFFFFFFFFFFFFFFF
    for i in range(4):
        x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        out[i] = z ^ (z >> 31)
    return out


@njit(cache=True, inline="always")
def _rotl(x: np.uint64, k: int) -> np.uint64:
    return (x << np.uint64(k)) | (x >> np.uint64(64 - k))


@njit(cache=True)
def _next(s: np.ndarray) -> np.uint64:
    result = _rotl(s[1] * np.uint64(5), 7) * np.uint64(9)
    t = s[1] << np.uint64(17)
    s[2] ^= s[0]
    s[3] ^= s[1]
    s[1] ^= s[2]
    s[0] ^= s[3]
    s[2] ^= t
    s[3] = _rotl(s[3], 45)
    return result


@njit(cache=True)
def _uniform(s: np.ndarray) -> float:
    return float(_next(s) >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@njit(cache=True)
def _below(s: np.ndarray, n: int) -> int:
    return int(_uniform(s) * n)


@njit(cache=True)
def random_assignment(a: np.ndarray, s: np.ndarray) -> None:
    """Fill ``a`` (uint8) with fair coin flips."""
    for v in range(a.size):
        a[v] = np.uint8(_next(s) >> np.uint64(63))


@njit(cache=True)
def init_state(cvar, csign, cstart, a, numtrue, critx, brk, make, false, where, nfalse):
    """Compute every counter from the assignment ``a`` (after a start or a restore)."""
    brk[:] = 0
    make[:] = 0
    nf = 0
    for c in range(cstart.size - 1):
        t = 0
        x = 0
        for j in range(cstart[c], cstart[c + 1]):
            if a[cvar[j]] == csign[j]:
                t += 1
                x ^= cvar[j]
        numtrue[c] = t
        critx[c] = x
        if t == 0:
            false[nf] = c
            where[c] = nf
            nf += 1
            for j in range(cstart[c], cstart[c + 1]):
                make[cvar[j]] += 1
        elif t == 1:
            brk[x] += 1
    nfalse[0] = nf


@njit(cache=True)
def _flip(v, cvar, cstart, occ, ostart, a, numtrue, critx, brk, make, false, where, nfalse, cc):
    a[v] = 1 - a[v]
    now_true = 2 * v + (1 - a[v])  # literal index: 2v positive, 2v+1 negative
    now_false = now_true ^ 1
    for i in range(ostart[now_true], ostart[now_true + 1]):
        c = occ[i]
        if numtrue[c] == 0:  # false -> satisfied by v alone
            last = false[nfalse[0] - 1]
            false[where[c]] = last
            where[last] = where[c]
            nfalse[0] -= 1
            brk[v] += 1
            if cc:
                for j in range(cstart[c], cstart[c + 1]):
                    make[cvar[j]] -= 1
        elif numtrue[c] == 1:
            brk[critx[c]] -= 1  # the old critical variable is no longer alone
        numtrue[c] += 1
        critx[c] ^= v
    for i in range(ostart[now_false], ostart[now_false + 1]):
        c = occ[i]
        numtrue[c] -= 1
        critx[c] ^= v
        if numtrue[c] == 0:
            false[nfalse[0]] = c
            where[c] = nfalse[0]
            nfalse[0] += 1
            brk[v] -= 1
            if cc:
                for j in range(cstart[c], cstart[c + 1]):
                    make[cvar[j]] += 1
        elif numtrue[c] == 1:
            brk[critx[c]] += 1


@njit(cache=True)
def search(  # noqa: PLR0912, PLR0915
    alg,
    params,
    probs,
    cvar,
    csign,
    cstart,
    occ,
    ostart,
    a,
    numtrue,
    critx,
    brk,
    make,
    false,
    where,
    nfalse,
    conf,
    age,
    rng,
    weight,
    start_flip,
    max_flips,
):
    """Flip until no clause is false or ``max_flips`` flips are done; returns the flips.

    ``params``: probSAT unused (``probs[b]`` is the weight of break ``b``); WalkSAT
    ``params[0]`` the noise; CC ``params[0]`` the random-walk probability. ``weight``:
    scratch as long as the longest clause, allocated once by the caller (this runs once
    per chunk of flips, so it must not scan the formula).
    """
    cc = alg == ALG_CC
    flips = 0
    while flips < max_flips and nfalse[0] > 0:
        c = false[_below(rng, nfalse[0])]
        lo, hi = cstart[c], cstart[c + 1]
        n = hi - lo
        v = -1
        if alg == ALG_PROBSAT:
            total = 0.0
            for j in range(n):
                b = brk[cvar[lo + j]]
                total += probs[b] if b < probs.size else probs[probs.size - 1]
                weight[j] = total
            r = _uniform(rng) * total
            v = cvar[hi - 1]
            for j in range(n):
                if r < weight[j]:
                    v = cvar[lo + j]
                    break
        elif alg == ALG_WALKSAT:
            best = 1 << 30
            ties = 0
            for j in range(n):
                b = brk[cvar[lo + j]]
                if b < best:
                    best, ties = b, 1
                    v = cvar[lo + j]
                elif b == best:
                    ties += 1
                    if _below(rng, ties) == 0:  # reservoir: uniform among the ties
                        v = cvar[lo + j]
            if best > 0 and _uniform(rng) < params[0]:
                v = cvar[lo + _below(rng, n)]
        elif _uniform(rng) < params[0]:  # configuration checking: random walk
            v = cvar[lo + _below(rng, n)]
        else:  # configuration checking, focused on the false clause
            best = -(1 << 30)
            any_conf = False
            for j in range(n):
                if conf[cvar[lo + j]]:
                    any_conf = True
            for j in range(n):
                u = cvar[lo + j]
                if any_conf and not conf[u]:
                    continue
                score = make[u] - brk[u]
                if score > best or (score == best and age[u] < age[v]):
                    best, v = score, u
        _flip(v, cvar, cstart, occ, ostart, a, numtrue, critx, brk, make, false, where, nfalse, cc)
        flips += 1
        if cc:
            age[v] = start_flip + flips
            conf[v] = 0
            for lit in (2 * v, 2 * v + 1):
                for i in range(ostart[lit], ostart[lit + 1]):
                    d = occ[i]
                    for j in range(cstart[d], cstart[d + 1]):
                        if cvar[j] != v:
                            conf[cvar[j]] = 1
    return flips


@njit(cache=True, inline="always")
def _xoshiro(s0, s1, s2, s3):  # type: ignore[no-untyped-def]
    """One xoshiro256** step on a state held in locals: (output, new state)."""
    result = _rotl(s1 * np.uint64(5), 7) * np.uint64(9)
    t = s1 << np.uint64(17)
    s2 ^= s0
    s3 ^= s1
    s1 ^= s2
    s0 ^= s3
    s2 ^= t
    s3 = _rotl(s3, 45)
    return result, s0, s1, s2, s3


@njit(cache=True)
def search_probsat(  # noqa: PLR0915
    probs,
    cvar,
    cstart,
    occ,
    ostart,
    a,
    numtrue,
    critx,
    brk,
    false,
    where,
    nfalse,
    rng,
    weight,
    max_flips,
):
    """``search`` for probSAT alone: the same flips from the same state, faster.

    The counters the loop changes every flip (the false-clause count, the random
    state) live in locals, written back at the end, so they stay in registers instead of
    going through memory that the compiler must assume the other arrays may alias; every
    index is unsigned, so no array access pays numba's check for a negative index; and
    no configuration-checking bookkeeping is done. ``hpcpar bench sat`` measures it.
    """
    scale = 1.0 / 9007199254740992.0
    one, two, eleven = np.uint64(1), np.uint64(2), np.uint64(11)
    s0, s1, s2, s3 = rng[0], rng[1], rng[2], rng[3]
    nf = np.uint64(nfalse[0])
    flips = 0
    while flips < max_flips and nf > 0:
        x, s0, s1, s2, s3 = _xoshiro(s0, s1, s2, s3)
        c = np.uint64(false[np.uint64(float(x >> eleven) * scale * float(nf))])
        lo, hi = np.uint64(cstart[c]), np.uint64(cstart[c + one])
        total = 0.0
        j = lo
        while j < hi:
            total += probs[np.uint64(brk[np.uint64(cvar[j])])]
            weight[j - lo] = total
            j += one
        x, s0, s1, s2, s3 = _xoshiro(s0, s1, s2, s3)
        r = float(x >> eleven) * scale * total
        v = np.uint64(cvar[hi - one])
        j = lo
        while j < hi:
            if r < weight[j - lo]:
                v = np.uint64(cvar[j])
                break
            j += one
        now = one - np.uint64(a[v])
        a[v] = now
        now_true = two * v + (one - now)  # literal index: 2v positive, 2v+1 negative
        v32 = np.int32(v)
        i, end = np.uint64(ostart[now_true]), np.uint64(ostart[now_true + one])
        while i < end:
            d = np.uint64(occ[i])
            t = numtrue[d]
            if t == 0:  # false -> satisfied by v alone
                nf -= one
                last = np.uint64(false[nf])
                at = np.uint64(where[d])
                false[at] = last
                where[last] = at
                brk[v] += 1
            elif t == 1:
                brk[np.uint64(critx[d])] -= 1  # the old critical variable is no longer alone
            numtrue[d] = t + 1
            critx[d] ^= v32
            i += one
        i, end = np.uint64(ostart[now_true ^ one]), np.uint64(ostart[(now_true ^ one) + one])
        while i < end:
            d = np.uint64(occ[i])
            t = numtrue[d] - 1
            numtrue[d] = t
            critx[d] ^= v32
            if t == 0:
                false[nf] = d
                where[d] = nf
                nf += one
                brk[v] -= 1
            elif t == 1:
                brk[np.uint64(critx[d])] += 1
            i += one
        flips += 1
    rng[0], rng[1], rng[2], rng[3] = s0, s1, s2, s3
    nfalse[0] = nf
    return flips
