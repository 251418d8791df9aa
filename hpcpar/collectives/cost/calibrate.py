"""Measure a machine profile on the running job: ping-pongs, reductions, library calls.

Collective over the job. Intra-node alpha/beta come from a ping-pong between two ranks
of one node, inter-node from a ping-pong between two node leaders (copied from the
intra-node level when the job has one node); gamma from numpy's add on a few MiB;
each compression scheme's code + decode time on 4 MiB of float32;
where rank 0 has a GPU, the two ways a GPU view's bytes reach host memory (``staged`` by
a 2D copy, ``device`` by the pack kernel), which ``hpcpar.send`` chooses between;
hpcpar's software costs from its own calls against the library's and the model; and
the library's collectives are timed at a few sizes (loops of calls, as benchmarks time
them) so ``auto`` can weigh them against hpcpar's.
"""

from __future__ import annotations

import itertools
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ...runtime.profile import Level, Profile
from ..algorithms import ALGORITHMS
from ..tally import Layout
from .counts import counts_for

__all__ = ["calibrate", "PING_SIZES", "LIBRARY_SIZES"]

PING_SIZES = (8, 512, 8192, 65536, 1 << 20, 4 << 20)
LIBRARY_SIZES = tuple(8 << (2 * k) for k in range(11))  # 8 B to 8 MiB, powers of 4
_LIBRARY_COLLECTIVES = ("allreduce", "bcast", "reduce", "allgather", "reduce_scatter", "alltoall")


def _median_time(comm: Any, op: Callable[[], Any], repeats: int) -> float:
    """Median over ``repeats`` of the slowest rank's time for ``op`` (collective)."""
    from mpi4py import MPI

    samples = []
    for _ in range(repeats):
        comm.Barrier()
        start = time.perf_counter()
        op()
        samples.append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    return statistics.median(samples)


def _ping_pong(comm: Any, a: int, b: int, repeats: int) -> Level | None:
    """alpha/beta from a ping-pong between ranks ``a`` and ``b`` of ``comm`` (collective).

    alpha is the one-way time of 8 or 512 bytes, whichever measured less (ranks sharing
    cores make single small messages noisy); beta the time per byte that a longer message
    adds, between the two largest sizes (1 and 4 MiB): the rate a large collective streams
    at. A line fitted through every size weighs in the cheap first bytes of each message
    (an eager protocol, a switch's or token bucket's burst allowance): on a shaped link a
    1 MiB ping-pong runs faster than 4-16 MiB ones, and such a fit predicts large
    allreduces a fifth or more too fast.
    """
    rank = comm.Get_rank()
    times = []
    for nbytes in PING_SIZES:
        buf = np.zeros(nbytes, np.uint8)
        # Small messages: each sample is a loop of round trips, as a collective sends
        # them; one round trip right after a barrier varies several-fold between runs
        # (ranks waking on shared cores).
        trips = max(1, min(32, (256 << 10) // nbytes))
        samples = []
        for _ in range(repeats):
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(trips):
                if rank == a:
                    comm.Send(buf, b, 77)
                    comm.Recv(buf, b, 77)
                elif rank == b:
                    comm.Recv(buf, a, 77)
                    comm.Send(buf, a, 77)
            samples.append((time.perf_counter() - start) / (2 * trips))
        times.append(comm.bcast(statistics.median(samples), root=a))
    beta = (times[-1] - times[-2]) / (PING_SIZES[-1] - PING_SIZES[-2])
    if beta <= 0:  # the larger message measured faster: noise; fit every size instead
        beta = float(np.polyfit(np.array(PING_SIZES[1:], float), np.array(times[1:]), 1)[0])
    return Level(max(min(times[0], times[1]), 1e-9), max(beta, 1e-13))


def _gamma() -> float:
    a, b = np.ones(1 << 19), np.ones(1 << 19)  # 4 MiB each
    samples = []
    for _ in range(7):
        start = time.perf_counter()
        np.add(a, b, out=a)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) / a.nbytes


def _codecs() -> dict[str, float]:
    """Code + decode seconds per float32 byte of each compression scheme on this core."""
    from ..compression.schemes import SCHEMES, codec_for

    x = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)  # 4 MiB
    out = {}
    for name in SCHEMES:
        codec = codec_for(name)
        payload = np.empty(codec.wire_bytes(x.size), np.uint8)
        acc = np.zeros_like(x)
        samples = []
        for _ in range(5):  # the first call may compile the kernels (or load numba's cache)
            start = time.perf_counter()
            codec.encode(x, payload)
            codec.decode(payload, acc)
            samples.append(time.perf_counter() - start)
        out[name] = min(samples[1:]) / x.nbytes
    return out


