"""``hpcpar bench datatypes``: pack/unpack speed of hpcpar's plans vs MPI's Pack and numpy.

Cases: the x, y and z faces and the interior of an N^3 float64 array, vectors of 8 B to
64 KiB blocks at twice their size apart, a padded struct, irregular layouts (4,096 and
131,072 blocks of 8 B, 4,096 of 64 B, at random places, one place in four taken: an
hindexed_block type, and as numpy's peer ``np.take`` of the doubles at a precomputed
index), and three small messages (64 B - 2 KiB: their Avg(us) is the pack's latency);
each as a numpy view and as the equivalent MPI datatype. Variants in the same run:
``hpcpar-pack`` (the plan into
a preallocated buffer), ``hpcpar-packer`` (the same through ``Plan.packer``, the
persistent form; ``hpcpar-unpacker`` likewise), ``mpi-pack`` (``MPI.Datatype.Pack``,
the peer), ``numpy`` (``np.copyto`` of the view into a preallocated buffer, i.e.
``ascontiguousarray`` without the allocation), ``hpcpar-pack-new`` (``plan.pack(view)``
into a new buffer) against ``numpy-ascontiguousarray`` (new buffers both; a contiguous
view is copied with ``view.copy()``, as ``ascontiguousarray`` would return the view
itself), and the unpack counterparts. Each case first prints the cache-line traffic
it implies (the 64 B lines its source touches, from the plan and the array's address,
against the packed bytes). Also: the
machine's copy roof (``np.copyto`` on a 2 GiB working set, 1 and 2 threads) and, on
more than one rank, a 3D halo exchange against hand-written pack + Sendrecv.

With ``--gpu`` (cupy and a GPU), the faces and the interior of an N^3 cupy array too:
``hpcpar-device`` (the pack kernel into device memory) against ``cupy-contiguous``
(``cupy.ascontiguousarray``, the peer), and ``hpcpar-staged`` (the view's bytes into
pinned host memory, by one 2D copy where the layout allows, as ``hpcpar.send`` moves
them) against ``cupy-get`` (``view.get()``); ``hpcpar-device-unpack`` against cupy's
strided assignment; and the irregular case of 4,096 8 B blocks: ``hpcpar-device`` (one
``block_copy`` launch) against ``cupy-take`` (``cupy.take`` of the doubles at a
precomputed index), and its unpack against ``cupy-put``. Each GPU variant synchronises
the stream in every call.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..plugins import Benchmark, register
from .harness import Row, Variant, format_header, format_row, sweep

__all__: list[str] = []


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--n", type=int, default=128, help="edge of the N^3 float64 array (default 128)"
    )
    parser.add_argument(
        "--no-roof", action="store_true", help="skip the 2 GiB copy-roof measurement"
    )
    parser.add_argument(
        "--gpu",
        action="store_true",
        help="also the GPU cases (cupy arrays: device pack and staging to host vs cupy)",
    )


def _cases(n: int) -> list[tuple[str, Callable[[], tuple[np.ndarray, Any]]]]:
    from mpi4py import MPI

    def face(name: str, slicer: Any, sizes: list[int], subsizes: list[int]) -> tuple[str, Any]:
        def make() -> tuple[np.ndarray, Any]:
            a = np.random.default_rng(0).random((n, n, n))
            dt = MPI.DOUBLE.Create_subarray(sizes, subsizes, [0, 0, 0]).Commit()
            return a, (slicer(a), dt)

        return name, make

    cases = [
        face("x face (contiguous plane)", lambda a: a[0], [n, n, n], [1, n, n]),
        face("y face (rows of N doubles)", lambda a: a[:, 0, :], [n, n, n], [n, 1, n]),
        face("z face (single doubles)", lambda a: a[:, :, 0], [n, n, n], [n, n, 1]),
    ]

    def interior() -> tuple[np.ndarray, Any]:
        a = np.random.default_rng(0).random((n, n, n))
        dt = MPI.DOUBLE.Create_subarray([n, n, n], [n - 2, n - 2, n - 2], [1, 1, 1]).Commit()
        return a, (a[1:-1, 1:-1, 1:-1], dt)

    cases.append(("interior (N-2)^3", interior))
    for block in (8, 64, 512, 4096, 65536):

        def vector(block: int = block) -> tuple[np.ndarray, Any]:
            count = max(1, (16 << 20) // block)
            raw = np.random.default_rng(0).integers(0, 255, 2 * block * count, dtype=np.uint8)
            view = raw.reshape(count, 2 * block)[:, :block]
            dt = MPI.BYTE.Create_vector(count, block, 2 * block).Commit()
            return raw, (view, dt)

        cases.append((f"vector of {block} B blocks, stride {2 * block} B", vector))

    def struct() -> tuple[np.ndarray, Any]:
        record = np.dtype([("a", "i1"), ("b", "f8"), ("c", "i2", (3,))], align=True)
        data = np.zeros(1 << 20, dtype=record)
        data["b"] = 1.5
        dt = MPI.Datatype.Create_struct(
            [1, 1, 3], [0, 8, 16], [MPI.INT8_T, MPI.DOUBLE, MPI.INT16_T]
        )
        element = dt.Create_resized(0, record.itemsize)
        dt.Free()
        every = element.Create_contiguous(data.size).Commit()
        element.Free()
        return data, (data, every)

    cases.append(("struct (i1, f8, 3 x i2; padded to 24 B)", struct))
    for blocks, width in ((4096, 8), (4096, 64), (1 << 17, 8)):

        def scattered(blocks: int = blocks, width: int = width) -> tuple[np.ndarray, Any]:
            rng = np.random.default_rng(0)
            spots = np.sort(rng.choice(4 * blocks, blocks, replace=False)) * width
            raw = rng.random(4 * blocks * width // 8)
            dt = MPI.BYTE.Create_hindexed_block(width, [int(s) for s in spots]).Commit()
            words = width // 8
            index = (spots[:, None] // 8 + np.arange(words)).reshape(-1)
            return raw, (Gather(index), dt)

        cases.append((f"indexed: {blocks} blocks of {width} B at random, 1 in 4", scattered))
    cases += _small_cases()
    return cases


@dataclass(frozen=True)
class Gather:
    """An irregular case's numpy peer: the packed doubles are ``whole[index]``."""

    index: np.ndarray


