"""``hpcpar trace DIR``: the ranks' flight records side by side (``HPCPAR_TRACE=DIR``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..plugins import Command, register
from .common import integer, output_path, real

__all__: list[str] = []


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Read the flight records a job wrote with HPCPAR_TRACE=DIR: print each rank's last "
        "calls, the first collective where the ranks disagree, and ranks that arrive late "
        "again and again; --chrome writes a timeline for Perfetto or chrome://tracing."
    )
    parser.add_argument("folder", metavar="DIR", help="the folder HPCPAR_TRACE named")
    parser.add_argument(
        "--last", type=integer(0, 1 << 20), default=10, help="calls shown per rank (default 10)"
    )
    parser.add_argument(
        "--window",
        type=integer(1, 1 << 20),
        default=50,
        help="collectives the slow-rank check looks at, the latest (default 50)",
    )
    parser.add_argument(
        "--min-lag",
        type=real(0, 3600),
        default=1e-3,
        metavar="S",
        help="a rank is slow from this median lag, in seconds (default 0.001)",
    )
    parser.add_argument(
        "--chrome",
        type=output_path,
        default=None,
        metavar="FILE",
        help="write the timeline as Chrome trace events (JSON) to FILE",
    )


def _run(_comm: Any, args: argparse.Namespace) -> int:
    from ..runtime import trace

    ranks = trace.load(args.folder)
    offsets = trace.clock_offsets(ranks)
    origin = min(
        (e["start"] - offsets[r] for r, es in ranks.items() for e in es if e["start"] is not None),
        default=0.0,
    )
    print(
        f"# hpcpar trace {args.folder}: {len(ranks)} rank(s); times in seconds from the "
        f"first call, clocks aligned on rank {min(ranks)}'s"
    )
    start = trace.start_of(args.folder)
    if start["restart"]:
        failed = start["restart_failed"] or "?"
        print(f"restart {start['restart']} of the job, after rank(s) {failed} failed")
    if start["resumed_from"]:
        where = start["resumed_from"]
        print(f"resumed from step {where['step']} ({', '.join(where['levels'])})")
    if start["restarts"]:
        print(f"started again: {', '.join(start['restarts'])} (hpcpar launch --restarts)")
    for rank, entries in ranks.items():
        print(f"rank {rank}: {len(entries)} entries (clock {offsets[rank] * 1e3:+.3f} ms)")
        for e in entries[len(entries) - args.last :] if args.last else []:
            when = "" if e["start"] is None else f"{e['start'] - offsets[rank] - origin:10.6f}"
            took = (
                ""
                if e["end"] is None or e["start"] is None
                else (f"{(e['end'] - e['start']) * 1e3:9.3f} ms")
            )
            calls = f" x{e['calls']}" if e["calls"] > 1 else ""
            print(
                f"  {when:>10} {e['comm']:>10} #{e['seq']:<6} {trace.describe(e)}{calls}"
                f" {took}  {e['site']}"
            )
    divergence = trace.first_divergence(ranks)
    print(
        f"first divergence: {divergence}"
        if divergence
        else "first divergence: none (every rank called the same collectives)"
    )
    slow, lags = trace.slow_ranks(ranks, window=args.window, min_lag=args.min_lag)
    shown = ", ".join(f"rank {r} {lag * 1e3:.3f} ms" for r, lag in lags.items())
    print(f"arrival lag (median over the last {args.window} collectives): {shown}")
    for s in slow:
        print(
            f"slow rank: rank {s['rank']} arrives {s['lag'] * 1e3:.3f} ms after the first "
            f"(median of {s['calls']} collectives; most often late at {s['operation']})"
        )
    if not slow:
        print("slow rank: none")
    if args.chrome:
        with open(args.chrome, "w") as f:
            json.dump(trace.chrome_trace(ranks), f)
        print(f"timeline written to {args.chrome} (open it in https://ui.perfetto.dev)")
    return 0


register(
    Command(
        "trace",
        "show the flight records a job wrote with HPCPAR_TRACE=DIR",
        _add_arguments,
        _run,
        needs_mpi=False,
    )
)
