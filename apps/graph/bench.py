"""``hpcpar bench graph``: Graph500 BFS and SSSP TEPS per partition vs scipy and the reference.

Per SCALE (the specification's Kronecker graph, generated once and shared by every
partition): hpcpar's BFS and SSSP from the same ``--roots`` search keys for every
partition (the first ``--validate`` keys validated); on rank 0, while the other ranks
sleep, ``scipy.sparse.csgraph.breadth_first_order`` and ``dijkstra`` from the same keys
on the same graph (a symmetric CSR with self-loops dropped and the lightest of duplicate
edges kept, built outside the timing; TEPS with the same edge counts); and, with
``--peer-binary``, the Graph500 reference implementation (``graph500_reference_bfs_sssp``
built from its public source) at the same rank count, started by rank 0 with the MPI
launcher that belongs to mpi4py's MPI while hpcpar's ranks sleep. The reference draws its
own graph (its generator, same SCALE and edgefactor) and its own 64 keys and times its
own kernels; its harmonic means are compared with ours. With ``--gap-binary DIR``, the
GAP benchmark suite's ``bfs`` and ``sssp`` (built from its public source) run on rank 0
with as many OpenMP threads as the job has ranks, on GAP's own Kronecker graph of the
same SCALE and degree, ``--roots`` trials each (``sssp`` with ``--gap-delta``, by default
the 2 that GAP's own benchmark runs on Kronecker graphs; a list such as ``1,2,4`` runs it
once per delta and compares with the fastest); their times are turned into TEPS with
Graph500's edge count (the mean over our keys of the input edges in the searched
component), so the rates compare like for like.

Figures: harmonic-mean TEPS (the specification's), median TEPS over keys and its quartile
spread, the ratio to scipy and to the reference, and the load-imbalance table: per rank
vertices, stored adjacency entries and bytes exchanged within and between nodes during
the measured searches (max / mean over ranks).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import time
from typing import Any

import numpy as np

from hpcpar.bench.harness import Row, quartile_spread, rank0_printer
from hpcpar.cli.common import integer, real
from hpcpar.plugins import Benchmark, register

__all__: list[str] = []


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scales", default="16,18,20", help="SCALEs (16,18,20)")
    parser.add_argument("--edgefactor", type=integer(1, 1 << 16), default=16)
    parser.add_argument("--partitions", default="1d-vertex,1d-edge,2d,hier")
    parser.add_argument(
        "--roots", type=integer(1, 1 << 20), default=16, help="search keys per kernel (16)"
    )
    parser.add_argument(
        "--validate",
        type=integer(0),
        default=2,
        metavar="K",
        help="validate the first K keys' results (2)",
    )
    parser.add_argument("--kernels", default="bfs,sssp")
    parser.add_argument(
        "--peer-binary", metavar="PATH", help="graph500_reference_bfs_sssp built from its source"
    )
    parser.add_argument(
        "--gap-binary", metavar="DIR", help="the GAP benchmark suite's folder (its bfs and sssp)"
    )
    parser.add_argument(
        "--gap-delta",
        type=_deltas,
        default=[2.0],
        metavar="D[,D...]",
        help="GAP sssp's delta (-d; default 2, what GAP's benchmark/bench.mk runs on Kronecker "
        "graphs); several: one run each, hpcpar compared with the fastest",
    )
    parser.add_argument("--no-scipy", action="store_true", help="leave out the scipy peer")
    parser.add_argument("--peer-timeout", type=real(0, above=True), default=900.0, metavar="S")


def _deltas(text: str) -> list[float]:
    """An argparse ``type``: one or more deltas above 0, comma-separated."""
    one = real(0, above=True)
    deltas = [one(part) for part in text.split(",")]
    if len(set(deltas)) != len(deltas):
        raise argparse.ArgumentTypeError(f"a delta given twice in {text!r}")
    return deltas


def _teps(times: list[float], nedge: list[int]) -> dict[str, float]:
    from .driver import harmonic_teps

    teps = [e / t for e, t in zip(nedge, times, strict=True)]
    return {
        "harmonic_mean": harmonic_teps(times, nedge),
        "median": statistics.median(teps),
        "min": min(teps),
        "max": max(teps),
        "spread_pct": quartile_spread(teps),
    }


def _scipy(edges: Any, keys: list[int], nedge: list[int], kernels: list[str]) -> list[dict]:
    import scipy.sparse as sp
    from scipy.sparse import csgraph

    keep = edges.src != edges.dst
    s = np.concatenate([edges.src[keep], edges.dst[keep]])
    d = np.concatenate([edges.dst[keep], edges.src[keep]])
    w = np.concatenate([edges.weight[keep], edges.weight[keep]])
    order = np.lexsort((w, d, s))
    s, d, w = s[order], d[order], w[order]
    first = np.ones(s.size, dtype=bool)
    first[1:] = (s[1:] != s[:-1]) | (d[1:] != d[:-1])
    n = edges.n_vertices
    graph = sp.csr_matrix((w[first], (s[first], d[first])), shape=(n, n))
    graph.sort_indices()
    docs = []
    for kernel in kernels:
        times = []
        for key in keys:
            t0 = time.perf_counter()
            if kernel == "bfs":  # symmetric already: directed=True avoids a conversion per call
                csgraph.breadth_first_order(graph, key, directed=True, return_predecessors=True)
            else:
                csgraph.dijkstra(graph, directed=True, indices=key, return_predecessors=True)
            times.append(time.perf_counter() - t0)
        docs.append({"variant": "scipy", "kernel": kernel, "teps": _teps(times, nedge)})
    return docs


def _reference(binary: str, ranks: int, scale: int, edgefactor: int, timeout: float) -> list[dict]:
    from hpcpar.launcher import detached_env
    from hpcpar.runtime.mpiinfo import find_mpi

    # SKIP_VALIDATION: the reference validates after its timing; skip that cost.
    mpiexec = find_mpi().mpiexec
    if mpiexec is None:
        raise RuntimeError("no mpiexec found for the MPI library mpi4py loads (HPCPAR_MPIEXEC)")
    cmd = [mpiexec, "-n", str(ranks), binary, str(scale), str(edgefactor)]
    done = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=detached_env(SKIP_VALIDATION="1"),
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr[-500:]}")
    docs = []
    for kernel, tag in (("bfs", "BFS"), ("sssp", "SSSP")):
        per = [float(x) for x in re.findall(rf"TEPS for {tag} \d+ is (\S+)", done.stderr)]
        harmonic = re.search(rf"{kernel}\s+harmonic_mean_TEPS:\s+!\s+(\S+)", done.stdout)
        if not per or harmonic is None:
            continue
        docs.append(
            {
                "variant": "graph500-ref",
                "kernel": kernel,
                "teps": {
                    "harmonic_mean": float(harmonic.group(1)),
                    "median": statistics.median(per),
                    "min": min(per),
                    "max": max(per),
                    "spread_pct": quartile_spread(per),
                },
            }
        )
    construction = re.search(r"construction_time:\s+(\S+)", done.stdout)
    for d in docs:
        d["construction_s"] = float(construction.group(1)) if construction else None
    return docs


def _gap(
    folder: str,
    threads: int,
    scale: int,
    edgefactor: int,
    roots: int,
    kernels: list[str],
    edges: float,
    timeout: float,
    deltas: list[float],
) -> list[dict]:
    """GAP's kernels on its own graph of this SCALE and degree, in Graph500's edges.

    ``sssp`` runs with ``-d delta`` for each of ``deltas`` (GAP's benchmark runs its
    Kronecker graph with 2): variant ``gap`` for one delta, ``gap-d<D>`` for several.
    """
    from pathlib import Path

    docs = []
    runs = [(k, d) for k in kernels for d in (deltas if k == "sssp" else [None])]
    for kernel, delta in runs:
        binary = Path(folder) / kernel
        cmd = [str(binary), "-g", str(scale), "-k", str(edgefactor), "-n", str(roots)]
        if delta is not None:
            cmd += ["-d", f"{delta:g}"]
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_PROC_BIND="false")
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
        times = [float(x) for x in re.findall(r"Trial Time:\s+(\S+)", done.stdout)]
        if done.returncode != 0 or not times:
            raise RuntimeError(
                f"{' '.join(cmd)} failed ({done.returncode}): {(done.stderr or done.stdout)[-500:]}"
            )
        build = re.search(r"Build Time:\s+(\S+)", done.stdout)
        docs.append(
            {
                "variant": "gap" if delta is None or len(deltas) == 1 else f"gap-d{delta:g}",
                "kernel": kernel,
                "threads": threads,
                "delta": delta,
                "teps": _teps(times, [int(edges)] * len(times)),
                "construction_s": float(build.group(1)) if build else None,
            }
        )
    return docs


def _peers(
    args: argparse.Namespace,
    whole: list[Any] | None,
    edges: Any,
    keys: list[int],
    nedge: list[int],
    kernels: list[str],
    size: int,
    scale: int,
) -> list[dict]:
    """Rank 0, while the others sleep: scipy on the gathered graph, the reference, GAP."""
    from . import EdgeList

    peers: list[dict] = []
    if whole is not None:
        full = EdgeList(
            *(np.concatenate([getattr(e, f) for e in whole]) for f in ("src", "dst", "weight")),
            edges.n_vertices,
            edges.n_edges,
            0,
        )
        peers = _scipy(full, keys, nedge, kernels)
        del full
    if args.peer_binary:
        peers += _reference(args.peer_binary, size, scale, args.edgefactor, args.peer_timeout)
    if args.gap_binary:
        peers += _gap(
            args.gap_binary,
            size,
            scale,
            args.edgefactor,
            args.roots,
            kernels,
            float(np.mean(nedge)),
            args.peer_timeout,
            args.gap_delta,
        )
    return peers


def _peak_memory(comm: Any) -> int:
    """The ranks' peak resident memory so far, summed (Linux reports ru_maxrss in KiB)."""
    import resource

    return int(comm.allreduce(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))