def _small_cases() -> list[tuple[str, Callable[[], tuple[np.ndarray, Any]]]]:
    """Small messages, where the time per call (latency) is what counts."""
    from mpi4py import MPI

    def vector() -> tuple[np.ndarray, Any]:
        a = np.random.default_rng(0).random(16)
        return a, (a[::2], MPI.DOUBLE.Create_vector(8, 1, 2).Commit())

    def block() -> tuple[np.ndarray, Any]:
        a = np.random.default_rng(0).random((64, 64))
        dt = MPI.DOUBLE.Create_subarray([64, 64], [16, 16], [8, 8]).Commit()
        return a, (a[8:24, 8:24], dt)

    def face() -> tuple[np.ndarray, Any]:
        a = np.random.default_rng(0).random((16, 16, 16))
        dt = MPI.DOUBLE.Create_subarray([16, 16, 16], [16, 16, 1], [0, 0, 0]).Commit()
        return a, (a[:, :, 0], dt)

    return [
        ("small: 8 doubles at stride 2 (64 B)", vector),
        ("small: 16 x 16 block of a 64 x 64 array (2 KiB)", block),
        ("small: z face of a 16^3 block (2 KiB)", face),
    ]


def _variants(comm: Any, whole: np.ndarray, view: np.ndarray, dt: Any) -> list[Variant]:
    """Pack and unpack variants of one case.

    The variants that write a preallocated buffer share it (one packed buffer, one
    unpack target), so that none gains or loses by where its buffer happens to lie in
    memory; each check therefore first clears that buffer and runs its own variant once
    more, then compares with numpy's bytes (MPI's for the struct).
    """
    from mpi4py import MPI

    from ..datatypes import plan

    p = plan(dt)
    base = whole.reshape(-1).view(np.uint8)
    extent = dt.Get_extent()[1]
    gather = view if isinstance(view, Gather) else None
    view_plan = plan(view) if gather is None and view.dtype.fields is None else None
    size = p.size
    out = np.empty(size, np.uint8)
    if view_plan is not None:
        reference = np.ascontiguousarray(view).reshape(-1).view(np.uint8)
    else:
        reference = np.empty(size, np.uint8)
        dt.Pack(base[:extent], reference, 0, MPI.COMM_SELF)

    def into_out(op: Callable[[], Any]) -> tuple[Callable[[], Any], Callable[[], bool]]:
        def check() -> bool:
            out.fill(0)
            op()
            return np.array_equal(out, reference)

        return op, check

    def hp(_: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
        return into_out(lambda: p.pack(base, out=out))

    def mp(_: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
        return into_out(lambda: dt.Pack(base[:extent], out, 0, MPI.COMM_SELF))

    def hpp(_: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
        return into_out(p.packer(base, out))  # the persistent form: Plan.packer

    variants = [Variant("hpcpar-pack", hp), Variant("hpcpar-packer", hpp), Variant("mpi-pack", mp)]
    if gather is not None:  # numpy's way: take the doubles at a precomputed index

        def take(_: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
            words = out.view(whole.dtype)
            return into_out(lambda: np.take(whole, gather.index, out=words))

        variants.append(Variant("numpy", take))
    if view_plan is not None:
        typed = out.view(view.dtype).reshape(view.shape)  # the same bytes, the view's type

        def npy(_: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
            return into_out(lambda: np.copyto(typed, view))

        # into new buffers, as the peer ``np.ascontiguousarray`` does (which
        # returns a contiguous view itself, no copy: then ``view.copy()``)
        def new(_: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
            return (lambda: view_plan.pack(view)), (
                lambda: np.array_equal(view_plan.pack(view), reference)
            )

        def new_numpy(_: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
            fresh = view.copy if view.flags.c_contiguous else (lambda: np.ascontiguousarray(view))
            return fresh, (lambda: np.array_equal(fresh().reshape(-1).view(np.uint8), reference))

        variants += [Variant("numpy", npy), Variant("hpcpar-pack-new", new),
                     Variant("numpy-ascontiguousarray", new_numpy)]  # fmt: skip
    packed = reference.copy()
    scratch = np.zeros_like(base)

    def into_scratch(op: Callable[[], Any]) -> tuple[Callable[[], Any], Callable[[], bool]]:
        def check() -> bool:
            scratch.fill(0)
            op()
            return np.array_equal(p.pack(scratch), packed)

        return op, check

    def hu(_: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
        return into_scratch(lambda: p.unpack(packed, scratch))

    def mu(_: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
        return into_scratch(lambda: dt.Unpack(packed, 0, scratch[:extent], MPI.COMM_SELF))

    def huu(_: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
        return into_scratch(p.unpacker(packed, scratch))  # the persistent form

    unpacks = [Variant("hpcpar-unpack", hu), Variant("hpcpar-unpacker", huu)]
    return [*variants, *unpacks, Variant("mpi-unpack", mu)]


def _roof() -> list[tuple[int, float]]:
    src, dst = np.ones(1 << 27), np.empty(1 << 27)  # 1 GiB each: a 2 GiB working set
    out = []
    for threads in (1, 2):
        parts = np.array_split(np.arange(src.size), threads)
        bounds = [(int(x[0]), int(x[-1]) + 1) for x in parts]

        def copy(b: tuple[int, int]) -> None:
            np.copyto(dst[b[0] : b[1]], src[b[0] : b[1]])

        best = float("inf")
        with ThreadPoolExecutor(threads) as pool:
            for _ in range(3):
                start = time.perf_counter()
                list(pool.map(copy, bounds))
                best = min(best, time.perf_counter() - start)
        out.append((threads, src.nbytes / best / 1e9))
    return out


def _halo_variants(comm: Any, n: int) -> list[Variant]:
    from mpi4py import MPI

    from ..halo import HaloExchange

    dims = MPI.Compute_dims(comm.Get_size(), 3)
    cart = comm.Create_cart(dims, periods=[True] * 3)
    local = (n, n, n)
    halo = HaloExchange(cart, local, 1, np.float64)
    a = np.random.default_rng(cart.Get_rank()).random(halo.shape)
    b = a.copy()

    def ours(_: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
        return (lambda: halo.exchange(a)), (lambda: True)

    def handwritten(_: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
        def run() -> None:
            for d in range(3):
                low, high = cart.Shift(d, 1)
                for side, to, frm in ((1, low, high), (-1, high, low)):
                    send = [slice(None)] * 3
                    recv = [slice(None)] * 3
                    send[d] = slice(1, 2) if side == 1 else slice(n, n + 1)
                    recv[d] = slice(n + 1, n + 2) if side == 1 else slice(0, 1)
                    out = np.ascontiguousarray(b[tuple(send)])
                    inb = np.empty_like(out)
                    cart.Sendrecv(out, to, d, inb, frm, d)
                    b[tuple(recv)] = inb

        return run, (lambda: np.array_equal(a, b))

    return [Variant("hpcpar-halo", ours), Variant("pack+Sendrecv", handwritten)]


def _send_cases(n: int) -> list[tuple[str, Callable[[], tuple[np.ndarray, Any]]]]:
    """Faces and interior of the N^3 array, 16 MB of 8 and 64 B blocks, the small vector."""
    names = ("x face", "y face", "z face", "interior", "vector of 8 B", "vector of 64 B",
             "small: 8 doubles")  # fmt: skip
    return [c for c in _cases(n) if c[0].startswith(names)]


def _send_variants(comm: Any, whole: np.ndarray, view: np.ndarray, dt: Any) -> list[Variant]:
    """A round trip of ``view`` between ranks 2k and 2k+1 (a last odd rank waits).

    ``hpcpar-send`` sends the view (``method="auto"``), ``hpcpar-send-datatype`` the
    whole array with ``datatype=dt``, ``hpcpar-send-persistent`` the view through
    ``send_init``/``recv_init`` (made once, started each trip); the peers:
    ``mpi-datatype`` (``comm.Send`` and ``Recv`` of ``[whole, 1, dt]``: the library
    walks the derived datatype) and ``numpy+Send`` (``ascontiguousarray``, ``Send``;
    ``Recv`` into a new buffer, then assigned into the view), as hand-written code would.
    """
    import hpcpar

    rank, size = comm.Get_rank(), comm.Get_size()
    partner = rank ^ 1 if (rank ^ 1) < size else None
    first = rank % 2 == 0
    back = np.zeros_like(whole)  # where the partner's data lands, the same view of it
    offset = view.__array_interface__["data"][0] - whole.__array_interface__["data"][0]
    into = np.ndarray(view.shape, view.dtype, buffer=back, offset=offset, strides=view.strides)
    sent = view

    def trip(send: Callable[[], Any], recv: Callable[[], Any]) -> Callable[[], Any]:
        if partner is None:
            return lambda: None
        if first:
            return lambda: (send(), recv())
        return lambda: (recv(), send())

    def check() -> bool:
        return partner is None or np.array_equal(into, sent)

    def ours(_: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
        return trip(lambda: hpcpar.send(sent, partner, comm=comm),
                    lambda: hpcpar.recv(into, partner, comm=comm)), check  # fmt: skip

    def ours_typed(_: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
        return trip(lambda: hpcpar.send(whole, partner, comm=comm, datatype=dt),
                    lambda: hpcpar.recv(back, partner, comm=comm, datatype=dt)), check  # fmt: skip

    def persistent(_: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
        if partner is None:
            return (lambda: None), check
        out = hpcpar.send_init(sent, partner, 1, comm=comm)
        back_in = hpcpar.recv_init(into, partner, 1, comm=comm)
        _PERSISTENT.extend((out, back_in))
        return trip(lambda: (out.start(), out.wait()),
                    lambda: (back_in.start(), back_in.wait())), check  # fmt: skip

    def library(_: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
        return trip(lambda: comm.Send([whole, 1, dt], partner),
                    lambda: comm.Recv([back, 1, dt], partner)), check  # fmt: skip

    def handwritten(_: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
        def recv() -> None:
            buf = np.empty(sent.shape, sent.dtype)
            comm.Recv(buf, partner)
            into[...] = buf

        return trip(lambda: comm.Send(np.ascontiguousarray(sent), partner), recv), check

    return [Variant("hpcpar-send", ours), Variant("hpcpar-send-datatype", ours_typed),
            Variant("hpcpar-send-persistent", persistent), Variant("mpi-datatype", library),
            Variant("numpy+Send", handwritten)]  # fmt: skip


_PERSISTENT: list[Any] = []  # the persistent requests a send case made, freed after it


LINE = 64  # bytes in a cache line


def lines_read(kernels: list[Any], address: int) -> int:
    """Cache lines the source side of ``kernels`` touches, with the origin at ``address``.

    Every block's first to last line, the union over all blocks (a line two blocks share
    counts once): what a pack must read from memory at the least.
    """
    from ..datatypes.blocks import expand

    starts, _, lengths = expand(kernels)
    if not starts.size:
        return 0
    first, last = (address + starts) // LINE, (address + starts + lengths - 1) // LINE
    order = np.argsort(first, kind="stable")
    first, last = first[order], last[order]
    covered = np.concatenate(([np.iinfo(np.int64).min + 1], np.maximum.accumulate(last)[:-1]))
    return int(np.maximum(0, last - np.maximum(first, covered + 1) + 1).sum())


def _traffic(p: Any, base: np.ndarray) -> dict[str, Any]:
    """The cache-line traffic a case implies: lines read, and their bytes over the packed."""
    lines = lines_read(p._kernels(1), base.ctypes.data)
    return {"lines_read": lines, "read_per_packed": lines * LINE / max(1, p.size)}


def _case(
    comm: Any,
    args: argparse.Namespace,
    say: Callable[..., Any],
    case: tuple[str, str],
    variants: list[Variant],
    size: int,
    peer: str,
    traffic: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Sweep one case's variants at one size; print and return its rows."""
    title, name = case
    say(f"# case: {title}")
    if traffic is not None:
        say(f"#   reads {traffic['lines_read']:,} cache lines of {LINE} B for {size:,} B packed: "
            f"{traffic['read_per_packed']:.2f}x the packed bytes")  # fmt: skip
    say(format_header())
    rows = sweep(comm, variants, [size], peer=peer, repeats=args.repeats, warmup=args.warmup,
                 min_time=args.min_time, max_iterations=args.max_iterations)  # fmt: skip
    for m in rows:
        say(format_row(m))
    return [{**m.as_dict(), "case": name, **(traffic or {})} for m in rows]


def _run(comm: Any, args: argparse.Namespace) -> list[Any]:
    from ..datatypes import plan
    from ..errors import UsageError
    from ..runtime.results import mpi_library

    if args.n < 4:
        raise UsageError(f"bench datatypes: --n must be at least 4, not {args.n}")
    if args.gpu:
        from ..datatypes.gpu import gpu_available

        if not comm.allreduce(gpu_available(), op=min):
            raise UsageError("bench datatypes --gpu: needs cupy and a GPU on every rank")
    rank = comm.Get_rank()
    say = print if rank == 0 else (lambda *a, **k: None)
    say(
        f"# hpcpar bench datatypes: N={args.n}, {comm.Get_size()} rank(s); {mpi_library()}; "
        f"peer: mpi-pack; {args.repeats} repeats, median; GB/s = packed bytes / time"
    )
    if not args.no_roof and rank == 0:
        for threads, rate in _roof():
            say(f"# copy roof: np.copyto, 2 GiB working set, {threads} thread(s): {rate:.2f} GB/s")
    results = []
    for name, make in _cases(args.n):
        whole, (view, dt) = make()
        variants = _variants(comm, whole, view, dt)
        traffic = _traffic(plan(dt), whole.reshape(-1).view(np.uint8))
        results += _case(comm, args, say, (name, name), variants, dt.Get_size(), "mpi-pack",
                         traffic)  # fmt: skip
        dt.Free()
    if args.gpu:
        from .datatypes_gpu import gpu_cases  # cupy's, only with --gpu

        results += gpu_cases(comm, args, say)
    if comm.Get_size() > 1:
        title = f"3D halo exchange, {args.n}^3 per rank, width 1, periodic (peer: pack+Sendrecv)"
        size = 6 * args.n * args.n * 8
        variants = _halo_variants(comm, args.n)
        results += _case(comm, args, say, (title, "halo"), variants, size, "pack+Sendrecv")
        for name, make in _send_cases(args.n):
            whole, (view, dt) = make()
            title = f"send round trip, ranks 2k <-> 2k+1: {name} (peer: mpi-datatype)"
            variants = _send_variants(comm, whole, view, dt)
            results += _case(comm, args, say, (title, f"send: {name}"), variants,
                             dt.Get_size(), "mpi-datatype")  # fmt: skip
            dt.Free()
            while _PERSISTENT:
                _PERSISTENT.pop().free()
    return [Row(r) for r in results]


register(
    Benchmark(
        "datatypes",
        "pack/unpack GB/s of plans vs MPI Pack and numpy; copy roof; halo",
        _add_arguments,
        _run,
        peer="mpi-pack",
    )
)
