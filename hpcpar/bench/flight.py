"""``hpcpar bench flight`` and ``hpcpar bench guard``: what the always-on safety costs.

The same loop of small collectives runs with the feature on and off, in alternating
blocks so that drift in the machine's speed falls on both alike: the flight record
(``hpcpar.runtime.flight.set_enabled``) or the mismatch guard
(``hpcpar.collectives.guard.set_enabled``). The calls: an 8-byte ``allreduce`` (the
fast path: a run of identical calls is one flight entry), a ``bcast`` (the general
path), an ``iallreduce`` waited on at once, and a ``ring`` allreduce (hpcpar's own
schedule). ``vs_peer`` is the median over repeats of each block's time with the
feature over the next block's without it; the spread is their interquartile range
over the median.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from ..plugins import Benchmark, register
from ..runtime.switches import HOT
from .harness import Measurement

__all__: list[str] = []


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser  # the shared options only: --repeats, --min-time, --warmup, --output


def _cases(comm: Any) -> list[tuple[str, Callable[[], Any], Callable[[], bool]]]:
    import numpy as np

    import hpcpar

    size = comm.Get_size()
    x = np.ones(1)
    box: list[Any] = [None]

    def allreduce() -> None:
        box[0] = hpcpar.allreduce(x, comm=comm)

    def bcast() -> None:
        box[0] = hpcpar.bcast(x, root=0, comm=comm)

    def iallreduce() -> None:
        box[0] = hpcpar.iallreduce(x, comm=comm).wait()

    def ring() -> None:
        box[0] = hpcpar.allreduce(x, comm=comm, algorithm="ring")

    def summed() -> bool:
        return box[0] is not None and float(box[0][0]) == size

    def broadcast() -> bool:
        return box[0] is not None and float(box[0][0]) == 1.0

    return [
        ("allreduce", allreduce, summed),
        ("bcast", bcast, broadcast),
        ("iallreduce", iallreduce, summed),
        ("allreduce-ring", ring, summed),
    ]


def _block(comm: Any, op: Callable[[], Any], n: int) -> float:
    """Seconds per call of ``n`` calls, averaged over ranks (OSU style)."""
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(n):
        op()
    mine = (time.perf_counter() - start) / n
    return float(comm.allreduce(mine)) / comm.Get_size()


def _iterations(comm: Any, op: Callable[[], Any], args: argparse.Namespace) -> int:
    n = 1
    while n < args.max_iterations:
        if _block(comm, op, n) * n >= args.min_time / 4:
            break
        n *= 2
    per_call = _block(comm, op, n)
    wanted = int(args.min_time / max(per_call, 1e-9))
    return int(comm.bcast(max(1, min(args.max_iterations, wanted)), root=0))


def _features() -> dict[str, tuple[str, Callable[[], bool], Callable[[bool], None]]]:
    from ..collectives import guard
    from ..runtime import flight

    return {
        "flight": ("the flight record", flight.enabled, flight.set_enabled),
        "guard": ("the mismatch guard", lambda: HOT.guard, guard.set_enabled),
    }


def _run_feature(feature: str, comm: Any, args: argparse.Namespace) -> list[Measurement]:
    title, enabled, set_enabled = _features()[feature]
    was = enabled()
    out: list[Measurement] = []
    rank = comm.Get_rank()
    if rank == 0:
        print(
            f"# hpcpar bench {feature}: {comm.Get_size()} rank(s); 8-byte calls with {title} "
            f"on and off in alternating blocks; {args.repeats} repeats, median",
            flush=True,
        )
        print(f"# {'call':>16} {'on (us)':>10} {'off (us)':>10} {'on/off':>8} {'spread%':>8}")
    try:
        for name, op, valid in _cases(comm):
            for _ in range(args.warmup):
                op()
            n = _iterations(comm, op, args)
            on: list[float] = []
            off: list[float] = []
            for repeat in range(args.repeats):
                order = (True, False) if repeat % 2 == 0 else (False, True)
                for state in order:
                    set_enabled(state)
                    (on if state else off).append(_block(comm, op, n))
            set_enabled(True)
            ok = comm.allreduce(int(not valid())) == 0
            ratios = [a / b for a, b in zip(on, off, strict=True)]
            ratio = statistics.median(ratios)
            q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratio, ratio, ratio]
            spread = 100.0 * (q[2] - q[0]) / ratio
            for variant, times, vs in ((name, on, ratio), (f"{name}-off", off, 1.0)):
                us = [t * 1e6 for t in times]
                out.append(
                    Measurement(
                        size=8,
                        variant=variant,
                        avg_us=statistics.median(us),
                        min_us=min(us),
                        max_us=max(us),
                        iterations=n,
                        repeats=args.repeats,
                        spread_pct=spread,
                        algbw_gbs=None,
                        busbw_gbs=None,
                        vs_peer=vs,
                        valid=ok,
                    )
                )
            if rank == 0:
                print(
                    f"  {name:>16} {statistics.median(on) * 1e6:10.2f} "
                    f"{statistics.median(off) * 1e6:10.2f} {ratio:8.3f} {spread:8.1f}",
                    flush=True,
                )
    finally:
        set_enabled(was)
    return out


def _run(comm: Any, args: argparse.Namespace) -> list[Measurement]:
    return _run_feature("flight", comm, args)


def _run_guard(comm: Any, args: argparse.Namespace) -> list[Measurement]:
    return _run_feature("guard", comm, args)


register(
    Benchmark(
        "flight",
        "the flight record's cost: 8-byte collectives with the record on vs off",
        _add_arguments,
        _run,
        peer="off",
    )
)
register(
    Benchmark(
        "guard",
        "the mismatch guard's cost: 8-byte collectives with the guard on vs off",
        _add_arguments,
        _run_guard,
        peer="off",
    )
)
