"""``HPCPAR_TRACE=DIR``: each rank's flight record written to a file, and read back.

With ``HPCPAR_TRACE`` set, the flight record keeps every call as its own entry (the
allreduce fast path steps aside so that each call's start and end are taken) and up to
65,536 of them; each rank writes ``DIR/rank<R>.json`` when its interpreter exits
normally, when an uncaught exception aborts the job, and when the watchdog ends it.
``hpcpar trace DIR`` (``hpcpar.cli.trace``) reads the files back: JSON only, every
field checked, nothing executed. The analyses here work on the loaded records:

- ``clock_offsets``: the ranks' clocks against rank 0's, from the moments they leave
  the same collective (an allreduce or barrier ends on every rank at about one time);
- ``first_divergence``: the first sequence number on a communicator where ranks called
  different things, or where some ranks never arrived;
- ``slow_ranks``: ranks that arrive late at the same collective again and again (the
  C4 idea: collectives are periodic and homogeneous, so a lagging rank stands out);
- ``chrome_trace``: the Chrome trace-event format that Perfetto and chrome://tracing open.
"""

from __future__ import annotations

import atexit
import bisect
import contextlib
import json
import math
import os
import socket
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import HpcparError
from . import flight, resume, settings
from .exits import ENV as EXIT_ENV

__all__ = [
    "ENV",
    "FORMAT",
    "TraceError",
    "start_of",
    "arm",
    "dump",
    "load",
    "clock_offsets",
    "first_divergence",
    "slow_ranks",
    "chrome_trace",
    "COLLECTIVE_CHANNELS",
]

ENV = "HPCPAR_TRACE"
FORMAT = "hpcpar-trace"
VERSION = 1
COLLECTIVE_CHANNELS = ("p2p", "halo", "checkpoint")  # channels whose numbers are per rank
_SYNCHRONISING = (
    "allreduce",
    "barrier",
    "allgather",
    "alltoall",
    "alltoallv",
    "reduce_scatter",
)  # every rank leaves these together
_armed: dict[str, Any] = {}


class TraceError(HpcparError):
    """A trace folder or file that cannot be read as one."""


def arm(rank: int, size: int) -> None:
    """Write this rank's record at exit if ``HPCPAR_TRACE`` names a folder (once).

    A job that ``hpcpar launch --restarts`` started again writes to ``restart<K>`` in
    that folder, so the failed start's records stay as they were.
    """
    folder = settings.value(ENV) or ""
    if not folder or _armed:
        return
    restart = settings.value("HPCPAR_RESTART") or 0
    if restart:
        folder = os.path.join(folder, f"restart{restart}")
    _armed.update(folder=folder, rank=rank, size=size, restart=restart)
    atexit.register(dump)


def start_of(folder: str | Path) -> dict[str, Any]:
    """Which start of a job wrote ``folder``'s records, and what restarted it.

    ``restart`` (0: the first start), ``restart_failed`` (the ranks whose failure ended
    the start before), ``resumed_from`` (the checkpoint restored), and ``restarts``: the
    folders of the later starts, if any. From the lowest rank's file.
    """
    where = Path(folder)
    first = sorted(where.glob("rank*.json"), key=lambda p: int(p.stem[4:] or 0))[:1]
    doc: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError, UnicodeDecodeError):
        doc = json.loads(first[0].read_text()) if first else {}
    later = sorted(where.glob("restart[0-9]*"), key=lambda p: int(p.name[7:]))
    return {
        "restart": doc.get("restart", 0),
        "restart_failed": doc.get("restart_failed"),
        "resumed_from": doc.get("resumed_from"),
        "restarts": [str(p) for p in later if p.is_dir()],
    }


def job_identity() -> str:
    """What tells this job's ranks from another job's: the same on every rank of one job.

    The folder ``hpcpar launch`` gives the job for its exit records, else Slurm's job and
    step, else "" (a job started by another launcher: its files still record its size).
    """
    if os.environ.get(EXIT_ENV):
        return os.environ[EXIT_ENV]
    if os.environ.get("SLURM_JOB_ID"):
        return f"slurm {os.environ['SLURM_JOB_ID']}.{os.environ.get('SLURM_STEP_ID', '')}"
    return ""


