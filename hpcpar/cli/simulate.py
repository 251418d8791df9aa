"""``hpcpar simulate``: predict every algorithm from 8 B to 1 GiB at up to 65,536 ranks."""

from __future__ import annotations

import argparse
from typing import Any

from ..collectives.names import COLLECTIVES
from ..plugins import Command, register
from ..runtime.plots import MISSING, pyplot, save
from .common import integer, output_path
from .explain import add_machine_arguments, machine_profile

__all__: list[str] = []

MAX_RANKS = 65536


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nodes", type=integer(1, 1 << 20), required=True, help="nodes of the machine"
    )
    parser.add_argument("--ppn", type=integer(1, 1 << 16), required=True, help="ranks per node")
    parser.add_argument(
        "--collective",
        default="allreduce",
        choices=[c for c in COLLECTIVES if c not in ("alltoallv", "barrier")],
    )
    parser.add_argument("--min-size", default="8", metavar="SIZE")
    parser.add_argument("--max-size", default="1GiB", metavar="SIZE")
    parser.add_argument(
        "--output",
        type=output_path,
        default=None,
        metavar="PREFIX",
        help="write PREFIX.csv and PREFIX.png",
    )
    add_machine_arguments(parser)


def _grid(rows: list[Any], node_counts: list[int], sizes: list[int], collective: str) -> str:
    from ..collectives.cost.simulate import labels
    from ..runtime.units import format_size

    short = labels(collective)
    win = {(r.nodes, r.nbytes): r.algorithm for r in rows if r.winner}
    head = f"{'size':>8} | " + " ".join(f"{n:>6}" for n in node_counts)
    lines = ["winner by size (rows) and nodes (columns):", head, "-" * len(head)]
    for nbytes in sizes:
        cells = " ".join(f"{short.get(win[(n, nbytes)], '?'):>6}" for n in node_counts)
        lines.append(f"{format_size(nbytes):>8} | {cells}")
    legend = ", ".join(f"{v}={k}" for k, v in short.items() if k in {r.algorithm for r in rows})
    lines.append(f"({legend})")
    return "\n".join(lines)


def _plot(rows: list[Any], node_counts: list[int], sizes: list[int], path: str, title: str) -> str:

    plt = pyplot()
    if plt is None:
        return MISSING
    import numpy as np

    from ..runtime.units import format_size

    names = sorted({r.algorithm for r in rows})
    win = {(r.nodes, r.nbytes): names.index(r.algorithm) for r in rows if r.winner}
    grid = np.array([[win[(n, s)] for n in node_counts] for s in sizes])
    fig, ax = plt.subplots(figsize=(1.2 + 0.6 * len(node_counts), 1.5 + 0.3 * len(sizes)))
    cmap = plt.get_cmap("tab10", len(names))
    ax.imshow(grid, cmap=cmap, vmin=-0.5, vmax=len(names) - 0.5, aspect="auto", origin="lower")
    ax.set_xticks(range(len(node_counts)), [str(n) for n in node_counts], rotation=45)
    ax.set_yticks(range(len(sizes)), [format_size(s) for s in sizes])
    ax.set_xlabel("nodes")
    ax.set_ylabel("message size")
    ax.set_title(title, fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=cmap(i)) for i in range(len(names))]
    ax.legend(handles, names, bbox_to_anchor=(1.02, 1), loc="upper left", fontsize=8)
    save(fig, path, dpi=120)
    return f"map written to {path}"


def _run(comm: Any, args: argparse.Namespace) -> int:
    from ..collectives.cost.simulate import simulate
    from ..errors import UsageError
    from ..runtime.results import write_csv
    from ..runtime.units import format_size, parse_size

    if args.nodes < 1 or args.ppn < 1 or args.nodes * args.ppn > MAX_RANKS:
        raise UsageError(
            f"simulate: need 1 <= nodes * ppn <= {MAX_RANKS} (got {args.nodes} x {args.ppn})"
        )
    profile = machine_profile(args)
    lo, hi = parse_size(args.min_size), parse_size(args.max_size)
    if lo < 1 or hi < lo:
        raise UsageError(f"simulate: need 1 <= --min-size <= --max-size (got {lo} and {hi})")
    sizes, size = [], lo
    while size <= hi:
        sizes.append(size)
        size *= 2
    node_counts, n = [], 1
    while n < args.nodes:
        node_counts.append(n)
        n *= 2
    node_counts.append(args.nodes)
    if comm.Get_rank() != 0:
        return 0
    rows = simulate(args.collective, node_counts, args.ppn, sizes, profile)
    print(
        f"# hpcpar simulate {args.collective}: up to {args.nodes} nodes x {args.ppn} ranks, "
        f"profile: {profile.name}; times in us (the MPI library's own call is not simulated)"
    )
    names = [r.algorithm for r in rows if r.nodes == args.nodes and r.nbytes == sizes[0]]
    print(f"{'size':>8} " + " ".join(f"{a[:12]:>13}" for a in names) + "  winner")
    for nbytes in sizes:
        mine = [r for r in rows if r.nodes == args.nodes and r.nbytes == nbytes]
        best = next(r.algorithm for r in mine if r.winner)
        print(
            f"{format_size(nbytes):>8} "
            + " ".join(f"{r.seconds * 1e6:>13.1f}" for r in mine)
            + f"  {best}"
        )
    print()
    print(_grid(rows, node_counts, sizes, args.collective))
    if args.output:
        write_csv(f"{args.output}.csv", [r.__dict__ for r in rows], comm=comm)
        title = f"{args.collective} winner, {args.ppn} ranks/node, {profile.name}"
        print(_plot(rows, node_counts, sizes, f"{args.output}.png", title))
    return 0


register(
    Command(
        "simulate",
        "predict every algorithm's time on a machine of N nodes x K ranks",
        _add_arguments,
        _run,
    )
)
