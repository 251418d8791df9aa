"""``hpcpar bench collectives``: every algorithm of a collective vs the MPI library's call.

Peers in the same run: the MPI library's own collective called directly on the same
communicator (``mpi-direct``, the baseline every ratio is taken against; ``mpi`` is the
same call through hpcpar, so the two differ by hpcpar's Python overhead; ``auto`` is
the cost model's choice and, for allreduce, ``autotune`` the same after timing the
model's best candidates on its first call, ``auto-persistent`` auto chosen once by
``hpcpar.allreduce_init`` and ``mpi-persistent`` the library's ``MPI_Allreduce_init``
started and waited) and, where
PyTorch is installed, ``torch.distributed`` with the gloo backend (the CPU peer a Python
user would pick; ``--no-gloo`` leaves it out).
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import Callable
from typing import Any

import numpy as np

from ..cli.common import integer, real
from ..plugins import Benchmark, register
from .harness import Variant, run_sweep
from .on_vcluster import add_vcluster_arguments, run_on_vcluster

__all__: list[str] = []

_COLLECTIVES = ("allreduce", "bcast", "allgather", "reduce_scatter", "alltoall", "reduce")


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--collective", choices=_COLLECTIVES, default="allreduce", help="default allreduce"
    )
    parser.add_argument(
        "--algorithms",
        default=None,
        metavar="A,B",
        help="algorithms to run (default: all, plus auto)",
    )
    parser.add_argument("--no-gloo", action="store_true", help="leave torch.distributed/gloo out")
    parser.add_argument(
        "--profile",
        default=None,
        metavar="FILE",
        help="add the cost model's prediction for each variant (a calibrated profile)",
    )
    parser.add_argument(
        "--compression",
        default=None,
        metavar="S,T",
        help="allreduce of float32 with these compression schemes (fp16, bf16, int8, 1bit, "
        "auto) against the exact auto",
    )
    parser.add_argument(
        "--tolerance",
        type=real(0, above=True),
        default=0.01,
        help="with --compression auto: the largest error bound to accept (default 0.01)",
    )
    parser.add_argument(
        "--block",
        type=integer(1, 1 << 30),
        default=None,
        help="with --compression: elements per block",
    )
    add_vcluster_arguments(parser)


def _compressed_case(comm: Any, h: Any, scheme: str | None, args: Any) -> Callable[[int], Any]:
    """A float32 allreduce coded with ``scheme`` (None: exact ``auto``), checked to its bound."""
    import hpcpar
    from hpcpar.collectives.compression import DEFAULT_BLOCK, Compression, codec_for

    p, r = comm.Get_size(), comm.Get_rank()
    block = args.block or DEFAULT_BLOCK
    spec = None if scheme is None else Compression(scheme, block)
    tolerance = args.tolerance if scheme == "auto" else None
    nodes = h.n_nodes
    if scheme is None or nodes == 1:
        bound = 0.0
    elif scheme == "auto":
        bound = args.tolerance
    else:
        bound = codec_for(scheme, block).bound(nodes)
    scale = sum(250.0 + q for q in range(p))  # the ranks' largest magnitudes summed

    def make(nbytes: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
        count = nbytes // 4
        base = (np.arange(count) % 251).astype(np.float32)
        x = base + np.float32(r)
        out = np.empty_like(x)
        want = p * base + np.float32(p * (p - 1) / 2)

        def run() -> None:
            hpcpar.allreduce(x, out=out, comm=h, compression=spec, tolerance=tolerance)

        def check() -> bool:
            return bool(np.all(np.abs(out - want) <= bound * scale))

        return run, check

    return make


def _direct_float32_case(comm: Any, h: Any) -> Callable[[int], Any]:
    from mpi4py import MPI

    p, r = comm.Get_size(), comm.Get_rank()

    def make(nbytes: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
        base = (np.arange(nbytes // 4) % 251).astype(np.float32)
        x, out = base + np.float32(r), np.empty(nbytes // 4, np.float32)
        want = p * base + np.float32(p * (p - 1) / 2)
        return (lambda: h.comm.Allreduce(x, out, op=MPI.SUM)), (lambda: np.array_equal(out, want))

    return make


def _compressed_sweep(comm: Any, h: Any, args: argparse.Namespace) -> list[Any]:
    from ..collectives.compression import SCHEMES
    from ..errors import UsageError

    if args.collective != "allreduce":
        raise UsageError("bench collectives: --compression applies to --collective allreduce")
    schemes = [s.strip() for s in args.compression.split(",") if s.strip()]
    unknown = sorted(set(schemes) - {*SCHEMES, "auto"})
    if unknown or not schemes:
        raise UsageError(
            f"bench collectives: unknown compression {unknown or schemes}; "
            f"choose from {', '.join([*SCHEMES, 'auto'])}"
        )
    variants = [
        Variant("mpi-direct", _direct_float32_case(comm, h)),
        Variant("exact-auto", _compressed_case(comm, h, None, args)),
    ]
    variants += [Variant(s, _compressed_case(comm, h, s, args)) for s in schemes]
    title = f"collectives allreduce (float32, compressed across {h.n_nodes} node(s))"
    return run_sweep(comm, args, variants, title=title, unit=4, peer="exact-auto")


def _hpcpar_case(comm: Any, h: Any, collective: str, algorithm: str) -> Callable[[int], Any]:
    import hpcpar

    p, r = comm.Get_size(), comm.Get_rank()

    def make(nbytes: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
        count = nbytes // 8
        base = np.arange(count, dtype=np.float64) % 251
        x = base + r
        if collective == "allreduce":
            out = np.empty_like(x)
            want = p * base + p * (p - 1) / 2
            return _allreduce_run(h, algorithm, x, out), (lambda: np.array_equal(out, want))
        if collective == "reduce":
            out = np.empty_like(x)
            want = p * base + p * (p - 1) / 2
            return (lambda: hpcpar.reduce(x, 0, out=out, comm=h, algorithm=algorithm)), (
                lambda: r != 0 or np.array_equal(out, want)
            )
        if collective == "bcast":
            buf = base.copy() if r == 0 else np.zeros(count)
            return (lambda: hpcpar.bcast(buf, 0, comm=h, algorithm=algorithm)), (
                lambda: np.array_equal(buf, base)
            )
        if collective == "allgather":
            out = np.empty((p, count))
            want = np.stack([base + q for q in range(p)])
            return (lambda: hpcpar.allgather(x, out=out, comm=h, algorithm=algorithm)), (
                lambda: np.array_equal(out, want)
            )
        if collective == "reduce_scatter":
            full = np.tile(x, p)[: max(count, p)]
            want_full = np.tile(p * base + p * (p - 1) / 2, p)[: full.size]
            sizes = [full.size // p + (1 if q < full.size % p else 0) for q in range(p)]
            start = sum(sizes[:r])
            box: list[Any] = [None]

            def run() -> None:
                box[0] = hpcpar.reduce_scatter(full, comm=h, algorithm=algorithm)

            return run, lambda: np.array_equal(box[0], want_full[start : start + sizes[r]])
        # alltoall: nbytes is each rank's whole send buffer
        per = max(1, count // p)
        send = np.repeat(np.arange(p, dtype=np.float64) + 100 * r, per)
        out = np.empty_like(send)
        want = np.repeat(np.arange(p, dtype=np.float64) * 100 + r, per)
        return (lambda: hpcpar.alltoall(send, out=out, comm=h, algorithm=algorithm)), (
            lambda: np.array_equal(out, want)
        )

    return make


_KEEP: list[Any] = []  # persistent requests of the run: alive until MPI finalizes


def _allreduce_run(h: Any, algorithm: str, x: np.ndarray, out: np.ndarray) -> Callable[[], Any]:
    import hpcpar

    if algorithm == "auto-persistent":  # auto chosen once, bound to the buffers
        call = hpcpar.allreduce_init(x, out=out, comm=h)
        _KEEP.append(call)
        return call
    tune = algorithm == "autotune"  # auto, timing its candidates on the first call
    name = "auto" if tune else algorithm
    return lambda: hpcpar.allreduce(x, out=out, comm=h, algorithm=name, autotune=tune)


def _persistent_direct_case(comm: Any, h: Any) -> Callable[[int], Any]:
    """The library's persistent allreduce (``MPI_Allreduce_init``), started and waited."""
    from mpi4py import MPI

    p, r = comm.Get_size(), comm.Get_rank()

    def make(nbytes: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
        base = np.arange(nbytes // 8, dtype=np.float64) % 251
        x, out = base + r, np.empty(nbytes // 8)
        request = h.comm.Allreduce_init(x, out, MPI.SUM)
        _KEEP.append((request, x, out))

        def run() -> None:
            request.Start()
            request.Wait()

        return run, (lambda: np.array_equal(out, p * base + p * (p - 1) / 2))

    return make


def _direct_case(comm: Any, h: Any, collective: str) -> Callable[[int], Any] | None:
    """The MPI library's own call on the same communicator, with no hpcpar code around it."""
    from mpi4py import MPI

    private = h.comm
    p, r = comm.Get_size(), comm.Get_rank()

    def make(nbytes: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
        count = nbytes // 8
        base = np.arange(count, dtype=np.float64) % 251
        x = base + r
        total = p * base + p * (p - 1) / 2
        if collective == "allreduce":
            out = np.empty_like(x)
            return (lambda: private.Allreduce(x, out, op=MPI.SUM)), (
                lambda: np.array_equal(out, total)
            )
        if collective == "reduce":
            out = np.empty_like(x)
            return (lambda: private.Reduce(x, out, op=MPI.SUM, root=0)), (
                lambda: r != 0 or np.array_equal(out, total)
            )
        if collective == "bcast":
            buf = base.copy() if r == 0 else np.zeros(count)
            return (lambda: private.Bcast(buf, 0)), (lambda: np.array_equal(buf, base))
        if collective == "allgather":
            out = np.empty((p, count))
            want = np.stack([base + q for q in range(p)])
            return (lambda: private.Allgather(x, out)), (lambda: np.array_equal(out, want))
        if collective == "reduce_scatter":
            full = np.tile(x, p)[: max(count, p)]
            sizes = [full.size // p + (1 if q < full.size % p else 0) for q in range(p)]
            want = np.tile(total, p)[: full.size][sum(sizes[:r]) : sum(sizes[: r + 1])]
            block = np.empty(sizes[r])
            return (lambda: private.Reduce_scatter(full, block, sizes, op=MPI.SUM)), (
                lambda: np.array_equal(block, want)
            )
        per = max(1, count // p)
        send = np.repeat(np.arange(p, dtype=np.float64) + 100 * r, per)
        out = np.empty_like(send)
        want = np.repeat(np.arange(p, dtype=np.float64) * 100 + r, per)
        return (lambda: private.Alltoall(send, out)), (lambda: np.array_equal(out, want))

    return make


def _gloo_case(comm: Any, collective: str) -> Callable[[int], Any] | None:
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return None
    if collective not in ("allreduce", "bcast", "allgather"):
        return None
    p, r = comm.Get_size(), comm.Get_rank()
    if not dist.is_initialized():
        port = None
        if r == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        port = comm.bcast(port, root=0)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=r, world_size=p)

    def make(nbytes: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
        count = nbytes // 8
        base = torch.arange(count, dtype=torch.float64) % 251
        x = base + r
        if collective == "allreduce":
            # gloo reduces in place: time on a scratch copy, validate on fresh data
            scratch = x.clone()

            def check() -> bool:
                fresh = x.clone()
                dist.all_reduce(fresh)
                return bool(torch.equal(fresh, p * base + p * (p - 1) / 2))

            return (lambda: dist.all_reduce(scratch)), check
        if collective == "bcast":
            buf = base.clone() if r == 0 else torch.zeros(count, dtype=torch.float64)
            return (lambda: dist.broadcast(buf, 0)), (lambda: bool(torch.equal(buf, base)))
        outs = [torch.empty(count, dtype=torch.float64) for _ in range(p)]
        return (lambda: dist.all_gather(outs, x)), (
            lambda: all(bool(torch.equal(outs[q], base + q)) for q in range(p))
        )

    return make


def _run(comm: Any, args: argparse.Namespace) -> list[Any]:
    import hpcpar
    from hpcpar.collectives import algorithms_for

    from ..errors import UsageError

    if args.vcluster:
        return run_on_vcluster(comm, args)
    h = hpcpar.Hierarchy(comm, layout=args.layout)
    if args.compression:
        try:
            return _compressed_sweep(comm, h, args)
        finally:
            h.free()
    tune = ["auto-persistent", "autotune"] if args.collective == "allreduce" else []
    names = ["mpi", "auto", *tune, *[a for a in algorithms_for(args.collective) if a != "mpi"]]
    if args.algorithms:
        wanted = [a.strip() for a in args.algorithms.split(",") if a.strip()]
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            raise UsageError(
                f"bench collectives: unknown algorithm(s) {unknown}; choose from {names}"
            )
        names = ["mpi", *[a for a in wanted if a != "mpi"]]
    variants = [Variant("mpi-direct", _direct_case(comm, h, args.collective))]
    if args.collective == "allreduce":
        variants.append(Variant("mpi-persistent", _persistent_direct_case(comm, h)))
    variants += [Variant(name, _hpcpar_case(comm, h, args.collective, name)) for name in names]
    gloo = None if args.no_gloo else _gloo_case(comm, args.collective)
    if gloo is not None:
        variants.append(Variant("torch-gloo", gloo))
    predict = _predictor(args, h) if args.profile else None
    title = f"collectives {args.collective} (float64)"
    try:
        return run_sweep(comm, args, variants, title=title, unit=8, predict=predict)
    finally:
        h.free()


def _predictor(args: argparse.Namespace, h: Any) -> Callable[[str, int], float | None]:
    """The cost model's time for a variant at a size, in microseconds."""
    from ..collectives.cost.explain import plan_for
    from ..collectives.tally import Layout
    from ..runtime.profile import load_profile

    profile = load_profile(args.profile)
    layout = Layout(tuple(h.node_of))

    def predict(variant: str, nbytes: int) -> float | None:
        if variant in ("torch-gloo", "autotune"):
            return None
        plan = plan_for(args.collective, nbytes, layout, profile)
        wanted = {
            "mpi-direct": "mpi",
            "mpi-persistent": "mpi",
            "auto": plan.algorithm,
            "auto-persistent": plan.algorithm,
        }.get(variant, variant)
        found = next((p for p in plan.ranking if p.algorithm == wanted), None)
        return None if found is None else found.seconds * 1e6

    return predict


def _bus_factor(ranks: int) -> float:
    return 2.0 * (ranks - 1) / ranks if ranks > 1 else 1.0


register(
    Benchmark(
        "collectives",
        "every algorithm of a collective vs the MPI library (and gloo)",
        _add_arguments,
        _run,
        peer="mpi-direct",
        bus_factor=_bus_factor,
    )
)