def dump(final: bool = False) -> Path | None:
    """Write this rank's flight record now (atomically); its path, or None if not armed.

    ``final``: the rank is about to be ended; nothing is written after this one.
    """
    if not _armed or _armed.get("final"):
        return None
    if final:
        _armed["final"] = True
    folder = Path(_armed["folder"])
    record = {
        "format": FORMAT,
        "version": VERSION,
        "rank": _armed["rank"],
        "size": _armed["size"],
        "job": job_identity(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        **resume.this_start(),
        "entries": flight.snapshot(),
    }
    path = folder / f"rank{_armed['rank']}.json"
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".tmp{os.getpid()}")
        partial.write_text(json.dumps(record, default=str))
        os.replace(partial, path)
        return path
    return None


# ---- reading ------------------------------------------------------------------------

_FIELDS: dict[str, tuple[type, ...]] = {
    "comm": (str,),
    "seq": (int,),
    "operation": (str,),
    "algorithm": (str,),
    "count": (int, type(None), list, str),
    "dtype": (str, type(None)),
    "op": (str, type(None)),
    "root": (int, type(None), list, str),
    "site": (str,),
    "start": (float, int, type(None)),
    "end": (float, int, type(None)),
    "calls": (int,),
}


def load(folder: str | Path) -> dict[int, list[dict[str, Any]]]:
    """Every rank's entries from ``folder`` (``rank<R>.json`` files), by rank.

    Raises:
        TraceError: no such folder, no rank files, a file that is not a trace or has a
            field of the wrong kind (named, with the file), or files of different jobs
            (another size or job identity: one job's records per folder).
    """
    where = Path(folder)
    if not where.is_dir():
        raise TraceError(f"{folder}: no such folder")
    files = sorted(where.glob("rank*.json"))
    if not files:
        raise TraceError(f"{folder}: no rank*.json trace files (run the job with {ENV}={folder})")
    out: dict[int, list[dict[str, Any]]] = {}
    jobs: dict[tuple[Any, Any], list[int]] = {}
    for path in files:
        rank, entries, job = _read(path)
        if rank in out:
            raise TraceError(f"{path}: a second file for rank {rank}")
        out[rank] = entries
        jobs.setdefault(job, []).append(rank)
    if len(jobs) > 1:
        parts = "; ".join(
            f"rank(s) {_ranks(ranks)} of a job of {size} rank(s)" + (f" ({job})" if job else "")
            for (size, job), ranks in jobs.items()
        )
        raise TraceError(
            f"{folder}: records of different jobs ({parts}); give each job a folder of its own"
        )
    return dict(sorted(out.items()))


def _read(path: Path) -> tuple[int, list[dict[str, Any]], tuple[Any, Any]]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: not a trace file ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise TraceError(f"{path}: not an hpcpar trace file")
    if doc.get("version") != VERSION:
        raise TraceError(f"{path}: trace version {doc.get('version')!r}, expected {VERSION}")
    rank, entries, host = doc.get("rank"), doc.get("entries"), doc.get("host")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        raise TraceError(f"{path}: bad rank {rank!r}")
    if not isinstance(entries, list):
        raise TraceError(f"{path}: 'entries' is not a list")
    if not isinstance(host, str):
        raise TraceError(f"{path}: bad host {host!r}")
    for i, entry in enumerate(entries):
        _check_entry(path, i, entry)
        entry["host"] = host
    return rank, entries, (doc.get("size"), doc.get("job", ""))


def _check_entry(path: Path, i: int, entry: Any) -> None:
    if not isinstance(entry, dict):
        raise TraceError(f"{path}: entry {i} is not an object")
    for name, kinds in _FIELDS.items():
        value = entry.get(name)
        if not isinstance(value, kinds) or isinstance(value, bool):
            raise TraceError(f"{path}: entry {i}: bad {name!r} {value!r}")
    for name in ("start", "end"):
        if entry[name] is not None and not math.isfinite(entry[name]):
            raise TraceError(f"{path}: entry {i}: bad {name!r} {entry[name]!r}")
    if entry["calls"] < 1 or entry["seq"] < 0:
        raise TraceError(f"{path}: entry {i}: bad seq or calls")


# ---- analyses -----------------------------------------------------------------------


def _collective(entry: dict[str, Any]) -> bool:
    return entry["comm"] not in COLLECTIVE_CHANNELS


def _by_call(trace: dict[int, list[dict[str, Any]]]) -> dict[tuple[str, int], dict[int, Any]]:
    """Each collective call (communicator, sequence number) and every rank's entry for it."""
    calls: dict[tuple[str, int], dict[int, Any]] = {}
    for rank, entries in trace.items():
        for entry in entries:
            if _collective(entry) and entry["calls"] == 1:
                calls.setdefault((entry["comm"], entry["seq"]), {})[rank] = entry
    return calls


