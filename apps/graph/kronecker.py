"""Graph500 Kronecker edge lists, generated in parallel, the same for any rank count.

The specification's generator (the reference ``kronecker_generator``): 2^SCALE
vertices, edgefactor x 2^SCALE edges; each edge picks one bit of its two endpoints per
level, the source bit set with probability C + D = 1 - (A + B) and the destination bit
with probability D / (C + D) when the source bit is set, else B / (A + B) (so the four
quadrants have probabilities A, B, C, D = 0.57, 0.19, 0.19, 0.05); then the
vertex labels are permuted at random, the edge list is shuffled, and each edge gets a
weight uniform in [0, 1). Self-loops and duplicates are kept.

To make every rank able to produce any slice of the final list without the others,
every random number is a function of (seed, edge, draw) (a splitmix64 hash: a
counter-based generator), and both permutations are keyed Feistel networks over
[0, n) with cycle walking (bijections computed per index, no table). Rank r of P
produces the output positions [r M / P, (r + 1) M / P), so the concatenation over ranks
is the same list at every P (tested).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpcpar.errors import HpcparError

__all__ = ["GraphError", "EdgeList", "kronecker", "feistel_permute", "uniform"]

A, B, C = 0.57, 0.19, 0.19
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


class GraphError(HpcparError):
    """A graph, file or parameter the graph app cannot use."""


@dataclass
class EdgeList:
    """A slice of a graph's edge list: endpoints and weights, plus the whole graph's size."""

    src: np.ndarray
    dst: np.ndarray
    weight: np.ndarray
    n_vertices: int
    n_edges: int  # in the whole list
    first: int  # global position of this slice's first edge


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _hash(seed: int, stream: int, index: np.ndarray, draw: int) -> np.ndarray:
    key = _mix(np.array([seed * 1_000_003 + stream * 7919 + draw], dtype=np.uint64))[0]
    return _mix(index.astype(np.uint64) ^ key)


def uniform(seed: int, stream: int, index: np.ndarray, draw: int) -> np.ndarray:
    """Uniform doubles in [0, 1), one per ``index``, a pure function of all four."""
    return (_hash(seed, stream, index, draw) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def feistel_permute(index: np.ndarray, n: int, seed: int, stream: int) -> np.ndarray:
    """A keyed bijection of [0, n) applied to ``index`` (Feistel rounds, cycle walking)."""
    if n <= 1:
        return np.zeros_like(index, dtype=np.int64)
    bits = max(2, int(n - 1).bit_length())
    bits += bits % 2
    half = bits // 2
    mask = np.uint64((1 << half) - 1)
    x = index.astype(np.uint64)
    todo = np.ones(x.size, dtype=bool)
    while todo.any():
        v = x[todo]
        left, right = v >> np.uint64(half), v & mask
        for r in range(4):
            left, right = right, left ^ (_hash(seed, stream, right, 100 + r) & mask)
        v = (left << np.uint64(half)) | right
        x[todo] = v
        todo[todo] = v >= np.uint64(n)  # outside the domain: walk on until inside
    return x.astype(np.int64)


def kronecker(
    scale: int, edgefactor: int = 16, seed: int = 1, part: int = 0, parts: int = 1
) -> EdgeList:
    """Part ``part`` of ``parts`` of the Graph500 Kronecker edge list (see module doc).

    Raises:
        GraphError: scale outside 1..40, edgefactor < 1, or a part that does not exist.
    """
    if not 1 <= scale <= 40 or edgefactor < 1:
        raise GraphError(
            f"Kronecker graphs need 1 <= SCALE <= 40 and edgefactor >= 1, "
            f"not SCALE {scale}, edgefactor {edgefactor}"
        )
    if not 0 <= part < parts:
        raise GraphError(f"part {part} of {parts} does not exist")
    n, m = 1 << scale, edgefactor << scale
    lo, hi = m * part // parts, m * (part + 1) // parts
    edge = feistel_permute(np.arange(lo, hi, dtype=np.int64), m, seed, stream=1)
    src, dst = raw_kronecker_edges(scale, seed, edge)
    src = feistel_permute(src, n, seed, stream=2)
    dst = feistel_permute(dst, n, seed, stream=2)
    weight = uniform(seed, 3, edge, 0)
    return EdgeList(src, dst, weight, n, m, lo)


def raw_kronecker_edges(scale: int, seed: int, edge: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Endpoints of edges ``edge`` before the vertex permutation (the quadrant recursion)."""
    ab, c_norm, a_norm = A + B, C / (1.0 - (A + B)), A / (A + B)
    src = np.zeros(edge.size, dtype=np.int64)
    dst = np.zeros(edge.size, dtype=np.int64)
    for level in range(scale):
        ii = uniform(seed, 0, edge, 2 * level) > ab
        jj = uniform(seed, 0, edge, 2 * level + 1) > np.where(ii, c_norm, a_norm)
        src |= ii.astype(np.int64) << level
        dst |= jj.astype(np.int64) << level
    return src, dst
