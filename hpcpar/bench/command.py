"""``hpcpar bench NAME``: run a registered benchmark with the shared options and output."""

from __future__ import annotations

import argparse
from typing import Any

from ..cli.common import add_layout_argument, integer, output_path, real
from ..plugins import Command, benchmarks, register

__all__ = ["add_common_arguments", "bandwidth_plot"]


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every benchmark takes: sizes, repeats, timing and output."""
    parser.add_argument(
        "--min-size", default="8", metavar="SIZE", help="smallest message (default 8 B)"
    )
    parser.add_argument(
        "--max-size", default="64MiB", metavar="SIZE", help="largest message (default 64 MiB)"
    )
    parser.add_argument(
        "--repeats",
        type=integer(1, 1 << 20),
        default=5,
        help="timed repeats per size; the median is reported (default 5)",
    )
    parser.add_argument(
        "--warmup",
        type=integer(0, 1 << 20),
        default=2,
        help="untimed calls before timing (default 2)",
    )
    parser.add_argument(
        "--min-time",
        type=real(0, 3600, above=True),
        default=0.05,
        metavar="S",
        help="seconds one repeat lasts at least; sets the iteration count (default 0.05)",
    )
    parser.add_argument(
        "--max-iterations", type=integer(1), default=10000, help="iterations per repeat at most"
    )
    parser.add_argument(
        "--output",
        type=output_path,
        default=None,
        metavar="PREFIX",
        help="write PREFIX.json and PREFIX.csv",
    )
    add_layout_argument(parser)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="benchmark", metavar="NAME", parser_class=type(parser))
    for bench in benchmarks().values():
        child = sub.add_parser(bench.name, help=bench.help, description=bench.help)
        add_common_arguments(child)
        bench.add_arguments(child)


def _run(comm: Any, args: argparse.Namespace) -> int:
    from ..errors import UsageError
    from ..runtime.results import write_csv, write_json

    if args.benchmark is None:
        names = ", ".join(benchmarks())
        raise UsageError(f"bench: name a benchmark ({names})")
    bench = benchmarks()[args.benchmark]
    measurements = bench.run(comm, args)
    rows = [m.as_dict() for m in measurements]
    if args.output:
        params = {k: v for k, v in vars(args).items() if k != "hpcpar_command"}
        write_json(f"{args.output}.json", rows, comm=comm, layout=args.layout, parameters=params)
        write_csv(f"{args.output}.csv", rows, comm=comm)
        if comm.Get_rank() == 0:
            title = f"hpcpar bench {bench.name}, {comm.Get_size()} rank(s)"
            bandwidth_plot(rows, f"{args.output}.png", title, bench.peer)
    if not all(m.valid for m in measurements):
        if comm.Get_rank() == 0:
            print(
                "# VALIDATION FAILED for:",
                ", ".join(f"{m.variant}@{m.size}" for m in measurements if not m.valid),
                flush=True,
            )
        return 1
    return 0


def bandwidth_plot(rows: list[dict[str, Any]], path: str, title: str, peer: str) -> None:
    """Bus bandwidth against message size, a line per variant, the peer's in black."""
    from ..runtime.plots import pyplot, save

    swept = [r for r in rows if isinstance(r.get("size"), int) and r.get("busbw_gbs") is not None]
    plt = pyplot()
    if plt is None or len({r["size"] for r in swept}) < 2:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for variant in dict.fromkeys(r["variant"] for r in swept):  # in the order measured
        points = sorted((r["size"], r["busbw_gbs"]) for r in swept if r["variant"] == variant)
        mine = variant == peer
        ax.plot(
            *zip(*points, strict=True),
            marker="o" if mine else ".",
            label=variant,
            linewidth=2.5 if mine else 1,
            color="black" if mine else None,
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    save(fig, path)


register(
    Command(
        "bench", "run a benchmark (OSU-style output, validated, vs a peer)", _add_arguments, _run
    )
)