def _library_call(comm: Any, collective: str, n: int) -> Callable[[], Any]:
    """The library's own call of ``collective`` on ``n`` float64 per rank, buffers bound."""
    p = comm.Get_size()
    x, out = np.ones(n), np.empty(n)
    if collective == "allreduce":
        return lambda: comm.Allreduce(x, out)
    if collective == "bcast":
        return lambda: comm.Bcast(x, 0)
    if collective == "reduce":
        return lambda: comm.Reduce(x, out, root=0)
    if collective == "allgather":
        gathered = np.empty(n * p)
        return lambda: comm.Allgather(x, gathered)
    if collective == "reduce_scatter":
        full = np.ones(n * p)
        return lambda: comm.Reduce_scatter_block(full, out)
    m = max(p, n - n % p)  # alltoall
    send, recv = np.ones(m), np.empty(m)
    return lambda: comm.Alltoall(send, recv)


def _library_table(comm: Any, collective: str, repeats: int) -> list[list[float]]:
    return [
        [nbytes, _per_call(comm, _library_call(comm, collective, max(1, nbytes // 8)), repeats)]
        for nbytes in LIBRARY_SIZES
    ]


def _per_call(comm: Any, op: Callable[[], Any], repeats: int, budget_s: float = 2e-3) -> float:
    """Seconds per call of ``op`` (collective): median over ``repeats`` loops of calls.

    One call right after a barrier pays the ranks' wake-up (a lot when ranks share
    cores), so each sample is a loop of as many calls as fit ``budget_s`` (1 to 200,
    agreed by all ranks), as a benchmark times them.
    """
    from mpi4py import MPI

    op()  # warm up: buffers, connections, the first call's setup
    once = _median_time(comm, op, 3)
    calls = comm.allreduce(max(1, min(200, int(budget_s / max(once, 1e-7)))), op=MPI.MAX)
    return _median_time(comm, lambda: [op() for _ in range(calls)], repeats) / calls


def _software_costs(
    comm: Any, hierarchy: Any, profile: Profile, repeats: int
) -> tuple[float, float, float]:
    """What hpcpar's Python adds: per call and per round of its schedules, per library call.

    A library call through hpcpar (``algorithm="mpi"``) against the library's own call
    gives the last. For its own schedules, the classic flat allreduce with the fewest
    rounds and the one with the most (recursive doubling and the ring) on 8 bytes are
    timed, the model's network and reduction time for each (``profile`` without
    software costs) is taken off, and the rest is fitted as ``call + rounds x step``.
    """
    import hpcpar

    from .model import predict

    x, out = np.ones(1), np.empty(1)
    direct = _per_call(comm, lambda: comm.Allreduce(x, out), repeats)
    through = _per_call(
        comm, lambda: hpcpar.allreduce(x, out=out, comm=hierarchy, algorithm="mpi"), repeats
    )
    layout = Layout(tuple(hierarchy.node_of))
    rest = []
    for name in _fewest_and_most_rounds(layout):
        timed = _per_call(
            comm,
            lambda name=name: hpcpar.allreduce(x, out=out, comm=hierarchy, algorithm=name),
            repeats,
        )
        network = predict("allreduce", name, layout, 1, 8, profile).seconds
        rest.append((counts_for("allreduce", name, layout, 0, 1, 8).rounds, timed - network))
    (few, r_few), (many, r_many) = sorted(rest)
    step = max((r_many - r_few) / (many - few), 0.0) if many > few else 0.0
    call = max(r_few - few * step, 0.0)
    return call, step, max(through - direct, 0.0)


def _fewest_and_most_rounds(layout: Layout) -> list[str]:
    """The classic flat allreduce algorithms with the fewest and the most rounds."""
    flat = [n for n, r in ALGORITHMS["allreduce"].items() if r.classic and not r.hierarchical]
    rounds = {n: counts_for("allreduce", n, layout, 0, 1, 8).rounds for n in flat}  # type: ignore[union-attr]
    return [min(flat, key=rounds.__getitem__), max(flat, key=rounds.__getitem__)]


def _send_methods(comm: Any, repeats: int) -> list[list[float]]:
    """Ping-pong strided layouts between ranks 0 and 1, packed and as a derived datatype.

    Rows ``[block, bytes, pack s, datatype s, stride]``: blocks of 8 B - 64 KiB, 1 KiB
    - 4 MiB in all, the blocks twice their size apart (dense) and, for the smaller
    blocks, 16 times (sparse: a face of single doubles is sparser still). MPI's engine
    and hpcpar's packer rank differently on the two: about even on dense blocks, the
    datatype well ahead on a z face's single doubles.
    """
    import hpcpar

    rank, rows = comm.Get_rank(), []
    layouts = itertools.product((8, 512, 65536), (1 << 10, 1 << 16, 1 << 22), (2, 16))
    for block, total, spread in layouts:
        if block > total or (spread > 2 and block >= 65536):
            continue
        raw = np.zeros(spread * total, np.uint8)
        view = raw.reshape(-1, spread * block)[:, :block]
        times = []
        for method in ("pack", "datatype"):

            def bounce(method: str = method, view: np.ndarray = view) -> None:
                if rank == 0:
                    hpcpar.send(view, 1, 31, comm=comm, method=method)
                    hpcpar.recv(view, 1, 31, comm=comm, method=method)
                elif rank == 1:
                    hpcpar.recv(view, 0, 31, comm=comm, method=method)
                    hpcpar.send(view, 0, 31, comm=comm, method=method)

            times.append(_median_time(comm, bounce, repeats) / 2)
        rows.append([block, total, *times, spread * block])
    return rows


def _device_send_methods(repeats: int) -> list[list[float]]:
    """Time a GPU view's trip to host memory and back by both methods (this rank alone)."""
    import cupy

    from ...datatypes.gpu import device_to_host, host_to_device

    rows = []
    for block in (8, 512, 65536):
        for total in (1 << 16, 1 << 22):
            view = cupy.zeros(2 * total, cupy.uint8).reshape(-1, 2 * block)[:, :block]
            times = []
            for method in ("device", "staged"):
                host_to_device(device_to_host(view, method), view, method)  # warm up
                samples = []
                for _ in range(repeats):
                    start = time.perf_counter()
                    host_to_device(device_to_host(view, method), view, method)
                    samples.append((time.perf_counter() - start) / 2)
                times.append(statistics.median(samples))
            rows.append([block, total, *times])
    return rows


def _oversubscribed(comm: Any) -> bool:
    """Whether some machine runs more of the job's ranks than it has cores (collective).

    Ranks are grouped by the kernel they run on (its boot id), so the virtual nodes of
    one machine (network namespaces) count as the one machine they share.
    """
    from ...runtime.env import usable_cores

    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            machine = handle.read().strip()
    except OSError:
        machine = platform.node()
    seen = comm.allgather((machine, usable_cores()))
    return any(sum(m == host for m, _ in seen) > c for host, c in seen)


def calibrate(comm: Any, hierarchy: Any, *, repeats: int = 9, name: str | None = None) -> Profile:
    """Measure a profile for this job (collective over ``comm``)."""
    node_ranks = [hierarchy.ranks_of_node(i) for i in range(hierarchy.n_nodes)]
    shared = next((ranks for ranks in node_ranks if len(ranks) > 1), None)
    intra = _ping_pong(comm, shared[0], shared[1], repeats) if shared else None
    inter = (
        _ping_pong(comm, node_ranks[0][0], node_ranks[1][0], repeats)
        if len(node_ranks) > 1
        else None
    )
    if intra is None:
        intra = inter or Level(1e-6, 1e-10)
    if inter is None:
        inter = intra
    gamma = comm.allreduce(_gamma()) / comm.Get_size()
    mine = _codecs()
    codecs = {k: comm.allreduce(v) / comm.Get_size() for k, v in sorted(mine.items())}
    network = Profile("network", intra, inter, gamma)
    call_s, step_s, library_call_s = _software_costs(comm, hierarchy, network, repeats)
    library = {
        c: {
            "ranks": comm.Get_size(),
            "layout": hierarchy.layout,
            "table": _library_table(comm, c, repeats),
        }
        for c in _LIBRARY_COLLECTIVES
    }
    if comm.Get_size() > 1:
        library["send_methods"] = {"ranks": 2, "table": _send_methods(comm, repeats)}
    from ...datatypes.gpu import gpu_available

    device = comm.bcast(
        _device_send_methods(repeats) if comm.Get_rank() == 0 and gpu_available() else None
    )
    if device:
        library["device_send_methods"] = {"ranks": 1, "table": device}
    where = f"{comm.Get_size()} ranks, layout {hierarchy.layout or 'real'}"
    crowded = _oversubscribed(comm)
    return Profile(
        name=name or f"calibrated on {platform.node()} ({where})",
        intra=intra,
        inter=inter,
        gamma_s_per_byte=gamma,
        call_s=call_s,
        step_s=step_s,
        library_call_s=library_call_s,
        mpi_library=library,
        calibrated=True,
        oversubscribed=crowded,
        codecs=codecs,
    )
