"""``hpcpar demo``: the main job: topology, collectives checked against numpy, the apps' tour."""

from __future__ import annotations

import argparse
from typing import Any

from ..plugins import Command, register
from .common import add_layout_argument, integer, output_folder, output_path

__all__: list[str] = []


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    add_layout_argument(parser)
    parser.add_argument(
        "--count",
        type=integer(1, 1 << 30),
        default=1 << 20,
        metavar="N",
        help="elements per rank (default 1048576)",
    )
    parser.add_argument(
        "--output",
        type=output_path,
        default=None,
        metavar="FILE",
        help="also write results as JSON",
    )
    parser.add_argument(
        "--tour",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after the checks, tour the apps: explain, SGD killed and resumed, CFR, "
        "Graph500, SAT (default: on)",
    )
    parser.add_argument(
        "--results",
        type=output_folder,
        default="demo-results",
        metavar="DIR",
        help="where the tour writes its results files and plots (default demo-results)",
    )


def _run(comm: Any, args: argparse.Namespace) -> int:
    import numpy as np
    from mpi4py import MPI

    from ..collectives import algorithms_for, allreduce, last_stats
    from ..errors import UsageError
    from ..runtime.results import write_json
    from ..testing import failing_ranks
    from ..topology import Hierarchy

    if args.count < 1:
        raise UsageError(f"demo: --count must be at least 1, not {args.count}")
    rank, size = comm.Get_rank(), comm.Get_size()
    say = print if rank == 0 else (lambda *a, **k: None)
    checks: list[dict[str, Any]] = []

    def check(name: str, got: np.ndarray, want: np.ndarray) -> None:
        bad = failing_ranks(np.array_equal(got, want), comm)
        checks.append({"check": name, "ok": not bad, "failed_ranks": bad})
        say(f"  {'ok    ' if not bad else 'FAILED'}  {name}" + (f" (ranks {bad})" if bad else ""))

    with Hierarchy(comm, layout=args.layout) as h:
        say(h.describe())
        say(f"\nchecks against numpy ({args.count} float64 elements per rank):")
        # Integer-valued data keeps every sum exact, so equality is the right test.
        base = np.arange(args.count, dtype=np.float64) % 1021
        x = base * (rank + 1)
        want = base * (size * (size + 1) // 2)
        out = np.empty_like(x)
        comm.Allreduce(x, out, op=MPI.SUM)
        check("allreduce SUM, the MPI library's own call", out, want)
        for algorithm in algorithms_for("allreduce"):
            got = allreduce(x, comm=h, algorithm=algorithm)
            stats = last_stats()
            sent = f"{stats.messages_intra} intra + {stats.messages_inter} inter-node messages"
            where = "inside MPI" if stats.inside_mpi else sent
            check(f"hpcpar.allreduce algorithm={algorithm:<18} ({where} on rank {rank})", got, want)
        noisy = np.random.default_rng(rank).standard_normal(args.count) * 10.0 ** (rank % 7)
        names = algorithms_for("allreduce")
        first = allreduce(noisy, comm=h, algorithm=names[-1], reproducible=True)
        for algorithm in names[:-1]:
            again = allreduce(noisy, comm=h, algorithm=algorithm, reproducible=True)
            check(f"reproducible=True: {algorithm} gives the bits of {names[-1]}", again, first)
        layout = h.layout
        steps = []
        if args.tour:
            from pathlib import Path

            from .tour import tour

            say(f"\ntour of the apps ({size} rank(s), results in {args.results}):", flush=True)
            steps = tour(comm, h, Path(args.results), say)
            checks += [{"check": s.name, "ok": s.ok, "figure": s.figure} for s in steps]
    ok = all(c["ok"] for c in checks)
    say(
        f"\ndemo {'passed' if ok else 'FAILED'}: {len(checks)} checks on {size} rank(s)", flush=True
    )
    if args.output:
        write_json(
            args.output,
            {"checks": checks, "passed": ok},
            comm=comm,
            layout=layout,
            parameters=vars(args),
        )
    return 0 if ok else 1


register(
    Command(
        "demo",
        "the main job: topology, collectives checked against numpy, a tour of the apps",
        _add_arguments,
        _run,
    )
)
