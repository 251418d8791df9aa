"""``hpcpar bench checkpoint``: the caller's stall, flush speed and restore time per level.

For each state size (the job's total, split evenly over the ranks as four float32
arrays), in the same run:

- ``dd-roof``: ``dd if=/dev/zero bs=4M conv=fsync`` of each rank's share, all ranks at
  once, into a new file in the benchmark directory (dd's own time): the disk's speed
  for this pattern.
- ``dd-overwrite``: the same dd over a file of that size written before
  (``conv=notrunc,fsync``): the disk's speed when no blocks are allocated, which is what
  hpcpar's flush meets once pruned versions' files are recycled (thin-provisioned virtual
  disks write allocated blocks several times faster than fresh ones).
- ``np.save+fsync`` and ``h5py-sync``: a synchronous save of the same state (the peers).
- ``hpcpar-stall`` / ``hpcpar-stall-lazy``: the time ``Checkpointer.save()`` blocks the
  caller (memory snapshot; with ``lazy=True`` no copy at all in the caller's time).
- ``hpcpar-flush``: the background flush, from ``save()`` returning to the commit at the
  local level (checksums + write + fsync + collective commit), as GB/s; the ratios are
  against ``dd-roof`` and ``dd-overwrite``.
- ``compute+flush``: a compute loop's time while a flush runs behind it, over its time
  alone (1.00 = no slowdown).
- ``restore-<level>``: ``restore()`` from one level; partner and xor rebuild node 0's
  ranks after its directory is deleted (needs 2+ virtual nodes: ``--layout ppn:1``).
  Page-cache pages of the files are dropped first (``posix_fadvise DONTNEED``), so reads
  come from the disk.

With ``--reshard`` (default size 1 GiB): a global state (four float32 arrays, each
``Sharded`` over the ranks along axis 0) is saved at each level, then restored by the
whole job (``same-<level>``: every rank reads its own shard) and by jobs of fewer ranks
(``reshard-<level>-<N>``: the first N ranks, each reading the overlaps of the saved
blocks with its new block); the ratio is GB/s against the same-count restore of the
level. Partner and xor rebuild node 0's data, deleted first, in both. ``peak_extra_mib``
is the most memory a resharding restore held beyond the new state (tracemalloc, in an
untimed run), to compare with one 32 MiB piece.

Times are the median over ``--repeats`` of the slowest rank; ``spread`` is the
interquartile range over the median.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..plugins import Benchmark, register
from .harness import Row, format_size, parse_size, quartile_spread, size_range

__all__: list[str] = []


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(min_size="64MiB", max_size="256MiB", repeats=3, warmup=2)
    parser.add_argument(
        "--dir",
        default=".",
        help="where to write (a temporary folder is made and removed there; default .)",
    )
    parser.add_argument(
        "--reshard",
        action="store_true",
        help="restore a sharded state on fewer ranks than saved it, per level (default size 1GiB)",
    )
    parser.add_argument(
        "--warm-cache",
        action="store_true",
        help="restore from the page cache (default: drop the files' cached pages first)",
    )


def _state(nbytes: int, rank: int) -> dict[str, Any]:
    rng = np.random.default_rng(rank)
    quarter = max(1, nbytes // 16)
    return {f"layer{i}": {"w": rng.random(quarter, dtype=np.float32)} for i in range(4)}


def _drop_cache(folder: Path) -> None:
    """Drop the page-cache pages of every file below ``folder``."""
    for path in folder.rglob("*"):
        try:
            fd = os.open(path, os.O_RDONLY)
        except (FileNotFoundError, IsADirectoryError):
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _slowest(comm: Any, op: Callable[[], Any]) -> float:
    """The slowest rank's time of ``op`` (an op may return its own, better-measured time)."""
    comm.Barrier()
    start = time.perf_counter()
    own = op()
    mine = own if isinstance(own, float) else time.perf_counter() - start
    return comm.allreduce(mine, op=_max())


def _max() -> Any:
    from mpi4py import MPI

    return MPI.MAX


