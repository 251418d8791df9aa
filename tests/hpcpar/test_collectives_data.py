"""bcast, allgather, alltoall(v) and barrier: every algorithm x size x layout vs numpy."""

from __future__ import annotations

import numpy as np
import pytest
from collective_cases import contribution
from mpi4py import MPI

import hpcpar
from hpcpar.collectives import algorithms_for
from hpcpar.testing import assert_all, layouts_for

pytestmark = pytest.mark.mpi
SIZE = MPI.COMM_WORLD.Get_size()
LAYOUTS = [
    lay
    for lay in layouts_for(SIZE)
    if lay in (None, "ppn:2", "nodes:2,1", "nodes:1,3", "roundrobin:2")
]
COUNTS = [0, 1, 13, 2**20 // 8 * 3]
DTYPES = ["f8", "c16", "?", "u1", [("a", "i4"), ("b", "f8")]]


def data(rank, n, dtype):
    dtype = np.dtype(dtype)
    if dtype.fields:
        out = np.zeros(n, dtype)
        out["a"] = contribution(rank, n, "i4")
        out["b"] = contribution(rank, n, "f8")
        return out
    return contribution(rank, n, dtype)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("algorithm", algorithms_for("bcast"))
def test_bcast(comm, layout, algorithm):
    h = hpcpar.Hierarchy(comm, layout=layout)
    rank, size = comm.Get_rank(), comm.Get_size()
    failures = []
    for root in sorted({0, size - 1, size // 2}):
        for n in COUNTS:
            for dtype in DTYPES if n < 100 else DTYPES[:1]:
                x = data(root, n, dtype) if rank == root else np.zeros(n, dtype)
                got = hpcpar.bcast(x, root, comm=h, algorithm=algorithm)
                if not (got is x and np.array_equal(got, data(root, n, dtype))):
                    failures.append((root, n, str(dtype)))
    assert_all(not failures, f"bcast {algorithm} on {layout}: {failures}", comm)
    h.free()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("algorithm", algorithms_for("allgather"))
def test_allgather(comm, layout, algorithm):
    h = hpcpar.Hierarchy(comm, layout=layout)
    rank, size = comm.Get_rank(), comm.Get_size()
    failures = []
    for n in COUNTS:
        for dtype in DTYPES if n < 100 else DTYPES[:1]:
            got = hpcpar.allgather(data(rank, n, dtype).reshape(1, n), comm=h, algorithm=algorithm)
            want = np.stack([data(r, n, dtype).reshape(1, n) for r in range(size)])
            if got.shape != want.shape or not np.array_equal(got, want):
                failures.append(("equal", n, str(dtype)))
        counts = [(n + 3 * r) % (n + 1) for r in range(size)]  # uneven, some zero
        got = hpcpar.allgather(
            data(rank, counts[rank], "f8"), counts=counts, comm=h, algorithm=algorithm
        )
        want = np.concatenate([data(r, counts[r], "f8") for r in range(size)])
        if not np.array_equal(got, want):
            failures.append(("counts", counts))
    assert_all(not failures, f"allgather {algorithm} on {layout}: {failures}", comm)
    h.free()


@pytest.mark.parametrize("algorithm", algorithms_for("alltoall"))
def test_alltoall(comm, algorithm):
    rank, size = comm.Get_rank(), comm.Get_size()
    failures = []
    for block in (0, 1, 7, 40_000):
        for dtype in ("f8", "?", "c16"):
            x = data(rank, size * block, dtype).reshape(size, block)
            got = hpcpar.alltoall(x, algorithm=algorithm)
            want = np.stack(
                [data(src, size * block, dtype).reshape(size, block)[rank] for src in range(size)]
            )
            if got.shape != x.shape or not np.array_equal(got, want):
                failures.append((block, dtype))
    assert_all(not failures, f"alltoall {algorithm}: {failures}", comm)


@pytest.mark.parametrize("algorithm", algorithms_for("alltoallv"))
def test_alltoallv(comm, algorithm):
    rank, size = comm.Get_rank(), comm.Get_size()

    def counts_of(src):
        return [(3 * src + 5 * dst) % 4 * (1 + src) for dst in range(size)]

    def payload(src):
        return data(src, sum(counts_of(src)), "f8")

    recv, recv_counts = hpcpar.alltoallv(payload(rank), counts_of(rank), algorithm=algorithm)
    pieces = []
    for src in range(size):
        counts = counts_of(src)
        start = sum(counts[:rank])
        pieces.append(payload(src)[start : start + counts[rank]])
    want_counts = [counts_of(src)[rank] for src in range(size)]
    ok = recv_counts == want_counts and np.array_equal(recv, np.concatenate(pieces))
    assert_all(ok, f"alltoallv {algorithm}", comm)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("algorithm", algorithms_for("barrier"))
def test_barrier_orders_the_ranks(comm, layout, algorithm, tmp_path):
    # Every rank writes a file before the barrier; after it, every rank sees all files.
    h = hpcpar.Hierarchy(comm, layout=layout)
    folder = comm.bcast(str(tmp_path), root=0)
    rank, size = comm.Get_rank(), comm.Get_size()
    import os
    import time

    time.sleep(0.01 * rank)
    open(os.path.join(folder, f"{algorithm}-{layout}-{rank}"), "w").close()
    hpcpar.barrier(comm=h, algorithm=algorithm)
    seen = [os.path.exists(os.path.join(folder, f"{algorithm}-{layout}-{r}")) for r in range(size)]
    assert_all(all(seen), f"barrier {algorithm} let a rank through early: {seen}", comm)
    h.free()


def test_out_forms_of_every_collective(comm):
    rank, size = comm.Get_rank(), comm.Get_size()
    h = hpcpar.Hierarchy(comm, layout="ppn:2")
    x = data(rank, 6 * size, "f8")
    total = sum(data(r, 6 * size, "f8") for r in range(size))
    checks = {}
    out = np.empty_like(x)
    got = hpcpar.reduce(x, size - 1, out=out, comm=h, algorithm="two_level")
    checks["reduce out="] = (
        got is out and np.array_equal(out, total) if rank == size - 1 else got is None
    )
    out = np.empty((size, x.size))
    checks["allgather out="] = hpcpar.allgather(x, out=out, comm=h) is out and np.array_equal(
        out, np.stack([data(r, 6 * size, "f8") for r in range(size)])
    )
    out = np.empty(6)
    got = hpcpar.reduce_scatter(x, out=out, comm=h, algorithm="two_level")
    checks["reduce_scatter out="] = got is out and np.array_equal(
        out, total[6 * rank : 6 * rank + 6]
    )
    out = np.empty_like(x)
    got = hpcpar.alltoall(x, out=out, algorithm="bruck")
    want = np.concatenate([data(r, 6 * size, "f8")[6 * rank : 6 * rank + 6] for r in range(size)])
    checks["alltoall out="] = got is out and np.array_equal(out, want)
    buf = data(0, 5, "f8") if rank == 0 else np.zeros(5)
    frozen = buf.copy()
    frozen.flags.writeable = False
    out = np.empty(5)
    got = hpcpar.bcast(frozen if rank == 0 else buf, 0, out=out, comm=h, algorithm="pipelined")
    checks["bcast out="] = got is out and np.array_equal(out, data(0, 5, "f8"))
    bad = [name for name, ok in checks.items() if not ok]
    assert_all(not bad, f"out= forms wrong: {bad}", comm)
    h.free()
