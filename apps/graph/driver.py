"""The Graph500 benchmark driver: generate or read, build, search from 64 keys, validate, report.

``run(comm, ...)`` follows the specification's sequence (and the reference ``main.c``):
the edge list is generated (timed as ``graph_generation``) or read, the graph is built
(``construction_time``), search keys are sampled among vertices with at least one edge
that is not a self-loop, every search is timed from a barrier to its last collective
(the slowest rank's time), optionally validated, and the statistics block is printed in
the reference's format: quartiles as the reference computes them, TEPS statistics from
seconds per edge (so the mean is the harmonic mean TEPS).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mpi4py import MPI

from .graph import DistGraph, agree
from .kronecker import EdgeList, GraphError, kronecker, uniform
from .search import bfs, sssp
from .validate import ValidationError, validate

__all__ = [
    "RunResult",
    "run",
    "statistics",
    "harmonic_teps",
    "output_block",
    "search_keys",
    "check_memory",
    "BYTES_PER_EDGE",
]

# Peak bytes per input edge while generating, building and validating: the slice (24),
# the CSR (both directions: 24 and offsets), the narrowed chunks awaiting placement (32)
# and a chunk's routing and lookup buffers; ``hpcpar bench graph`` reports the peak.
BYTES_PER_EDGE = 120


@dataclass
class RunResult:
    """What a run measured (times in seconds, per search key)."""

    scale: int | None
    edgefactor: int | None
    n: int
    m: int
    ranks: int
    partition: str
    generation: float
    construction: float
    roots: list[int]
    times: dict[str, list[float]] = field(default_factory=dict)  # "bfs"/"sssp"
    nedge: list[int] = field(default_factory=list)
    validate_times: dict[str, list[float]] = field(default_factory=dict)
    levels: list[list[str]] = field(default_factory=list)
    imbalance: dict[str, Any] = field(default_factory=dict)

    def harmonic_teps(self, kind: str) -> float:
        """Harmonic mean TEPS of ``kind`` ("bfs" or "sssp"), as the specification defines it."""
        return harmonic_teps(self.times[kind], self.nedge)


def harmonic_teps(times: list[float], nedge: list[int]) -> float:
    """1 / mean(seconds per edge): the specification's harmonic mean of per-search TEPS."""
    return float(1.0 / (np.array(times) / np.array(nedge, dtype=np.float64)).mean())