def clock_offsets(trace: dict[int, list[dict[str, Any]]]) -> dict[int, float]:
    """Each rank's clock minus the first rank's, in seconds (0 where nothing tells).

    Ranks on the first rank's host share its clock. For the others: the median, over
    the synchronising collectives both recorded, of the difference of their end times
    (such a collective ends on every rank at about one moment).
    """
    calls = _by_call(trace)
    first = min(trace) if trace else 0
    home = _host(trace.get(first, []))
    offsets = {}
    for rank, entries in trace.items():
        if _host(entries) == home:
            offsets[rank] = 0.0
            continue
        gaps = [
            ranks[rank]["end"] - ranks[first]["end"]
            for ranks in calls.values()
            if rank in ranks
            and first in ranks
            and ranks[rank]["operation"] in _SYNCHRONISING
            and ranks[rank]["end"] is not None
            and ranks[first]["end"] is not None
        ]
        offsets[rank] = statistics.median(gaps) if gaps else 0.0
    return offsets


def _host(entries: list[dict[str, Any]]) -> str | None:
    return entries[0].get("host") if entries else None


def _signature(entry: dict[str, Any]) -> tuple[Any, ...]:
    return (
        entry["operation"],
        entry["algorithm"],
        json.dumps(entry["count"]),
        entry["dtype"],
        json.dumps(entry["root"]),
    )


def describe(entry: dict[str, Any]) -> str:
    """``allreduce (mpi, count 3, float64)``."""
    extra = [entry["algorithm"]] if entry.get("algorithm") else []
    if entry.get("count") is not None:
        extra.append(f"count {entry['count']}")
    if entry.get("dtype") is not None:
        extra.append(str(entry["dtype"]))
    if entry.get("root") is not None:
        extra.append(f"root {entry['root']}")
    return entry["operation"] + (f" ({', '.join(extra)})" if extra else "")


def first_divergence(trace: dict[int, list[dict[str, Any]]]) -> str | None:
    """The first collective call where the ranks disagree, in words; None if none.

    On each communicator, from the first sequence number every rank's record covers:
    ranks that called different things at one number, or ranks whose record stops
    before a number the others reached.
    """
    # runs of calls, not one item per call: a record's counts may be large (or crafted)
    per_comm: dict[str, dict[int, list[tuple[int, int, dict[str, Any]]]]] = {}
    for rank, entries in trace.items():
        for entry in entries:
            if _collective(entry) and entry["calls"] > 0:
                runs = per_comm.setdefault(entry["comm"], {}).setdefault(rank, [])
                runs.append((entry["seq"], entry["calls"], entry))
    found: list[tuple[float, str]] = []
    for comm, ranks in per_comm.items():
        if len(ranks) < 2 and len(trace) > 1:
            continue
        for runs in ranks.values():
            runs.sort(key=lambda run: run[0])
        start = max(runs[0][0] for runs in ranks.values())
        end = max(max(s + c - 1 for s, c, _ in runs) for runs in ranks.values())
        # what each rank did is the same between two run boundaries: look at each start
        points = {start} | {
            p
            for runs in ranks.values()
            for s, c, _ in runs
            for p in (s, s + c)
            if start <= p <= end
        }
        for seq in sorted(points):
            present = {r: e for r, runs in ranks.items() if (e := _covering(runs, seq))}
            missing = sorted(set(ranks) - set(present))
            kinds: dict[tuple[Any, ...], list[int]] = {}
            for r, entry in present.items():
                kinds.setdefault(_signature(entry), []).append(r)
            if len(kinds) > 1 or missing:
                when = min((e["start"] or 0.0) for e in present.values()) if present else 0.0
                parts = [
                    f"rank(s) {_ranks(rs)} called {describe(present[rs[0]])}"
                    for rs in kinds.values()
                ]
                for r in missing:
                    s, c, e = max(ranks[r], key=lambda run: run[0] + run[1])
                    parts.append(
                        f"rank {r} never got there (its last call on {comm} was "
                        f"#{s + c - 1}, {describe(e)})"
                    )
                found.append((when, f"{comm} #{seq}: " + "; ".join(parts)))
                break
    return min(found)[1] if found else None


