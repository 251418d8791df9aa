"""Which intercepted calls went where, and why: counted per rank, reported at exit.

Every intercepted call adds one to ``(call, route, reason)``: route ``hpcpar`` (hpcpar's
collectives ran it; the reason names the algorithm that ran a blocking call, ``mpi``
being the library's own call chosen by the cost model; a nonblocking call's algorithm
is in the flight record and ``HPCPAR_TRACE``) or ``library`` (passed to the MPI library
unchanged; the reason names what hpcpar left to it). ``HPCPAR_INTERCEPT_REPORT`` says
what happens at exit: ``-`` prints rank 0's table to standard error, a folder gets
every rank's counts as ``intercept<R>.json``.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from typing import Any

__all__ = ["COUNTS", "FAST_ALLREDUCE", "counts", "note", "table", "write_report"]

COUNTS: Counter[tuple[str, str, str]] = Counter()
FAST_ALLREDUCE = [0]  # Allreduce calls hpcpar's fast path ran (counted apart: cheaper)


def counts() -> Counter[tuple[str, str, str]]:
    """Every intercepted call so far, by ``(call, route, reason)``."""
    merged = Counter(COUNTS)
    if FAST_ALLREDUCE[0]:
        merged[("Allreduce", "hpcpar", "ran mpi (fast path)")] += FAST_ALLREDUCE[0]
    return merged


def note(call: str, route: str, reason: str = "") -> None:
    """Count one intercepted call."""
    COUNTS[(call, route, reason)] += 1


def table(these: Counter[tuple[str, str, str]] | None = None) -> str:
    """The counts (this process's by default) as an aligned text table, busiest first."""
    these = counts() if these is None else these
    lines = [f"{'calls':>8}  {'call':<22} {'route':<8} why"]
    for (call, route, reason), n in sorted(these.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"{n:>8}  {call:<22} {route:<8} {reason}")
    return "\n".join(lines)


def as_json(rank: int, size: int) -> dict[str, Any]:
    """This rank's counts as a JSON-ready dict."""
    return {
        "rank": rank,
        "size": size,
        "calls": [
            {"call": call, "route": route, "reason": reason, "count": n}
            for (call, route, reason), n in sorted(counts().items())
        ],
    }


def write_report(where: str, rank: int, size: int) -> None:
    """Report this rank's counts as ``HPCPAR_INTERCEPT_REPORT`` asks."""
    if where == "-":
        if rank == 0:
            sys.stderr.write(f"hpcpar intercept: rank 0 of {size}\n{table()}\n")
            sys.stderr.flush()
        return
    os.makedirs(where, exist_ok=True)
    path = os.path.join(where, f"intercept{rank}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(as_json(rank, size), f, indent=1)
    os.replace(path + ".tmp", path)