def _graph_bytes(comm: Any, docs: list[dict]) -> int:
    return max((d.get("graph_bytes", 0) for d in docs), default=0)


def _imbalance(table: dict[str, list[int]]) -> dict[str, float]:
    out = {}
    for key in ("vertices", "entries"):
        x = np.array(table[key], dtype=np.float64)
        out[f"{key}_max_over_mean"] = float(x.max() / x.mean()) if x.mean() else 1.0
    volume = np.array(table["bytes_intra"]) + np.array(table["bytes_inter"])
    out["volume_max_over_mean"] = float(volume.max() / volume.mean()) if volume.mean() else 1.0
    out["bytes_intra"] = int(np.sum(table["bytes_intra"]))
    out["bytes_inter"] = int(np.sum(table["bytes_inter"]))
    out["graph_bytes"] = int(np.sum(table.get("graph_bytes", [0])))
    return out


def _run(comm: Any, args: argparse.Namespace) -> list[Any]:
    from hpcpar.errors import UsageError
    from hpcpar.runtime.comm import idle_barrier

    from . import kronecker
    from .driver import run
    from .partition import PARTITIONS

    try:
        scales = [int(s) for s in args.scales.split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"bench graph: --scales takes integers, not {args.scales!r}") from None
    partitions = [p.strip() for p in args.partitions.split(",") if p.strip()]
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    bad = [p for p in partitions if p not in PARTITIONS] + [
        k for k in kernels if k not in ("bfs", "sssp")
    ]
    if bad or not scales or min(scales) < 1 or max(scales) > 30 or args.roots < 1:
        raise UsageError(
            f"bench graph: bad --scales/--partitions/--kernels/--roots "
            f"({', '.join(bad) or args.scales}); "
            f"partitions: {', '.join(PARTITIONS)}"
        )
    for binary in [f"{args.gap_binary}/{k}" for k in kernels] if args.gap_binary else []:
        if not __import__("os").access(binary, __import__("os").X_OK):
            raise UsageError(f"bench graph: --gap-binary: no executable {binary}")
    say = rank0_printer(comm, "graph", args.peer_binary)
    rank, size = comm.Get_rank(), comm.Get_size()
    say(
        f"# hpcpar bench graph: SCALE {scales}, edgefactor {args.edgefactor}, {args.roots} keys, "
        f"kernels {kernels}, {size} rank(s); peers "
        f"{'no scipy' if args.no_scipy else 'scipy ' + __import__('scipy').__version__}, "
        f"{args.peer_binary or 'no Graph500 reference (--peer-binary PATH)'}"
    )
    say(
        f"# {'SCALE':>5s} {'variant':16s} {'kernel':6s} {'hmean TEPS':>11s} {'median':>10s} "
        f"{'spread%':>7s} {'vs scipy':>8s} {'vs ref':>7s} {'vs GAP':>6s} {'edges max/mean':>14s} "
        f"{'volume max/mean':>15s} {'inter MB':>9s}"
    )
    rows: list[Row] = []
    for scale in scales:
        edges = kronecker(scale, args.edgefactor, 1, rank, size)
        docs, keys, nedge = [], None, None
        for partition in partitions:
            result = run(
                comm,
                kinds=tuple(kernels),
                scale=scale,
                edgefactor=args.edgefactor,
                edges=edges,
                partition=partition,
                roots=args.roots,
                validate_results=args.validate,
                layout=args.layout,
            )
            keys, nedge = result.roots, result.nedge
            imb = _imbalance(result.imbalance)
            for kernel in kernels:
                docs.append(
                    {
                        "variant": f"hpcpar-{partition}",
                        "kernel": kernel,
                        "teps": _teps(result.times[kernel], nedge),
                        "construction_s": result.construction,
                        **imb,
                    }
                )
        peak = _peak_memory(comm)  # hpcpar's alone: before scipy's copy of the graph
        whole = None if args.no_scipy else comm.gather(edges, root=0)
        peers = _peers(args, whole, edges, keys, nedge, kernels, size, scale) if rank == 0 else None
        del whole
        idle_barrier(comm)
        docs += comm.bcast(peers, root=0)
        edges_total = args.edgefactor << scale
        for d in docs:
            if d["variant"].startswith("hpcpar-"):
                d["peak_rss_bytes_all_ranks"] = peak
                d["peak_bytes_per_edge"] = peak / edges_total
        say(
            f"# SCALE {scale}: hpcpar's peak memory {peak / 2**30:.2f} GiB over {size} rank(s), "
            f"{peak / edges_total:.1f} bytes per input edge (its graph: "
            f"{_graph_bytes(comm, docs) / edges_total:.1f})"
        )
        rows += _report(say, scale, size, docs)
    return rows