def _covering(runs: list[tuple[int, int, dict[str, Any]]], seq: int) -> dict[str, Any] | None:
    """The entry of the last run (sorted by start) that covers sequence number ``seq``."""
    at = bisect.bisect_right(runs, seq, key=lambda run: run[0])
    for s, c, entry in reversed(runs[:at]):
        if s + c > seq:
            return entry
    return None


def _ranks(ranks: Iterable[int]) -> str:
    from ..layout import format_ranks

    return format_ranks(sorted(ranks))


def slow_ranks(
    trace: dict[int, list[dict[str, Any]]],
    window: int = 50,
    min_lag: float = 1e-3,
    min_calls: int = 10,
) -> tuple[list[dict[str, Any]], dict[int, float]]:
    """Ranks that arrive late at the same collective again and again.

    For each rank: the median, over the last ``window`` calls every rank recorded, of
    how long after the first rank it started the call (clocks aligned by
    ``clock_offsets``). A rank is slow when that lag is at least ``min_lag`` seconds
    and at least twice the next largest rank's, over at least ``min_calls`` calls.
    Returns the slow ranks (rank, lag, calls, the operation most often late) and every
    rank's lag.
    """
    offsets = clock_offsets(trace)
    calls = _by_call(trace)
    whole = [
        (key, ranks)
        for key, ranks in sorted(calls.items(), key=lambda kv: _start(kv[1], offsets))
        if len(ranks) == len(trace) and all(e["start"] is not None for e in ranks.values())
    ][-window:]
    lags: dict[int, list[float]] = {r: [] for r in trace}
    operations: dict[int, list[str]] = {r: [] for r in trace}
    for _, ranks in whole:
        starts = {r: e["start"] - offsets[r] for r, e in ranks.items()}
        first = min(starts.values())
        latest = max(starts, key=lambda r: starts[r])
        for r, s in starts.items():
            lags[r].append(s - first)
        operations[latest].append(next(iter(ranks.values()))["operation"])
    median = {r: statistics.median(v) if v else 0.0 for r, v in lags.items()}
    order = sorted(median, key=lambda r: median[r], reverse=True)
    slow = []
    if len(order) >= 2 and len(whole) >= min_calls:
        top, second = order[0], order[1]
        if median[top] >= min_lag and median[top] >= 2 * median[second]:
            late = operations[top]
            slow.append(
                {
                    "rank": top,
                    "lag": median[top],
                    "calls": len(whole),
                    "operation": max(set(late), key=late.count) if late else "",
                }
            )
    return slow, median


def _start(ranks: dict[int, Any], offsets: dict[int, float]) -> float:
    return min((e["start"] or 0.0) - offsets.get(r, 0.0) for r, e in ranks.items())


def chrome_trace(trace: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """The trace as Chrome trace events: a process per rank, a thread per communicator."""
    offsets = clock_offsets(trace)
    origin = min(
        (
            (e["start"] - offsets[r])
            for r, es in trace.items()
            for e in es
            if e["start"] is not None
        ),
        default=0.0,
    )
    events: list[dict[str, Any]] = []
    for rank, entries in trace.items():
        events.append(
            {
                "name": "process_name",
                "ph": "M",
                "pid": rank,
                "tid": 0,
                "args": {"name": f"rank {rank}"},
            }
        )
        threads: dict[str, int] = {}
        for i, entry in enumerate(entries):
            if entry["start"] is None:
                continue
            tid = threads.setdefault(entry["comm"], len(threads) + 1)
            start = entry["start"] - offsets[rank] - origin
            end = entry["end"]
            if end is None:  # a run: until the next call starts
                later = [e["start"] for e in entries[i + 1 :] if e["start"] is not None]
                end = later[0] if later else entry["start"]
            events.append(
                {
                    "name": entry["operation"],
                    "cat": entry["comm"],
                    "ph": "X",
                    "ts": round(start * 1e6, 3),
                    "dur": round(max(0.0, end - entry["start"]) * 1e6, 3),
                    "pid": rank,
                    "tid": tid,
                    "args": {
                        k: entry[k]
                        for k in (
                            "seq",
                            "algorithm",
                            "count",
                            "dtype",
                            "op",
                            "root",
                            "site",
                            "calls",
                        )
                    },
                }
            )
        for comm, tid in threads.items():
            events.append(
                {"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": comm}}
            )
    return {"traceEvents": events, "displayTimeUnit": "ms"}
