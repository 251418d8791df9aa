"""Buffers above 2 GiB (counts past a C int) and GPU buffers."""

from __future__ import annotations

import os

import numpy as np
import pytest
from mpi4py import MPI

import hpcpar
from hpcpar.testing import assert_all

pytestmark = pytest.mark.mpi
BIG = (1 << 31) + 24  # bytes: more than INT_MAX


def _available_gib() -> float:
    try:
        with open("/proc/meminfo") as handle:
            info = dict(line.split(":", 1) for line in handle)
        return int(info["MemAvailable"].split()[0]) / 2**20
    except (OSError, KeyError, ValueError):
        return 0.0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bcast_and_allreduce_above_2_gib(comm):
    # About 5 GiB per rank; run where the memory is (the 2-rank job in CI).
    size = comm.Get_size()
    enough = comm.allreduce(_available_gib() > 6.0 * size, op=MPI.LAND)
    if size != 2 or not enough:
        pytest.skip("needs exactly 2 ranks and 12 GiB free (runs in the 2-rank job)")
    rank = comm.Get_rank()
    x = np.full(BIG, 3, dtype=np.uint8) if rank == 0 else np.zeros(BIG, np.uint8)
    x[-1] = 7 if rank == 0 else 0
    hpcpar.bcast(x, 0, algorithm="binomial")
    ok_bcast = x[0] == 3 and x[BIG // 2] == 3 and x[-1] == 7
    y = np.zeros(BIG, np.uint8)
    y[-1] = 1 << rank
    y[0] = 4 << rank
    hpcpar.allreduce(y, MPI.BOR, out=y, algorithm="ring")
    ok_reduce = y[-1] == 3 and y[0] == 12 and y[BIG // 2] == 0
    del x, y
    assert_all(bool(ok_bcast and ok_reduce), "collectives on buffers above 2 GiB", comm)


def _gpu() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no cupy, no driver or no device
        return False


@pytest.mark.skipif(
    not _gpu() or os.environ.get("HPCPAR_NO_GPU") == "1", reason="needs cupy and a GPU"
)
def test_cupy_buffers_are_staged_through_the_host(comm):
    import cupy

    rank, size = comm.Get_rank(), comm.Get_size()
    x = cupy.arange(1000, dtype=cupy.float64) + rank
    for algorithm in ("mpi", "ring", "two_level"):
        got = hpcpar.allreduce(x, algorithm=algorithm)
        want = np.arange(1000.0) * size + size * (size - 1) / 2
        assert_all(
            isinstance(got, cupy.ndarray) and np.array_equal(cupy.asnumpy(got), want),
            algorithm,
            comm,
        )
    out = cupy.empty_like(x)
    hpcpar.allreduce(x, out=out)
    assert_all(np.array_equal(cupy.asnumpy(out), cupy.asnumpy(got)), "cupy out=", comm)