def _report(say: Any, scale: int, size: int, docs: list[dict]) -> list[Row]:
    rows = []
    by = {(d["variant"], d["kernel"]): d for d in docs}
    fastest_gap: dict[str, dict] = {}  # per kernel, over GAP's runs (one per delta)
    for d in docs:
        if d["variant"].startswith("gap"):
            best = fastest_gap.get(d["kernel"])
            if best is None or d["teps"]["harmonic_mean"] > best["teps"]["harmonic_mean"]:
                fastest_gap[d["kernel"]] = d
    for d in docs:
        kernel, hm = d["kernel"], d["teps"]["harmonic_mean"]
        sci, ref = by.get(("scipy", kernel)), by.get(("graph500-ref", kernel))
        gap = fastest_gap.get(kernel)
        d["vs_scipy"] = hm / sci["teps"]["harmonic_mean"] if sci else None
        d["vs_reference"] = hm / ref["teps"]["harmonic_mean"] if ref else None
        d["vs_gap"] = hm / gap["teps"]["harmonic_mean"] if gap else None
        d.update(scale=scale, ranks=size)
        fmt = lambda x, spec: "-" if x is None else format(x, spec)  # noqa: E731
        say(
            f"  {scale:5d} {d['variant']:16s} {kernel:6s} {hm:11.3e} {d['teps']['median']:10.3e} "
            f"{d['teps']['spread_pct']:7.1f} {fmt(d['vs_scipy'], '8.2f'):>8s} "
            f"{fmt(d['vs_reference'], '7.2f'):>7s} {fmt(d['vs_gap'], '6.2f'):>6s} "
            f"{fmt(d.get('entries_max_over_mean'), '14.3f'):>14s} "
            f"{fmt(d.get('volume_max_over_mean'), '15.3f'):>15s} "
            f"{fmt(d.get('bytes_inter', 0) / 1e6 if 'bytes_inter' in d else None, '9.1f'):>9s}"
        )
        rows.append(Row(d, size_key="scale"))
    return rows


register(
    Benchmark(
        "graph",
        "Graph500 BFS/SSSP TEPS per partition vs scipy.sparse.csgraph and the reference",
        _add_arguments,
        _run,
        peer="scipy",
    )
)
