"""``hpcpar graph bfs|sssp|all|generate``: the Graph500 benchmark and its edge lists."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hpcpar.cli.common import add_layout_argument, integer, output_path, real
from hpcpar.plugins import Command, register
from hpcpar.runtime.plots import pyplot, save

__all__: list[str] = []

_EPILOG = """\
actions:
  bfs        Graph500 kernel 2: BFS from --roots search keys, printed as the
             specification's output block (harmonic-mean TEPS)
  sssp       Graph500 kernel 3: single-source shortest paths (delta-stepping)
  all        both kernels from the same keys, like the reference implementation
  generate   write the Kronecker edge list to --out FILE.h5 (read back with --input)

The graph is the specification's Kronecker graph (--scale, --edgefactor, --seed), or an
edge list from --input: text lines "u v [w]", an (m, 2|3) .npy array, or an .h5 file
from 'generate'. Partitions: 1d-vertex (equal vertex ranges), 1d-edge (ranges cut by
degree), 2d (R x C process grid, --grid), hier (node-first ranges, exchanges routed
through node leaders). Exit status 2 on bad input or a result that fails validation.
"""


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    from .names import PARTITIONS

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _EPILOG
    parser.add_argument("action", choices=("bfs", "sssp", "all", "generate"))
    parser.add_argument(
        "--scale", type=integer(1, 40), default=16, help="log2 of the vertex count (16)"
    )
    parser.add_argument(
        "--edgefactor", type=integer(1, 1 << 16), default=16, help="edges per vertex (16)"
    )
    parser.add_argument("--seed", type=integer(0), default=1, help="generator and key seed (1)")
    parser.add_argument("--input", metavar="FILE", help="read the edge list from FILE")
    parser.add_argument(
        "--vertices", type=integer(1, 1 << 40), metavar="N", help="--input: vertex count"
    )
    parser.add_argument("--partition", choices=PARTITIONS, default="1d-vertex")
    parser.add_argument("--grid", metavar="RxC", help="2d: process grid (default: squarest)")
    parser.add_argument("--roots", type=integer(1, 1 << 20), default=64, help="search keys (64)")
    parser.add_argument("--root", type=integer(0), help="search from this vertex only")
    parser.add_argument(
        "--validate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the validator after every search (default: on)",
    )
    parser.add_argument(
        "--delta",
        type=real(0, above=True, infinite=True),
        help="SSSP bucket width (1 / mean degree; inf: Bellman-Ford)",
    )
    parser.add_argument(
        "--direction",
        choices=("auto", "top-down", "bottom-up"),
        default="auto",
        help="BFS direction (auto: Beamer's switch)",
    )
    parser.add_argument(
        "--relax",
        choices=("auto", "push", "pull"),
        default="auto",
        help="SSSP heavy edges of a settled bucket (auto: whichever scans "
        "fewer edges; pull needs a 1 x P grid)",
    )
    parser.add_argument(
        "--alpha", type=real(0, above=True), default=14.0, help="top-down -> bottom-up"
    )
    parser.add_argument(
        "--beta", type=real(0, above=True), default=24.0, help="bottom-up -> top-down"
    )
    parser.add_argument(
        "--out", type=output_path, metavar="FILE", help="JSON results (generate: the .h5 file)"
    )
    add_layout_argument(parser)


def _run(comm: Any, args: argparse.Namespace) -> int:
    from .driver import output_block, run
    from .kronecker import GraphError, kronecker

    if args.roots < 1:
        raise GraphError(f"--roots must be at least 1, not {args.roots}")
    if args.action == "generate":
        from .edgefile import write_h5

        if not args.out:
            raise GraphError("generate needs --out FILE.h5")
        edges = kronecker(args.scale, args.edgefactor, args.seed, comm.Get_rank(), comm.Get_size())
        write_h5(
            args.out,
            edges,
            comm,
            {"scale": args.scale, "edgefactor": args.edgefactor, "seed": args.seed},
        )
        if comm.Get_rank() == 0:
            print(f"wrote {edges.n_edges:,} edges on {edges.n_vertices:,} vertices to {args.out}")
        return 0
    edges = None
    scale = args.scale
    if args.input:
        from .edgefile import read_edges

        edges = read_edges(args.input, comm, args.vertices)
        scale = None
    kinds = ("bfs", "sssp") if args.action == "all" else (args.action,)
    result = run(
        comm,
        kinds=kinds,
        scale=scale,
        edgefactor=args.edgefactor,
        seed=args.seed,
        edges=edges,
        partition=args.partition,
        grid=args.grid,
        roots=args.roots,
        root=args.root,
        validate_results=args.validate,
        delta=args.delta,
        direction=args.direction,
        alpha=args.alpha,
        beta=args.beta,
        relax=args.relax,
        layout=args.layout,
    )
    if comm.Get_rank() == 0:
        print(output_block(result))
        table = result.imbalance
        print(f"# per rank ({args.partition}; bytes exchanged during the searches):")
        print(
            f"# {'rank':>4s} {'vertices':>10s} {'entries':>11s} {'bytes intra':>12s} "
            f"{'bytes inter':>12s}"
        )
        names = ("vertices", "entries", "bytes_intra", "bytes_inter")
        for r, row in enumerate(zip(*(table[k] for k in names), strict=True)):
            print(f"  {r:4d} {row[0]:10d} {row[1]:11d} {row[2]:12d} {row[3]:12d}")
        sys.stdout.flush()
    if args.out:
        from dataclasses import asdict

        from hpcpar.runtime.results import write_json

        doc = asdict(result)
        for kind in result.times:
            doc[f"{kind}_harmonic_mean_teps"] = result.harmonic_teps(kind)
        write_json(args.out, doc, comm=comm, layout=args.layout, parameters=vars(args))
        if comm.Get_rank() == 0:
            _plot(result, f"{Path(args.out).with_suffix('')}.png", args.partition)
    return 0


def _plot(result: Any, path: str, partition: str) -> None:
    """TEPS of every search key, with the harmonic mean, per kernel."""
    plt = pyplot()
    if plt is None or not result.times:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for kind, times in result.times.items():
        teps = [n / t for n, t in zip(result.nedge, times, strict=True)]
        line = ax.plot(range(len(teps)), teps, marker="o", linestyle="", label=kind)[0]
        ax.axhline(
            result.harmonic_teps(kind),
            color=line.get_color(),
            linestyle=":",
            label=f"{kind} harmonic mean",
        )
    ax.set_yscale("log")
    ax.set_xlabel("search key")
    ax.set_ylabel("TEPS")
    graph = f"SCALE {result.scale}" if result.scale is not None else "edge file"
    ax.set_title(f"{graph}, {result.ranks} rank(s), {partition} partition")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    save(fig, path)


register(
    Command(
        "graph",
        "Graph500 BFS and SSSP on Kronecker graphs or edge files, validated, in TEPS",
        _add_arguments,
        _run,
    )
)