def statistics(x: list[float] | np.ndarray) -> dict[str, float]:
    """The reference ``get_statistics``: min, quartiles, max, mean, sample stddev."""
    xx = np.sort(np.asarray(x, dtype=np.float64))
    n = xx.size
    return {
        "min": float(xx[0]),
        "firstquartile": float((xx[(n - 1) // 4] + xx[n // 4]) * 0.5),
        "median": float((xx[(n - 1) // 2] + xx[n // 2]) * 0.5),
        "thirdquartile": float((xx[n - 1 - (n - 1) // 4] + xx[n - 1 - n // 4]) * 0.5),
        "max": float(xx[-1]),
        "mean": float(xx.mean()),
        "stddev": float(xx.std(ddof=1)) if n > 1 else 0.0,
    }


def output_block(r: RunResult) -> str:
    """The specification's output block, in the reference implementation's layout."""

    def line(label: str, value: Any) -> str:
        return f"{label:<32}{value}"

    out = [
        line("SCALE:", r.scale if r.scale is not None else "file"),
        line("edgefactor:", r.edgefactor if r.edgefactor else "file"),
        line("NBFS:", len(r.roots)),
        line("graph_generation:", f"{r.generation:g}"),
        line("num_mpi_processes:", r.ranks),
        line("partition:", r.partition),
        line("construction_time:", f"{r.construction:g}"),
    ]
    for kind, t in r.times.items():
        out += [line(f"{kind:<4} {key}_time:", f"{v:g}") for key, v in statistics(t).items()]
    out += [line(f"{key}_nedge:", f"{v:.11g}") for key, v in statistics(r.nedge).items()]
    for kind, t in r.times.items():
        s = statistics(np.array(t) / np.array(r.nedge, dtype=np.float64))
        inv = {
            "min": s["max"],
            "firstquartile": s["thirdquartile"],
            "median": s["median"],
            "thirdquartile": s["firstquartile"],
            "max": s["min"],
        }
        out += [line(f"{kind:<4} {key}_TEPS:", f"{1.0 / v:g}") for key, v in inv.items()]
        out.append(line(f"{kind:<4} harmonic_mean_TEPS:     !", f"{1.0 / s['mean']:g}"))
        n = len(t)
        hstd = s["stddev"] / (s["mean"] ** 2 * math.sqrt(n - 1)) if n > 1 else 0.0
        out.append(line(f"{kind:<4} harmonic_stddev_TEPS:", f"{hstd:g}"))
    for kind, t in r.validate_times.items():
        out += [line(f"{kind:<4} {key}_validate:", f"{v:g}") for key, v in statistics(t).items()]
    return "\n".join(out)


def check_memory(comm: Any, m: int, ranks_here: int) -> None:
    """Refuse, before allocating, a graph whose build would not fit in this node's memory."""
    need = BYTES_PER_EDGE * m / comm.Get_size() * ranks_here
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        available = int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return
    if need > available:
        raise GraphError(
            f"{m:,} edges need about {need / 2**30:.1f} GiB on this node "
            f"({ranks_here} rank(s) here), but {available / 2**30:.1f} GiB is "
            f"available; use a smaller SCALE or more nodes"
        )


def search_keys(g: DistGraph, count: int, seed: int) -> list[int]:
    """``count`` distinct vertices of degree >= 1 (self-loops excluded), sampled from ``seed``.

    Candidates are a counter-based random sequence, so every rank draws the same ones;
    when fewer than ``count`` vertices qualify, all of them are used.
    """
    lo, hi = g.grid.lo, g.grid.hi
    eligible = g.comm.allreduce(int(np.count_nonzero(g.degree)))
    if eligible == 0:
        raise GraphError("no vertex has an edge that is not a self-loop: nothing to search")
    if eligible <= count or eligible * 64 < g.n:
        mine = (np.flatnonzero(g.degree) + lo).tolist()
        every = sorted(v for part in g.comm.allgather(mine) for v in part)
        if eligible <= count:
            return every
        pick = np.argsort(uniform(seed, 4, np.arange(len(every)), 1))[:count]
        return [every[k] for k in pick]
    keys: list[int] = []
    start = 0
    while len(keys) < count:
        idx = np.arange(start, start + 4 * count)
        cand = np.minimum((uniform(seed, 4, idx, 0) * g.n).astype(np.int64), g.n - 1)
        ok = np.zeros(cand.size, dtype=np.int8)
        own = (cand >= lo) & (cand < hi)
        ok[own] = g.degree[cand[own] - lo] > 0
        g.comm.Allreduce(MPI.IN_PLACE, ok, op=MPI.MAX)
        for v in cand[ok > 0].tolist():
            if v not in keys and len(keys) < count:
                keys.append(v)
        start += cand.size
    return keys


def _timed(job: Any, fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    job.Barrier()
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    elapsed = time.perf_counter() - start
    return result, job.allreduce(elapsed, op=MPI.MAX)


def run(
    comm: Any,
    *,
    kinds: tuple[str, ...] = ("bfs",),
    scale: int | None = 16,
    edgefactor: int = 16,
    seed: int = 1,
    edges: EdgeList | None = None,
    partition: str = "1d-vertex",
    grid: str | None = None,
    roots: int = 64,
    root: int | None = None,
    validate_results: bool | int = True,
    delta: float | None = None,
    direction: str = "auto",
    alpha: float = 14.0,
    beta: float = 24.0,
    relax: str = "auto",
    layout: str | None = None,
    progress: Any = None,
) -> RunResult:
    """Run the benchmark (collective); ``edges`` (this rank's slice) replaces generation.

    ``validate_results``: True validates every search, an integer k the first k keys'.

    Raises:
        GraphError: bad parameters or input, or a result the validator rejects.
    """
    size = comm.Get_size()
    edges, generation = _edges(comm, edges, scale, edgefactor, seed)
    if "sssp" in kinds:
        agree(comm, _check_weights, edges)
    g, construction = _timed(
        comm, DistGraph.build, edges, comm=comm, partition=partition, grid=grid, layout=layout
    )
    # No try/finally around the searches: freeing communicators is collective, and after
    # an error on some ranks the others may never get there (the CLI aborts the job).
    if delta is None:  # Meyer and Sanders: Theta(1 / average degree)
        delta = 1.0 / max(1.0, 2.0 * g.m / g.n)
    keys = [root] if root is not None else search_keys(g, roots, seed)
    result = RunResult(
        scale,
        edgefactor if scale is not None else None,
        g.n,
        g.m,
        size,
        partition,
        generation,
        construction,
        keys,
    )
    searches = {
        "bfs": lambda key: bfs(g, key, direction=direction, alpha=alpha, beta=beta),
        "sssp": lambda key: sssp(g, key, delta=delta, direction=relax),
    }
    for kind in kinds:  # compile and warm up
        searches[kind](keys[0])
    g.reset_volume()
    for kind in kinds:
        result.times[kind], result.validate_times[kind] = [], []
    for k, key in enumerate(keys):
        for kind in kinds:
            found, t = _timed(comm, searches[kind], key)
            result.times[kind].append(t)
            if kind == "bfs":
                result.levels.append(found.levels)
            if kind == kinds[0]:
                result.nedge.append(found.traversed_edges(g))
            if validate_results is True or k < int(validate_results):
                check, vt = _timed(comm, validate, g, edges, key, found.parent, found.dist)
                result.validate_times[kind].append(vt)
                _raise_unless_valid(kind, key, check, result.nedge[k])
        if progress is not None:
            progress(k + 1, len(keys))
    result.validate_times = {kind: t for kind, t in result.validate_times.items() if t}
    result.imbalance = g.load_imbalance()
    g.free()
    return result


def _edges(
    comm: Any, edges: EdgeList | None, scale: int | None, edgefactor: int, seed: int
) -> tuple[EdgeList, float]:
    ranks_here = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_size()
    if edges is not None:
        check_memory(comm, comm.allreduce(edges.src.size), ranks_here)
        return edges, 0.0
    if scale is None or not 1 <= scale <= 40 or edgefactor < 1:
        raise GraphError(
            f"need 1 <= SCALE <= 40 and edgefactor >= 1, not SCALE {scale}, edgefactor {edgefactor}"
        )
    check_memory(comm, edgefactor << scale, ranks_here)
    return _timed(comm, kronecker, scale, edgefactor, seed, comm.Get_rank(), comm.Get_size())


def _raise_unless_valid(kind: str, key: int, check: Any, nedge: int) -> None:
    if not check.ok:
        raise ValidationError(f"{kind} from root {key} failed validation: {check.examples[0]}")
    if check.traversed_edges != nedge:
        raise ValidationError(
            f"{kind} from root {key}: {nedge} edges counted, the "
            f"validator found {check.traversed_edges}"
        )


def _check_weights(edges: EdgeList) -> None:
    bad = np.flatnonzero(edges.weight < 0)
    if bad.size:
        raise GraphError(
            f"edge {edges.first + int(bad[0])} has negative weight "
            f"{edges.weight[bad[0]]:g}; SSSP needs weights >= 0"
        )
