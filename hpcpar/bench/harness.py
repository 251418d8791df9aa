"""Timing, statistics and OSU-style output shared by every ``hpcpar bench`` benchmark.

For each message size every variant is warmed up, its iteration count is set so one
repeat lasts about ``min_time`` (agreed by all ranks), and then the repeats run
interleaved across variants so drift on a shared machine hits all of them alike.
A repeat's time on a rank is its mean time per iteration; Avg/Min/Max are over ranks,
and the reported figure is the median over repeats with the interquartile range of
the repeats' averages as the spread. Every variant's result is validated after timing.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import UsageError
from ..runtime.units import format_size, parse_size

__all__ = [
    "Variant",
    "Measurement",
    "sweep",
    "size_range",
    "parse_size",
    "format_size",
    "format_header",
    "format_row",
    "run_sweep",
    "Row",
]


@dataclass(frozen=True)
class Variant:
    """One way of doing the benchmarked operation.

    Attributes:
        name: Column label (``mpi``, ``ring`` ...).
        make: ``make(nbytes)`` returns ``(op, validate)``: ``op()`` does the operation
            once; ``validate()`` says whether the last result is right.
    """

    name: str
    make: Callable[[int], tuple[Callable[[], Any], Callable[[], bool]]]


@dataclass
class Measurement:
    """The figures for one (size, variant) pair, in microseconds and GB/s."""

    size: int
    variant: str
    avg_us: float
    min_us: float
    max_us: float
    iterations: int
    repeats: int
    spread_pct: float
    algbw_gbs: float | None
    busbw_gbs: float | None
    vs_peer: float | None
    valid: bool
    predicted_us: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """Return the fields as a plain dict (for JSON and CSV)."""
        return asdict(self)


def size_range(smallest: int, largest: int) -> list[int]:
    """Powers of two from ``smallest`` to ``largest`` (both rounded into the range)."""
    if smallest < 0 or largest < smallest:
        raise UsageError(f"bad size range {smallest}..{largest}: need 0 <= min <= max")
    sizes = [0] if smallest == 0 else []
    size = max(1, smallest)
    while size <= largest:
        sizes.append(size)
        size *= 2
    return sizes


def _time_once(op: Callable[[], Any]) -> float:
    start = time.perf_counter()
    op()
    return time.perf_counter() - start


def _time_loop(op: Callable[[], Any], iterations: int) -> float:
    start = time.perf_counter()
    for _ in range(iterations):
        op()
    return (time.perf_counter() - start) / iterations


def _iterations(comm: Any, op: Callable[[], Any], min_time: float, max_iterations: int) -> int:
    slowest = comm.allreduce(_time_once(op), op=_max_op())
    return max(1, min(max_iterations, math.ceil(min_time / max(slowest, 1e-9))))


def _order(count: int, repeat: int) -> list[int]:
    """``0 .. count-1``: in order for the first repeat, then shuffled (seeded by ``repeat``)."""
    order = list(range(count))
    if repeat:
        random.Random(repeat).shuffle(order)
    return order


def _max_op() -> Any:
    from mpi4py import MPI

    return MPI.MAX


class Row:
    """A result row of a benchmark that does not use ``sweep`` (a dict of figures).

    ``hpcpar bench`` writes ``as_dict()`` and reports rows whose ``valid`` is false.
    """

    def __init__(self, doc: dict[str, Any], size_key: str = "size") -> None:
        self.doc = doc
        self.valid = bool(doc.get("valid", True))
        self.variant, self.size = doc["variant"], doc[size_key]

    def as_dict(self) -> dict[str, Any]:
        """The figures (for JSON and CSV)."""
        return self.doc


def rank0_printer(comm: Any, bench: str, peer_binary: str | None) -> Callable[..., None]:
    """``print`` on rank 0 (a no-op elsewhere), after checking ``--peer-binary`` exists.

    Raises:
        UsageError: ``peer_binary`` is given but is not a file.
    """
    from pathlib import Path

    from ..errors import UsageError

    if peer_binary and not Path(peer_binary).is_file():
        raise UsageError(f"bench {bench}: --peer-binary {peer_binary}: no such file")
    return print if comm.Get_rank() == 0 else (lambda *a, **k: None)


def quartile_spread(values: Sequence[float]) -> float:
    """The interquartile range as a percentage of the median (0 for fewer than 2 values)."""
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    middle = statistics.median(values)
    return 100.0 * (q3 - q1) / middle if middle > 0 else 0.0


def sweep(
    comm: Any,
    variants: Sequence[Variant],
    sizes: Sequence[int],
    *,
    peer: str | None = None,
    repeats: int = 5,
    warmup: int = 2,
    min_time: float = 0.05,
    max_iterations: int = 10000,
    bus_factor: Callable[[int], float] | None = None,
    on_size: Callable[[list[Measurement]], None] | None = None,
) -> list[Measurement]:
    """Measure every variant at every size (collective over ``comm``).

    Args:
        comm: The communicator the variants run on.
        variants: What to measure.
        sizes: Message sizes in bytes.
        peer: Name of the variant the others are compared against (``vs_peer`` is
            this variant's average time over the peer's).
        repeats: Timed repeats per (size, variant).
        warmup: Untimed calls before timing.
        min_time: Seconds one repeat should last at least (sets the iteration count).
        max_iterations: Upper bound on iterations per repeat.
        bus_factor: Turns algorithm bandwidth into bus bandwidth, given the rank count.
        on_size: Called with each size's measurements as soon as they are done.

    Returns:
        One ``Measurement`` per (size, variant), sizes in order.
    """
    if repeats < 1 or warmup < 0 or min_time <= 0:
        raise UsageError("--repeats must be >= 1, --warmup >= 0 and --min-time > 0")
    results: list[Measurement] = []
    size_ranks = comm.Get_size()
    for nbytes in sizes:
        ops = [(v, *v.make(nbytes)) for v in variants]
        for _, op, _ in ops:
            for _ in range(warmup):
                op()
        iterations = [_iterations(comm, op, min_time, max_iterations) for _, op, _ in ops]
        per_repeat: list[list[tuple[float, float, float]]] = [[] for _ in ops]
        for repeat in range(repeats):
            # each repeat runs the variants in another order (the same on every rank),
            # so that no variant always runs after the same one: it would always pay
            # for what that one left in the cache
            for i in _order(len(ops), repeat):
                op = ops[i][1]
                comm.Barrier()
                times = comm.allgather(_time_loop(op, iterations[i]))
                per_repeat[i].append((statistics.fmean(times), min(times), max(times)))
        batch = []
        for i, (variant, _, validate) in enumerate(ops):
            valid = comm.allreduce(bool(validate()), op=_land_op())
            avgs = [r[0] for r in per_repeat[i]]
            avg = statistics.median(avgs)
            algbw = nbytes / avg / 1e9 if avg > 0 and nbytes else None
            busbw = algbw * bus_factor(size_ranks) if algbw is not None and bus_factor else None
            batch.append(
                Measurement(
                    size=nbytes,
                    variant=variant.name,
                    avg_us=avg * 1e6,
                    min_us=statistics.median(r[1] for r in per_repeat[i]) * 1e6,
                    max_us=statistics.median(r[2] for r in per_repeat[i]) * 1e6,
                    iterations=iterations[i],
                    repeats=repeats,
                    spread_pct=quartile_spread(avgs),
                    algbw_gbs=algbw,
                    busbw_gbs=busbw,
                    vs_peer=None,
                    valid=valid,
                )
            )
        peer_avg = next((m.avg_us for m in batch if m.variant == peer), None)
        for m in batch:
            m.vs_peer = m.avg_us / peer_avg if peer_avg else None
        del ops
        results.extend(batch)
        if on_size is not None:
            on_size(batch)
    return results


def _land_op() -> Any:
    from mpi4py import MPI

    return MPI.LAND


_COLUMNS = (
    ("Size(B)", 11),
    ("Variant", 16),
    ("Avg(us)", 12),
    ("Min(us)", 12),
    ("Max(us)", 12),
    ("Iterations", 10),
    ("algbw(GB/s)", 11),
    ("busbw(GB/s)", 11),
    ("Spread(%)", 9),
    ("vs_peer", 8),
    ("Valid", 5),
    ("Pred(us)", 12),
)


def format_header() -> str:
    """The OSU-style column header line (starts with ``#``)."""
    cells = [f"{name:>{width}}" for name, width in _COLUMNS]
    return "# " + " ".join(cells)[2:] if cells else "#"


def _fmt(value: float | None, width: int, digits: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def format_row(m: Measurement) -> str:
    """One measurement as a row under ``format_header``."""
    return " ".join(
        [
            f"{m.size:>11d}",
            f"{m.variant:>16}",
            _fmt(m.avg_us, 12, 2),
            _fmt(m.min_us, 12, 2),
            _fmt(m.max_us, 12, 2),
            f"{m.iterations:>10d}",
            _fmt(m.algbw_gbs, 11, 3),
            _fmt(m.busbw_gbs, 11, 3),
            _fmt(m.spread_pct, 9, 1),
            _fmt(m.vs_peer, 8, 2),
            f"{'yes' if m.valid else 'NO':>5}",
            _fmt(m.predicted_us, 12, 2),
        ]
    )


def run_sweep(
    comm: Any,
    args: argparse.Namespace,
    variants: list[Variant],
    *,
    title: str,
    unit: int = 1,
    predict: Callable[[str, int], float | None] | None = None,
    peer: str | None = None,
) -> list[Any]:
    """Print the OSU header, sweep the sizes printing rows as they finish, return rows.

    The peer (unless ``peer`` names another) and bus factor come from the benchmark
    named by ``args.benchmark``; the
    sizes and timing from the options every benchmark shares. Sizes are rounded down
    to a multiple of ``unit`` (the element size) and repeats dropped.
    """
    from ..plugins import benchmarks
    from ..runtime.results import mpi_library

    bench = benchmarks()[args.benchmark]
    peer, bus_factor = peer or bench.peer, bench.bus_factor

    lo, hi = parse_size(args.min_size), parse_size(args.max_size)
    sizes = sorted({s - s % unit for s in size_range(lo, hi) if s - s % unit >= unit or s == 0})
    rank = comm.Get_rank()
    if rank == 0:
        print(
            f"# hpcpar bench {title}: {comm.Get_size()} rank(s), layout {args.layout or 'none'}, "
            f"{format_size(sizes[0]) if sizes else '-'}..{format_size(sizes[-1]) if sizes else '-'}"
        )
        print(
            f"# {mpi_library()}; peer: {peer}; {args.repeats} repeats, median; spread = IQR/median"
        )
        print(format_header(), flush=True)

    def show(batch: list[Any]) -> None:
        if predict is not None:
            for m in batch:
                m.predicted_us = predict(m.variant, m.size)
        if rank == 0:
            for m in batch:
                print(format_row(m), flush=True)

    return sweep(
        comm,
        variants,
        sizes,
        peer=peer,
        repeats=args.repeats,
        warmup=args.warmup,
        min_time=args.min_time,
        max_iterations=args.max_iterations,
        bus_factor=bus_factor,
        on_size=show,
    )