def _npy_save(folder: Path, state: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, layer in state.items():
        with open(folder / f"{name}.npy", "wb") as handle:
            np.save(handle, layer["w"], allow_pickle=False)
            handle.flush()
            os.fsync(handle.fileno())


def _h5_save(path: Path, state: dict[str, Any]) -> None:
    import h5py

    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        for name, layer in state.items():
            f.create_dataset(f"{name}/w", data=layer["w"])
    with open(path, "rb+") as handle:
        os.fsync(handle.fileno())


def _dd(path: Path, nbytes: int, overwrite: bool = False) -> float:
    """The time dd itself reports for writing ``nbytes`` with fsync (no start-up in it).

    A new file (removed after), or with ``overwrite`` the blocks of the file left by the
    previous call (kept; the first call allocates them).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    count = max(1, nbytes >> 22)
    conv = "notrunc,fsync" if overwrite else "fsync"
    done = subprocess.run(
        ["dd", "if=/dev/zero", f"of={path}", "bs=4M", f"count={count}", f"conv={conv}"],
        check=True,
        capture_output=True,
        text=True,
    )
    if not overwrite:
        path.unlink()
    match = re.search(r"copied, ([0-9.]+) s", done.stderr)
    if match is None:
        raise RuntimeError(f"cannot read dd's time from: {done.stderr.strip()}")
    return float(match.group(1))


def _compute(a: np.ndarray, rounds: int) -> None:
    for _ in range(rounds):
        np.sin(a, out=a)


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(np.array_equal(a[k]["w"], b[k]["w"]) for k in a)


def _row(size: int, variant: str, times: list[float], **extra: Any) -> Row:
    """One figure: a (size, variant) pair with its median, extremes and spread."""
    doc = {
        "size": size,
        "variant": variant,
        "median_s": float(np.median(times)) if times else 0.0,
        "min_s": float(min(times)) if times else 0.0,
        "max_s": float(max(times)) if times else 0.0,
        "spread_pct": quartile_spread(times),
        "repeats": len(times),
        "valid": extra.pop("valid", True),
        **extra,
    }
    return Row(doc)


class _Bench:
    """One run: the job, its scratch folder, and the rows printed so far."""

    def __init__(self, comm: Any, args: argparse.Namespace, work: Path, h: Any) -> None:
        self.comm, self.args, self.work, self.h = comm, args, work, h
        self.rank = comm.Get_rank()
        self.rows: list[Row] = []

    def say(self, *text: Any, **kw: Any) -> None:
        if self.rank == 0:
            print(*text, **kw)

    def emit(self, row: Row, total: int, ratio: float | None, against: str) -> None:
        med = row.doc["median_s"]
        row.doc["gbps"] = total / med / 1e9 if med and total else None
        row.doc["ratio"], row.doc["ratio_against"] = ratio, against
        rate = f"{row.doc['gbps']:7.2f}" if row.doc["gbps"] else f"{'-':>7s}"
        ratio_text = f"{ratio:.3f} vs {against}" if ratio is not None else ""
        if "vs_dd_overwrite" in row.doc:
            ratio_text += f", {row.doc['vs_dd_overwrite']:.3f} vs dd-overwrite"
        self.say(
            f"  {format_size(row.size):>8s} {row.variant:18s} {med:9.4f} {row.doc['min_s']:9.4f} "
            f"{row.doc['max_s']:9.4f} {row.doc['spread_pct']:7.1f} {rate}  {ratio_text}",
            flush=True,
        )
        self.rows.append(row)

    def timed(self, op: Callable[[], Any], warmup: int | None = None) -> list[float]:
        """The slowest rank's time of ``op``, per repeat after the warmup calls."""
        skip = self.args.warmup if warmup is None else warmup
        out = [_slowest(self.comm, op) for _ in range(skip + self.args.repeats)]
        return out[skip:]

    def writes(self, total: int, share: int, state: dict[str, Any]) -> None:
        """dd, np.save, h5py and hpcpar saves, interleaved in a rotating order per repeat.

        The disks of shared machines speed up and slow down (burst credits, other
        tenants' writeback), so every variant is measured in every repeat, each repeat
        starting with a different one.
        """
        from hpcpar.checkpoint import Checkpointer

        comm, args, rank, work = self.comm, self.args, self.rank, self.work
        folder = work / "ck"
        times: dict[str, list[float]] = {}
        with Checkpointer(folder, comm=self.h, levels=["memory", "local"]) as ck:
            version = [0]

            def save(lazy: bool) -> tuple[float, float]:
                version[0] += 1
                comm.Barrier()
                t0 = time.perf_counter()
                handle = ck.save(version[0], state, lazy=lazy)
                t1 = time.perf_counter()
                handle.wait()
                t2 = time.perf_counter()
                return comm.allreduce(t1 - t0, op=_max()), comm.allreduce(t2 - t1, op=_max())

            ops: dict[str, Callable[[], Any]] = {
                "dd-roof": lambda: _slowest(comm, lambda: _dd(work / f"dd{rank}", share)),
                "dd-overwrite": lambda: _slowest(
                    comm, lambda: _dd(work / f"ddo{rank}", share, overwrite=True)
                ),
                "np.save+fsync": lambda: _slowest(
                    comm, lambda: _npy_save(work / "npy" / f"r{rank}", state)
                ),
                "h5py-sync": lambda: _slowest(
                    comm, lambda: _h5_save(work / "h5" / f"r{rank}.h5", state)
                ),
                "hpcpar": lambda: save(False),
                "hpcpar-lazy": lambda: save(True),
            }
            names = list(ops)
            for r in range(args.warmup + args.repeats):
                shift = r % len(names)
                for name in names[shift:] + names[:shift]:
                    got = ops[name]()
                    if r < args.warmup:
                        continue
                    if name == "hpcpar":
                        times.setdefault("hpcpar-stall", []).append(got[0])
                        times.setdefault("hpcpar-flush", []).append(got[1])
                    elif name == "hpcpar-lazy":
                        times.setdefault("hpcpar-stall-lazy", []).append(got[0])
                    else:
                        times.setdefault(name, []).append(got)
            _, back = ck.restore()
            ok = bool(comm.allreduce(_same(state, back), op=_land()))
            self.compute_slowdown(total, ck, state)
        (work / f"ddo{rank}").unlink(missing_ok=True)
        roof = float(np.median(times["dd-roof"]))
        h5_time = float(np.median(times["h5py-sync"]))
        for name in ("dd-roof", "dd-overwrite", "np.save+fsync", "h5py-sync", "hpcpar-flush"):
            row = _row(total, name, times[name], valid=ok or name != "hpcpar-flush")
            ratio = None if name == "dd-roof" else roof / row.doc["median_s"]
            if name == "hpcpar-flush":
                over = float(np.median(times["dd-overwrite"])) / row.doc["median_s"]
                row.doc["vs_dd_overwrite"] = round(over, 3)
            self.emit(row, total, ratio, "dd-roof (GB/s ratio)")
        for name in ("hpcpar-stall", "hpcpar-stall-lazy"):
            row = _row(total, name, times[name], valid=ok)
            self.emit(row, 0, row.doc["median_s"] / h5_time, "h5py-sync")
        comm.Barrier()
        if rank == 0:
            shutil.rmtree(folder, ignore_errors=True)

    def compute_slowdown(self, total: int, ck: Any, state: dict[str, Any]) -> None:
        """A compute loop's time with a flush behind it, over its time alone."""
        comm = self.comm
        a = np.random.default_rng(self.rank).random(1 << 20)
        rounds = [1]

        def compute() -> None:
            _compute(a, rounds[0])

        while _slowest(comm, compute) < 0.2 and rounds[0] < 1 << 12:
            rounds[0] *= 2
        alone, behind = [], []
        for i in range(self.args.repeats):
            alone.append(_slowest(comm, compute))
            comm.Barrier()
            handle = ck.save(10_000 + i, state)
            behind.append(_slowest(comm, compute))
            handle.wait()
        slow = float(np.median(behind) / np.median(alone))
        self.emit(_row(total, "compute+flush", behind), 0, slow, "compute alone")

    def restores(self, total: int, state: dict[str, Any]) -> None:
        """Restore time per level (partner and xor rebuild a deleted node 0)."""
        from hpcpar.checkpoint import Checkpointer, faults

        comm, h, rank = self.comm, self.h, self.rank
        multi = h.n_nodes >= 2
        levels = ["local", "partner", "xor", "hdf5"] if multi else ["local", "hdf5"]
        order = ["local", "hdf5"] + (["partner", "xor"] if multi else [])
        times: dict[str, list[float]] = {n: [] for n in order}
        valid = dict.fromkeys(order, True)
        for i in range(self.args.repeats):
            folder = self.work / f"rs{i}"
            with Checkpointer(folder, comm=h, levels=levels) as ck:
                ck.save(1, state).wait()
            for level in order:
                if level == "partner":
                    if rank == 0:
                        faults.delete_node(folder, 0)
                    comm.Barrier()  # no rank looks at the files while they go
                if not self.args.warm_cache:
                    _drop_cache(folder)
                with Checkpointer(folder, comm=h, levels=[level]) as ck:
                    got: dict[str, Any] = {}

                    def load(ck: Any = ck, got: dict[str, Any] = got) -> None:
                        got["state"] = ck.restore()[1]

                    times[level].append(_slowest(comm, load))
                    served = ck.restored_from[rank]
                    rebuilt = level in ("local", "hdf5") or h.node_index != 0 or served == level
                    good = _same(state, got["state"]) and rebuilt
                    valid[level] = valid[level] and bool(comm.allreduce(good, op=_land()))
            comm.Barrier()
            if rank == 0:
                shutil.rmtree(folder, ignore_errors=True)
        local_time = float(np.median(times["local"]))
        for level in order:
            row = _row(total, f"restore-{level}", times[level], valid=valid[level])
            self.emit(row, total, row.doc["median_s"] / local_time, "restore-local")


def _sharded(nbytes: int, rank: int, size: int) -> dict[str, Any]:
    """Four float32 global arrays of ``nbytes`` in all; this rank's even block of each."""
    from hpcpar.checkpoint import Sharded
    from hpcpar.checkpoint.sharding import even_block

    n = max(size, nbytes // 16)
    out = {}
    for i in range(4):
        offset, shape = even_block((n,), 0, rank, size)
        out[f"layer{i}"] = {"w": Sharded(_values(i, offset[0], shape[0]), (n,), offset)}
    return out


def _values(layer: int, start: int, n: int) -> np.ndarray:
    """The values of ``_sharded``'s layer ``layer`` at indices ``start .. start + n``."""
    return ((np.arange(start, start + n) % 65521) + layer).astype(np.float32)


def _sub_job(comm: Any, n: int, layout: Any, work: Callable[[Any], Any]) -> Any:
    """Run ``work(hierarchy)`` on the first ``n`` ranks; every rank gets rank 0's result.

    The other ranks wait asleep (a test of a barrier every millisecond), not spinning
    in MPI: on a machine with fewer cores than ranks they would slow the job down.
    """
    from ..topology import Hierarchy

    rank = comm.Get_rank()
    sub = comm.Split(0 if rank < n else 1, rank)
    out = None
    try:
        if rank < n:
            with Hierarchy(sub, layout=layout) as h:
                out = work(h)
    finally:
        sub.Free()
    done = comm.Ibarrier()
    while not done.Test():
        time.sleep(0.001)
    return comm.bcast(out, root=0)


def _reshards(bench: _Bench, nominal: int) -> None:
    """Same-count and resharding restores per level (see the module's description)."""
    import tracemalloc

    from hpcpar.checkpoint import Checkpointer, faults

    comm, size, args = bench.comm, bench.comm.Get_size(), bench.args
    multi = bench.h.n_nodes >= 2
    levels = ["local", "hdf5"] + (["partner", "xor"] if multi else [])
    counts = [n for n in (2, 3) if n < size] or [n for n in (1,) if n < size]
    total = 4 * 4 * max(size, nominal // 16)

    def usable(h: Any, level: str) -> list[str]:  # one node holds no partner or XOR level
        return [level] if h.n_nodes >= 2 or level in ("local", "hdf5") else ["local"]

    def restore(h: Any, folder: Path, level: str) -> tuple[float, bool]:
        with Checkpointer(folder, comm=h, levels=usable(h, level)) as ck:
            c = h.comm
            if not args.warm_cache and c.Get_rank() == 0:
                _drop_cache(folder)
            c.Barrier()
            start = time.perf_counter()
            _, got = ck.restore()
            took = c.allreduce(time.perf_counter() - start, op=_max())
            good = all(_whole(int(k[5:]), got[k]["w"]) for k in got)
            return took, bool(c.allreduce(good, op=_land()))

    def peak(h: Any, folder: Path, level: str) -> float:
        with Checkpointer(folder, comm=h, levels=usable(h, level)) as ck:
            tracemalloc.start()
            _, got = ck.restore()
            extra = tracemalloc.get_traced_memory()[1] - sum(got[k]["w"].block.nbytes for k in got)
            tracemalloc.stop()
            return float(h.comm.allreduce(extra, op=_max())) / (1 << 20)

    for level in levels:
        folder = bench.work / f"reshard-{level}"
        state = _sharded(nominal, bench.rank, size)
        with Checkpointer(folder, comm=bench.h, levels=[level], overwrite=True) as ck:
            ck.save(1, state).wait()
        del state
        if level in ("partner", "xor"):
            if bench.rank == 0:
                faults.delete_node(folder, 0)
            comm.Barrier()
        runs: dict[int, list[float]] = {n: [] for n in [size, *counts]}
        valid = dict.fromkeys(runs, True)
        for _ in range(args.repeats):
            for n, times in runs.items():
                took, good = _sub_job(
                    comm, n, args.layout, lambda h, f=folder, lv=level: restore(h, f, lv)
                )
                times.append(took)
                valid[n] = valid[n] and good
        same = float(np.median(runs[size]))
        bench.emit(
            _row(total, f"same-{level}", runs[size], valid=valid[size]), total, 1.0, f"same-{level}"
        )
        for n in counts:
            extra = _sub_job(comm, n, args.layout, lambda h, f=folder, lv=level: peak(h, f, lv))
            row = _row(
                total,
                f"reshard-{level}-{n}",
                runs[n],
                valid=valid[n],
                peak_extra_mib=round(extra, 1),
            )
            bench.emit(row, total, same / float(np.median(runs[n])), f"same-{level}")
            bench.say(f"  {'':8s} {'':18s} peak memory beyond the new state: {extra:.1f} MiB")
        comm.Barrier()
        if bench.rank == 0:
            shutil.rmtree(folder, ignore_errors=True)


def _whole(layer: int, leaf: Any) -> bool:
    """Whether a restored block holds the values ``_sharded`` gave its indices."""
    return bool(np.array_equal(leaf.block, _values(layer, leaf.offset[0], leaf.block.size)))


def _run(comm: Any, args: argparse.Namespace) -> list[Any]:
    from ..errors import UsageError
    from ..runtime.results import mpi_library
    from ..topology import Hierarchy

    if args.repeats < 1:
        raise UsageError(f"bench checkpoint: --repeats must be at least 1, not {args.repeats}")
    base = Path(args.dir)
    if not base.is_dir():
        raise UsageError(f"bench checkpoint: --dir {base} is not a directory")
    rank, size = comm.Get_rank(), comm.Get_size()
    sizes = size_range(parse_size(args.min_size), parse_size(args.max_size))
    top = comm.bcast(tempfile.mkdtemp(prefix="hpcpar-bench-ckpt-", dir=base) if rank == 0 else None)
    h = Hierarchy(comm, layout=args.layout)
    bench = _Bench(comm, args, Path(top), h)
    bench.say(
        f"# hpcpar bench checkpoint: {size} rank(s) on {h.n_nodes} node(s) "
        f"(layout {args.layout or 'real'}); {mpi_library()}; dir {base.resolve()}; "
        f"{args.repeats} repeats, median of the slowest rank; "
        f"{'warm' if args.warm_cache else 'cold'} page cache for restores"
    )
    bench.say(
        f"# {'size':>8s} {'variant':18s} {'median_s':>9s} {'min_s':>9s} {'max_s':>9s} "
        f"{'spread%':>7s} {'GB/s':>7s}  ratio"
    )
    if args.reshard and args.min_size == "64MiB" and args.max_size == "256MiB":
        sizes = [1 << 30]  # --reshard's default size
    try:
        for nominal in sizes:
            if args.reshard:
                _reshards(bench, nominal)
                continue
            share = nominal // size
            state = _state(share, rank)
            total = comm.allreduce(sum(v["w"].nbytes for v in state.values()))
            bench.writes(total, share, state)
            bench.restores(total, state)
            del state
    except BaseException:
        if rank == 0:  # no barrier: the other ranks may be inside a collective; the
            shutil.rmtree(top, ignore_errors=True)  # error aborts the job
        raise
    comm.Barrier()
    if rank == 0:
        shutil.rmtree(top, ignore_errors=True)
    h.free()
    return bench.rows


def _land() -> Any:
    from mpi4py import MPI

    return MPI.LAND


register(
    Benchmark(
        "checkpoint",
        "checkpoint stall, flush GB/s and restore time per level vs np.save, h5py and dd",
        _add_arguments,
        _run,
        peer="h5py-sync",
    )
)
