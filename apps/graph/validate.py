"""The Graph500 validator, distributed: BFS parent trees and SSSP distance trees.

It checks against the input edge list (each rank reads its own slice), never against the
CSR the search used, so a construction bug cannot hide a search bug. The rules (the
specification's five for BFS and their SSSP analogue, as in the reference ``validate.c``):

1. every parent is a vertex or -1; the root is its own parent (distance 0);
2. parent chains reach the root without a cycle (levels are computed from them);
3. every input edge joins two reached vertices or two unreached ones (the tree spans the
   root's component);
4. every input edge satisfies the triangle rule: levels differ by at most one (BFS), or
   ``dist[a] + w >= dist[b]`` both ways (SSSP);
5. every reached vertex but the root is confirmed by an input edge to its parent with
   ``level[v] == level[parent] + 1`` (BFS) or ``dist[v] == dist[parent] + w`` (SSSP).

It also counts the traversed edges (input edges, self-loops excluded, with an end in the
component), which TEPS divides by the search time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mpi4py import MPI

from .graph import DistGraph, edge_chunks
from .kronecker import EdgeList, GraphError

__all__ = ["ValidationError", "Validation", "validate"]

_CHUNK = 1 << 22  # input edges checked per round of lookups

_RULES = (
    "parent out of range",
    "root is not its own parent at distance 0",
    "parent chain does not reach the root (a cycle)",
    "edge joins a reached and an unreached vertex (missed vertex)",
    "edge violates the triangle rule (level jump or distance too large)",
    "parent not confirmed by an input edge (wrong parent or distance)",
)


class ValidationError(GraphError):
    """A search result broke one of the validator's rules."""


@dataclass
class Validation:
    """What the validator found (``errors[rule]``: how many, summed over ranks)."""

    traversed_edges: int
    errors: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether no rule was broken."""
        return not any(self.errors.values())


def _levels(g: DistGraph, parent: np.ndarray, root: int) -> tuple[np.ndarray, int]:
    """Hop count from the root along parent pointers (-1: unreached or in a cycle)."""
    lo = g.grid.lo
    level = np.full(g.own, -1, dtype=np.int64)
    if lo <= root < g.grid.hi and parent[root - lo] == root:
        level[root - lo] = 0
    pending = np.flatnonzero((parent >= 0) & (level < 0))
    while True:
        (known,) = g.lookup([level], parent[pending])
        hit = known >= 0
        level[pending[hit]] = known[hit] + 1
        pending = pending[~hit]
        if g.comm.allreduce(int(hit.sum())) == 0:
            return level, int(pending.size)


def _triangle(
    la: np.ndarray,
    lb: np.ndarray,
    dist: tuple[np.ndarray, np.ndarray] | None,
    w: np.ndarray,
    both: np.ndarray,
    rtol: float,
) -> tuple[np.ndarray, ...]:
    """Per edge: the triangle rule broken, and whether b (a) may hang below a (b)."""
    if dist is None:
        return both & (np.abs(la - lb) > 1), lb == la + 1, la == lb + 1
    da, db = dist
    with np.errstate(invalid="ignore"):  # inf - inf between unreached vertices
        tol = rtol * (1.0 + np.maximum(np.abs(da), np.abs(db)))
        violates = both & ((da + w < db - tol) | (db + w < da - tol))
        return violates, np.abs(db - (da + w)) <= tol, np.abs(da - (db + w)) <= tol


def _check_edges(
    g: DistGraph,
    values: list[np.ndarray],
    a: np.ndarray,
    b: np.ndarray,
    w: np.ndarray,
    rtol: float,
    flag: Any,
    confirmed: np.ndarray,
) -> int:
    """Rules 3 and 4 on the edges (a, b, w); marks the vertices they confirm (rule 5).

    Collective. Returns the count of those edges with an end reached.
    """
    got = g.lookup(values, np.concatenate([a, b]))
    pa, pb = got[0][: a.size], got[0][a.size :]
    la, lb = got[1][: a.size], got[1][a.size :]
    reached_a, reached_b = pa >= 0, pb >= 0
    mixed = np.flatnonzero(reached_a != reached_b)
    if mixed.size:
        flag(_RULES[3], mixed, f"edge {a[mixed[0]]}-{b[mixed[0]]}")
    both = reached_a & reached_b
    far = None if len(values) < 3 else (got[2][: a.size], got[2][a.size :])
    violates, step_ab, step_ba = _triangle(la, lb, far, w, both, rtol)
    bad = np.flatnonzero(violates)
    if bad.size:
        flag(_RULES[4], bad, f"edge {a[bad[0]]}-{b[bad[0]]}")
    confirm = np.concatenate([b[both & (pb == a) & step_ab], a[both & (pa == b) & step_ba]])
    confirmed[g.send_to_owner(confirm)] = True
    return int(np.count_nonzero(reached_a | reached_b))


def validate(
    g: DistGraph,
    edges: EdgeList,
    root: int,
    parent: np.ndarray,
    dist: np.ndarray | None = None,
    *,
    rtol: float = 1e-9,
) -> Validation:
    """Check a BFS (``dist=None``) or SSSP result (collective); never raises on a bad result."""
    lo, n = g.grid.lo, g.n
    counts = dict.fromkeys(_RULES, 0)
    examples: list[str] = []

    def flag(rule: str, bad: np.ndarray, describe: str) -> None:
        if bad.size:
            counts[rule] += int(bad.size)
            if len(examples) < 5:
                examples.append(f"{rule}: {describe}")

    out_of_range = np.flatnonzero((parent < -1) | (parent >= n))
    if out_of_range.size:
        k = out_of_range[0]
        flag(_RULES[0], out_of_range, f"vertex {k + lo} has parent {parent[k]}")
    parent = np.where((parent < -1) | (parent >= n), -1, parent)
    if lo <= root < g.grid.hi:
        bad_root = parent[root - lo] != root or (dist is not None and dist[root - lo] != 0)
        flag(_RULES[1], np.flatnonzero([bad_root]), f"root {root}")
    level, cyclic = _levels(g, parent, root)
    flag(_RULES[2], np.arange(cyclic), f"{cyclic} vertices on rank {g.comm.Get_rank()}")
    confirmed = np.zeros(g.own, dtype=bool)
    traversed = 0
    values = [parent, level] if dist is None else [parent, level, dist]
    for a, b, w in edge_chunks(g.comm, edges, _CHUNK):  # bounded memory
        traversed += _check_edges(g, values, a, b, w, rtol, flag, confirmed)
    if lo <= root < g.grid.hi:
        confirmed[root - lo] = True
    unconfirmed = np.flatnonzero((parent >= 0) & ~confirmed & (level >= 0))
    if unconfirmed.size:
        k = unconfirmed[0]
        flag(_RULES[5], unconfirmed, f"vertex {k + lo} with parent {parent[k]}")
    totals = np.array([counts[r] for r in _RULES] + [traversed], dtype=np.int64)
    g.comm.Allreduce(MPI.IN_PLACE, totals)
    all_examples = [e for part in g.comm.allgather(examples) for e in part]
    return Validation(
        int(totals[-1]), dict(zip(_RULES, totals[:-1].tolist(), strict=True)), all_examples[:5]
    )
