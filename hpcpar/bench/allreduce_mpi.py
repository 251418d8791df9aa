"""``hpcpar bench allreduce-mpi``: the MPI library's Allreduce vs mpi4py's pickle allreduce."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ..plugins import Benchmark, register
from .harness import Variant, run_sweep

__all__: list[str] = []


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", default="float64", help="element type (default float64)")


def _data(comm: Any, nbytes: int, dtype: Any) -> tuple[Any, Any]:
    import numpy as np

    count = nbytes // dtype.itemsize
    rank, size = comm.Get_rank(), comm.Get_size()
    pattern = np.arange(count) % 97
    x = (pattern + rank).astype(dtype)
    # sum over ranks of (pattern + r) = size*pattern + size*(size-1)/2, exact in any dtype
    expected = (size * pattern + size * (size - 1) // 2).astype(dtype)
    return x, expected


def _variants(comm: Any, dtype: Any) -> list[Variant]:
    import numpy as np
    from mpi4py import MPI

    def buffer_allreduce(nbytes: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
        x, expected = _data(comm, nbytes, dtype)
        out = np.empty_like(x)
        return (lambda: comm.Allreduce(x, out, op=MPI.SUM)), (lambda: np.array_equal(out, expected))

    def pickle_allreduce(nbytes: int) -> tuple[Callable[[], Any], Callable[[], bool]]:
        x, expected = _data(comm, nbytes, dtype)
        box: list[Any] = [None]

        def op() -> None:
            box[0] = comm.allreduce(x, op=MPI.SUM)

        return op, lambda: box[0] is not None and np.array_equal(box[0], expected)

    return [Variant("mpi", buffer_allreduce), Variant("mpi4py-pickle", pickle_allreduce)]


def _run(comm: Any, args: argparse.Namespace) -> list[Any]:
    import numpy as np

    from ..errors import UsageError

    try:
        dtype = np.dtype(args.dtype)
    except TypeError:
        raise UsageError(f"bench allreduce-mpi: unknown --dtype {args.dtype!r}") from None
    return run_sweep(
        comm,
        args,
        _variants(comm, dtype),
        title=f"allreduce-mpi ({dtype.name}, SUM)",
        unit=dtype.itemsize,
    )


def _allreduce_bus_factor(ranks: int) -> float:
    # NCCL's convention: an allreduce moves 2(n-1)/n of the buffer over each link.
    return 2.0 * (ranks - 1) / ranks if ranks > 1 else 1.0


register(
    Benchmark(
        "allreduce-mpi",
        "MPI library Allreduce vs mpi4py pickle allreduce, 8 B - 64 MiB",
        _add_arguments,
        _run,
        peer="mpi",
        bus_factor=_allreduce_bus_factor,
    )
)
