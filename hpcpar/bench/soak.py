"""``hpcpar bench soak``: many random collectives, every result checked, memory watched.

Call ``i`` is drawn from a generator seeded with ``(seed, i)``, so every rank draws the
same call without talking: the collective (allreduce, reduce, bcast, allgather,
reduce_scatter, alltoall, barrier), blocking or nonblocking, the algorithm (any the
collective has, or ``auto``), the element count, dtype, op and root. Each rank's
contribution is a function of its rank and ``i`` whose reductions are exact in every
dtype, so each rank computes the expected result itself with numpy and compares. The
resident memory of every rank is read after the first tenth of the calls and at the
end; the growth in between must stay under ``--max-rss-growth``.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from ..plugins import Benchmark, register
from .harness import Measurement

__all__: list[str] = []

COLLECTIVES = ("allreduce", "reduce", "bcast", "allgather", "reduce_scatter", "alltoall", "barrier")


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..cli.common import integer, real

    parser.add_argument(
        "--calls", type=integer(1, 1 << 40), default=100_000, help="collectives (default 100000)"
    )
    parser.add_argument("--seed", type=integer(0), default=0, help="the draws' seed (default 0)")
    parser.add_argument(
        "--max-count",
        type=integer(1, 1 << 24),
        default=2048,
        help="elements per rank at most (drawn log-uniformly; default 2048)",
    )
    parser.add_argument(
        "--max-rss-growth",
        type=real(0, 1 << 20),
        default=64.0,
        metavar="MIB",
        help="resident memory a rank may gain after the warm-up, in MiB (default 64)",
    )


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


class _Draw:
    """One random call: what every rank does, and what it should get back."""

    def __init__(self, seed: int, i: int, size: int, max_count: int, algorithms: dict) -> None:
        import numpy as np
        from mpi4py import MPI

        rng = np.random.default_rng([seed, i])
        self.i = i
        self.collective = COLLECTIVES[int(rng.integers(len(COLLECTIVES)))]
        choices = ["auto", *algorithms[self.collective]]
        self.algorithm = choices[int(rng.integers(len(choices)))]
        self.blocking = bool(rng.integers(4))  # every collective has a nonblocking form
        count = int(np.exp(rng.uniform(0, np.log(max_count + 1))))
        if self.collective == "alltoall":
            count = max(1, count // size) * size
        self.count = count
        self.dtype = np.dtype(["float64", "float32", "int64", "int32"][int(rng.integers(4))])
        self.op_name = ["SUM", "MAX", "MIN"][int(rng.integers(3))]
        self.op = getattr(MPI, self.op_name)
        self.root = int(rng.integers(size))

    def contribution(self, rank: int) -> Any:
        import numpy as np

        return ((np.arange(self.count) * 3 + rank * 7 + self.i) % 11).astype(self.dtype)

    def reduced(self, size: int) -> Any:
        import numpy as np

        parts = np.stack([self.contribution(r) for r in range(size)])
        way = {"SUM": np.sum, "MAX": np.max, "MIN": np.min}[self.op_name]
        return way(parts, axis=0).astype(self.dtype)


def _call(d: _Draw, comm: Any) -> Any:
    """Run the drawn call on this rank; returns its result."""
    import hpcpar

    me = comm.Get_rank()
    x = d.contribution(me)
    kw = {"comm": comm, "algorithm": d.algorithm}
    c = d.collective
    if c == "barrier":
        return hpcpar.barrier(**kw) if d.blocking else hpcpar.ibarrier(**kw).wait()
    if c == "allreduce":
        f = hpcpar.allreduce if d.blocking else hpcpar.iallreduce
        args: tuple[Any, ...] = (x, d.op)
    elif c == "reduce":
        f = hpcpar.reduce if d.blocking else hpcpar.ireduce
        args = (x, d.root, d.op)
    elif c == "bcast":
        f = hpcpar.bcast if d.blocking else hpcpar.ibcast
        args = (x, d.root)
    elif c == "allgather":
        f = hpcpar.allgather if d.blocking else hpcpar.iallgather
        args = (x,)
    elif c == "reduce_scatter":
        f = hpcpar.reduce_scatter if d.blocking else hpcpar.ireduce_scatter
        args = (x, d.op)
    else:
        f = hpcpar.alltoall if d.blocking else hpcpar.ialltoall
        args = (x,)
    out = f(*args, **kw)
    return out if d.blocking else out.wait()


def _right(d: _Draw, got: Any, comm: Any) -> bool:
    """Whether ``got`` is what the drawn call must return on this rank."""
    import numpy as np

    me, size = comm.Get_rank(), comm.Get_size()
    c = d.collective
    if c == "barrier":
        return got is None
    if c == "allreduce":
        want = d.reduced(size)
    elif c == "reduce":
        if me != d.root:
            return got is None
        want = d.reduced(size)
    elif c == "bcast":
        want = d.contribution(d.root)
    elif c == "allgather":
        want = np.concatenate([d.contribution(r) for r in range(size)])
    elif c == "reduce_scatter":
        counts = [d.count // size + (1 if r < d.count % size else 0) for r in range(size)]
        start = sum(counts[:me])
        want = d.reduced(size)[start : start + counts[me]]
    else:
        k = d.count // size
        want = np.concatenate([d.contribution(r)[me * k : (me + 1) * k] for r in range(size)])
    got = np.asarray(got)
    return got.dtype == want.dtype and np.array_equal(got.reshape(-1), want.reshape(-1))


def _run(comm: Any, args: argparse.Namespace) -> list[Measurement]:
    from ..collectives import algorithms_for

    algorithms = {c: algorithms_for(c) for c in COLLECTIVES}
    size, rank = comm.Get_size(), comm.Get_rank()
    warm = max(1, args.calls // 10)
    seconds: dict[str, float] = dict.fromkeys(COLLECTIVES, 0.0)
    calls: dict[str, int] = dict.fromkeys(COLLECTIVES, 0)
    wrong: dict[str, int] = dict.fromkeys(COLLECTIVES, 0)
    first_wrong: list[str] = []
    rss_warm = _rss_mib()
    started = time.perf_counter()
    for i in range(args.calls):
        if i == warm:
            rss_warm = _rss_mib()
        d = _Draw(args.seed, i, size, args.max_count, algorithms)
        t = time.perf_counter()
        got = _call(d, comm)
        seconds[d.collective] += time.perf_counter() - t
        calls[d.collective] += 1
        if not _right(d, got, comm):
            wrong[d.collective] += 1
            if not first_wrong:
                first_wrong.append(
                    f"call {i}: {d.collective} {d.algorithm} count {d.count} "
                    f"{d.dtype} {d.op_name} root {d.root}"
                )
    total = time.perf_counter() - started
    growth = _rss_mib() - rss_warm
    growths = comm.allgather(growth)
    wrongs = comm.allreduce(sum(wrong.values()))
    bad = comm.allgather(first_wrong)
    ok_memory = max(growths) <= args.max_rss_growth
    out = []
    wrong_all = {c: comm.allreduce(wrong[c]) for c in COLLECTIVES}
    for c in COLLECTIVES:
        every = wrong_all[c]
        avg = seconds[c] / calls[c] * 1e6 if calls[c] else 0.0
        out.append(
            Measurement(
                size=calls[c],
                variant=c,
                avg_us=avg,
                min_us=avg,
                max_us=avg,
                iterations=calls[c],
                repeats=1,
                spread_pct=0.0,
                algbw_gbs=None,
                busbw_gbs=None,
                vs_peer=None,
                valid=every == 0 and ok_memory,
            )
        )
    if rank == 0:
        print(
            f"# hpcpar bench soak: {args.calls} random collectives at {size} rank(s), seed "
            f"{args.seed}, up to {args.max_count} elements; every result checked against "
            f"numpy on every rank",
            flush=True,
        )
        print(f"# {'collective':>16} {'calls':>8} {'wrong':>6} {'avg us':>10}")
        for m in out:
            print(f"  {m.variant:>16} {m.iterations:8d} {wrong_all[m.variant]:6d} {m.avg_us:10.1f}")
        print(f"results wrong: {wrongs} of {args.calls * size} (calls x ranks)")
        print(
            f"resident memory growth after the first {warm} calls, per rank (MiB): "
            + ", ".join(f"{g:+.1f}" for g in growths)
            + f" (limit {args.max_rss_growth:g})"
        )
        print(f"{total:.1f} s, {args.calls / total:.0f} collectives/s")
        for rank_bad in bad:
            for line in rank_bad:
                print(f"first wrong result: {line}")
    return out


register(
    Benchmark(
        "soak",
        "random collectives (every kind, algorithm, dtype and size), each result checked, "
        "memory growth watched",
        _add_arguments,
        _run,
        peer="",
    )
)
