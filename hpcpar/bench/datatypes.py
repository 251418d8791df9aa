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
from typing import Any

import numpy as np

from ..cli.common import integer
from ..plugins import Benchmark, register
from .datatype_cases import Gather, cases, measure_case, traffic_of
from .harness import Row, Variant

__all__: list[str] = []


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--n",
        type=integer(4, 4096),
        default=128,
        help="edge of the N^3 float64 array (default 128)",
    )
    parser.add_argument(
        "--large",
        default="16MiB",
        metavar="SIZE",
        help="bytes each vector case packs; the largest indexed case has SIZE/128 blocks "
        "(default 16MiB)",
    )
    parser.add_argument(
        "--no-roof", action="store_true", help="skip the 2 GiB copy-roof measurement"
    )
    parser.add_argument(
        "--gpu",
        action="store_true",
        help="also the GPU cases (cupy arrays: device pack and staging to host vs cupy)",
    )


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

        variants += [
            Variant("numpy", npy),
            Variant("hpcpar-pack-new", new),
            Variant("numpy-ascontiguousarray", new_numpy),
        ]
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


def _send_cases(n: int, large: int) -> list[tuple[str, Callable[[], tuple[np.ndarray, Any]]]]:
    """Faces and interior of the N^3 array, 16 MB of 8 and 64 B blocks, the small vector."""
    names = (
        "x face",
        "y face",
        "z face",
        "interior",
        "vector of 8 B",
        "vector of 64 B",
        "small: 8 doubles",
    )
    return [c for c in cases(n, large) if c[0].startswith(names)]


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
        return trip(
            lambda: hpcpar.send(sent, partner, comm=comm),
            lambda: hpcpar.recv(into, partner, comm=comm),
        ), check

    def ours_typed(_: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
        return trip(
            lambda: hpcpar.send(whole, partner, comm=comm, datatype=dt),
            lambda: hpcpar.recv(back, partner, comm=comm, datatype=dt),
        ), check

    def persistent(_: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
        if partner is None:
            return (lambda: None), check
        out = hpcpar.send_init(sent, partner, 1, comm=comm)
        back_in = hpcpar.recv_init(into, partner, 1, comm=comm)
        _PERSISTENT.extend((out, back_in))
        return trip(
            lambda: (out.start(), out.wait()), lambda: (back_in.start(), back_in.wait())
        ), check

    def library(_: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
        return trip(
            lambda: comm.Send([whole, 1, dt], partner), lambda: comm.Recv([back, 1, dt], partner)
        ), check

    def handwritten(_: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
        def recv() -> None:
            buf = np.empty(sent.shape, sent.dtype)
            comm.Recv(buf, partner)
            into[...] = buf

        return trip(lambda: comm.Send(np.ascontiguousarray(sent), partner), recv), check

    return [
        Variant("hpcpar-send", ours),
        Variant("hpcpar-send-datatype", ours_typed),
        Variant("hpcpar-send-persistent", persistent),
        Variant("mpi-datatype", library),
        Variant("numpy+Send", handwritten),
    ]


_PERSISTENT: list[Any] = []  # the persistent requests a send case made, freed after it


def _run(comm: Any, args: argparse.Namespace) -> list[Any]:
    from ..datatypes import plan
    from ..errors import UsageError
    from ..runtime.results import mpi_library
    from ..runtime.units import parse_size

    if args.n < 4:
        raise UsageError(f"bench datatypes: --n must be at least 4, not {args.n}")
    if isinstance(args.large, str):
        args.large = parse_size(args.large)
    if args.large < 4096:
        raise UsageError(f"bench datatypes: --large must be at least 4KiB, not {args.large} B")
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
    for name, make in cases(args.n, args.large):
        whole, (view, dt) = make()
        variants = _variants(comm, whole, view, dt)
        traffic = traffic_of(plan(dt), whole.reshape(-1).view(np.uint8))
        results += measure_case(
            comm, args, say, (name, name), variants, dt.Get_size(), "mpi-pack", traffic
        )
        dt.Free()
    if args.gpu:
        from .datatypes_gpu import gpu_cases  # cupy's, only with --gpu

        results += gpu_cases(comm, args, say)
    if comm.Get_size() > 1:
        title = f"3D halo exchange, {args.n}^3 per rank, width 1, periodic (peer: pack+Sendrecv)"
        size = 6 * args.n * args.n * 8
        variants = _halo_variants(comm, args.n)
        results += measure_case(comm, args, say, (title, "halo"), variants, size, "pack+Sendrecv")
        for name, make in _send_cases(args.n, args.large):
            whole, (view, dt) = make()
            title = f"send round trip, ranks 2k <-> 2k+1: {name} (peer: mpi-datatype)"
            variants = _send_variants(comm, whole, view, dt)
            results += measure_case(
                comm, args, say, (title, f"send: {name}"), variants, dt.Get_size(), "mpi-datatype"
            )
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
