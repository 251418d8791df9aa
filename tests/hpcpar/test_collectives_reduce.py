"""allreduce, reduce and reduce_scatter: every algorithm x op x dtype x size x layout vs numpy."""

from __future__ import annotations

import numpy as np
import pytest
from collective_cases import REDUCTION_CASES, contribution, fold
from mpi4py import MPI

import hpcpar
from hpcpar.collectives import CollectiveError, algorithms_for
from hpcpar.testing import assert_all, layouts_for

pytestmark = pytest.mark.mpi
SIZE = MPI.COMM_WORLD.Get_size()
LAYOUTS = [
    lay
    for lay in layouts_for(SIZE)
    if lay in (None, "ppn:2", "nodes:2,1", "nodes:1,3", "roundrobin:2")
]
# three nodes: three leaders (a count that is not a power of two) switch to the ring
LAYOUTS += {3: ["ppn:1"], 4: ["nodes:2,1,1"]}.get(SIZE, [])
COUNTS = [0, 1, 13, 3 * 2**20 // 8]  # empty, one, a prime, 3 MiB of float64


def hierarchy(comm, layout):
    return hpcpar.Hierarchy(comm, layout=layout)


def expected_failure(algorithm: str, commutative: bool, h) -> bool:
    """Algorithms that must refuse a non-commutative op on this layout."""
    if commutative:
        return False
    if algorithm in ("ring", "multi_leader"):
        return True
    contiguous = h.node_of == sorted(h.node_of)
    return algorithm in ("two_level", "pipelined") and not contiguous


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("algorithm", algorithms_for("allreduce"))
def test_allreduce_against_numpy(comm, layout, algorithm):
    h = hierarchy(comm, layout)
    rank, size = comm.Get_rank(), comm.Get_size()
    failures = []
    for op, dtype, commutative in REDUCTION_CASES:
        for n in COUNTS if dtype == "f8" else COUNTS[:3]:
            mine = contribution(rank, n, dtype)
            want = fold(op, [contribution(r, n, dtype) for r in range(size)])
            if expected_failure(algorithm, commutative, h):
                with pytest.raises(CollectiveError, match="not commutative"):
                    hpcpar.allreduce(mine, op, comm=h, algorithm=algorithm)
                continue
            got = hpcpar.allreduce(mine, op, comm=h, algorithm=algorithm)
            if got.dtype != want.dtype or not np.array_equal(got, want):
                failures.append((getattr(op, "__name__", op), str(dtype), n))
    assert_all(not failures, f"{algorithm} on {layout}: wrong results for {failures}", comm)
    h.free()


@pytest.mark.parametrize("algorithm", algorithms_for("allreduce"))
def test_allreduce_buffer_forms(comm, algorithm):
    h = hierarchy(comm, "ppn:2")
    rank, size = comm.Get_rank(), comm.Get_size()
    base = contribution(rank, 40, "f8").reshape(4, 10)
    want = fold(MPI.SUM, [contribution(r, 40, "f8").reshape(4, 10) for r in range(size)])
    inplace = base.copy()
    same = hpcpar.allreduce(inplace, comm=h, algorithm=algorithm, out=inplace)
    out = np.empty((4, 10))
    given = hpcpar.allreduce(base, comm=h, algorithm=algorithm, out=out)
    readonly = base.copy()
    readonly.flags.writeable = False
    fortran_out = np.empty((4, 10), order="F")
    from_readonly = hpcpar.allreduce(readonly, comm=h, algorithm=algorithm, out=fortran_out)
    wide = np.zeros((4, 20))
    wide[:, ::2] = base
    strided = hpcpar.allreduce(wide[:, ::2], comm=h, algorithm=algorithm)
    scalar = hpcpar.allreduce(np.float64(rank + 1), comm=h, algorithm=algorithm)
    checks = [
        same is inplace and np.array_equal(inplace, want),
        given is out and np.array_equal(out, want),
        from_readonly is fortran_out and np.array_equal(fortran_out, want),
        np.array_equal(strided, want) and strided.shape == (4, 10),
        scalar.shape == () and scalar == size * (size + 1) / 2,
        np.array_equal(readonly, base),
    ]
    assert_all(all(checks), f"{algorithm} buffer forms: {checks}", comm)
    h.free()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("algorithm", algorithms_for("reduce"))
def test_reduce_against_numpy(comm, layout, algorithm):
    h = hierarchy(comm, layout)
    rank, size = comm.Get_rank(), comm.Get_size()
    failures = []
    for root in sorted({0, size - 1, size // 2}):
        for op, dtype, commutative in (REDUCTION_CASES[0], REDUCTION_CASES[4], REDUCTION_CASES[-1]):
            for n in (0, 1, 13, 3 * 2**20 // 8 if dtype == "f8" else 4096):
                mine = contribution(rank, n, dtype)
                want = fold(op, [contribution(r, n, dtype) for r in range(size)])
                if expected_failure(algorithm, commutative, h):
                    with pytest.raises(CollectiveError):
                        hpcpar.reduce(mine, root, op, comm=h, algorithm=algorithm)
                    continue
                got = hpcpar.reduce(mine, root, op, comm=h, algorithm=algorithm)
                ok = np.array_equal(got, want) if rank == root else got is None
                if not ok:
                    failures.append((root, str(dtype), n))
    assert_all(not failures, f"reduce {algorithm} on {layout}: {failures}", comm)
    h.free()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("algorithm", algorithms_for("reduce_scatter"))
def test_reduce_scatter_against_numpy(comm, layout, algorithm):
    h = hierarchy(comm, layout)
    rank, size = comm.Get_rank(), comm.Get_size()
    failures = []
    for n in (0, 1, 13, 100_003):
        for counts in (None, [n if r == size - 1 else 0 for r in range(size)]):
            for op, dtype, _ in (REDUCTION_CASES[0], REDUCTION_CASES[8]):
                total = fold(op, [contribution(r, n, dtype) for r in range(size)])
                sizes = counts or [n // size + (1 if r < n % size else 0) for r in range(size)]
                start = sum(sizes[:rank])
                got = hpcpar.reduce_scatter(
                    contribution(rank, n, dtype), op, counts=counts, comm=h, algorithm=algorithm
                )
                if not np.array_equal(got, total[start : start + sizes[rank]]):
                    failures.append((n, counts is None, str(dtype)))
    assert_all(not failures, f"reduce_scatter {algorithm} on {layout}: {failures}", comm)
    h.free()


EVERY_DTYPE = [
    "f2",
    "f4",
    "f8",
    "g",
    "c8",
    "c16",
    "i1",
    "i2",
    "i4",
    "i8",
    "u1",
    "u2",
    "u4",
    "u8",
    "?",
]


@pytest.mark.parametrize("collective", ["reduce_scatter", "allreduce"])
def test_every_numpy_dtype_through_every_algorithm(comm, collective):
    """float16, long double and every integer width reduce through every algorithm (the
    library's call included, which has no float16 of its own) exactly as numpy does."""
    rank, size = comm.Get_rank(), comm.Get_size()
    failures = []
    for algorithm in algorithms_for(collective):
        for dtype in EVERY_DTYPE:
            n = 2 * size + 1
            total = fold(MPI.SUM, [contribution(r, n, dtype) for r in range(size)])
            mine = contribution(rank, n, dtype)
            if collective == "allreduce":
                got, want = hpcpar.allreduce(mine, comm=comm, algorithm=algorithm), total
            else:
                got = hpcpar.reduce_scatter(mine, comm=comm, algorithm=algorithm)
                sizes = [n // size + (1 if r < n % size else 0) for r in range(size)]
                want = total[sum(sizes[:rank]) : sum(sizes[: rank + 1])]
            if got.dtype != want.dtype or not np.array_equal(got, want):
                failures.append((algorithm, dtype))
    assert_all(not failures, f"{collective}: {failures}", comm)


def test_pipelined_segments(comm, monkeypatch):
    # Many small segments exercise the overlap of the three stages.
    monkeypatch.setenv("HPCPAR_SEGMENT_BYTES", "64")
    h = hierarchy(comm, "ppn:2")
    rank, size = comm.Get_rank(), comm.Get_size()
    for n in (1, 7, 8, 9, 1000):
        got = hpcpar.allreduce(contribution(rank, n, "f8"), comm=h, algorithm="pipelined")
        want = fold(MPI.SUM, [contribution(r, n, "f8") for r in range(size)])
        assert_all(np.array_equal(got, want), f"pipelined n={n}", comm)
        source = contribution(size - 1, n, "f8") if rank == size - 1 else np.empty(n)
        got = hpcpar.bcast(source, size - 1, comm=h, algorithm="pipelined")
        assert_all(
            np.array_equal(got, contribution(size - 1, n, "f8")), f"pipelined bcast n={n}", comm
        )
    h.free()


@pytest.mark.mpi
def test_library_allreduce_takes_the_fast_path_under_a_layout(comm, monkeypatch):
    """comm=None with HPCPAR_LAYOUT set, algorithm mpi or auto: no general machinery after
    the first call; a changed layout or HPCPAR_ALGORITHM_ALLREDUCE is seen at once."""
    from hpcpar.collectives import api, last_stats

    general = []
    complete = api._complete
    monkeypatch.setattr(api, "_complete", lambda *a: general.append(a[-1]) or complete(*a))
    x = np.arange(5.0) + comm.rank
    want = np.arange(5.0) * comm.size + comm.size * (comm.size - 1) / 2
    for layout in ("ppn:1", "ppn:2"):
        monkeypatch.setenv("HPCPAR_LAYOUT", layout)
        hpcpar.allreduce(x)  # the first call under a layout may build its state
        before = len(general)
        for algorithm in ("mpi", "auto", "mpi", "auto"):
            got = hpcpar.allreduce(x, algorithm=algorithm)
            assert_all(np.array_equal(got, want), f"{layout} {algorithm}: {got}", comm)
            assert_all(last_stats().algorithm == "mpi", "ran the library", comm)
        assert_all(len(general) == before, f"{layout}: general path taken", comm)
    monkeypatch.setenv("HPCPAR_ALGORITHM_ALLREDUCE", "ring")
    got = hpcpar.allreduce(x)
    assert_all(
        np.array_equal(got, want) and last_stats().algorithm == "ring",
        "auto follows HPCPAR_ALGORITHM_ALLREDUCE at once",
        comm,
    )


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("algorithm", ["auto", "mpi", "ring", "two_level"])
def test_persistent_allreduce_repeats_against_numpy(comm, layout, algorithm):
    from hpcpar.collectives import CollectiveError, last_stats

    h = hierarchy(comm, layout)
    rank, size = comm.Get_rank(), comm.Get_size()
    x, out = np.empty(1000), np.empty(1000)
    call = hpcpar.allreduce_init(x, out=out, comm=h, algorithm=algorithm)
    library = call.algorithm == "mpi"
    assert_all(library == (algorithm in ("auto", "mpi")), f"{call.algorithm}", comm)  # no profile
    # the library's persistent request or its blocking call, whichever measured faster
    assert_all(library == ("bound to the library's" in call.reason), call.reason, comm)
    for k in range(3):  # new data each time, the same buffers
        x[:] = contribution(rank, 1000, np.float64) + k
        want = sum(contribution(q, 1000, np.float64) for q in range(size)) + k * size
        got = call()
        assert_all(got is out and np.allclose(out, want), f"call {k}", comm)
        assert_all(last_stats().algorithm == call.algorithm, "stats of the call", comm)
    call.start()
    with pytest.raises(CollectiveError, match="start\\(\\) again before wait"):
        call.start()
    assert_all(np.allclose(call.wait(), want), "start/wait", comm)
    with pytest.raises(CollectiveError, match="wait\\(\\) without start"):
        call.wait()
    call.free()
    with pytest.raises(CollectiveError, match="used after free"):
        call()
    y = contribution(rank, 7, np.float64)
    with hpcpar.allreduce_init(y, out=y, comm=h, algorithm=algorithm) as inplace:
        first = inplace().copy()  # in place: the next call reduces the reduced values
        assert_all(np.allclose(inplace(), first * size), "in place, twice", comm)
    h.free()


def test_persistent_allreduce_bound_to_the_blocking_call(comm, monkeypatch):
    from hpcpar.collectives import persistent

    monkeypatch.setattr(persistent, "PERSISTENT_PROBE_BYTES", 0)  # above: the blocking call
    rank, size = comm.Get_rank(), comm.Get_size()
    x = np.full(10, float(rank))
    with hpcpar.allreduce_init(x, algorithm="mpi") as call:
        assert_all(call.reason.endswith("bound to the library's blocking call"), call.reason, comm)
        assert_all(np.array_equal(call(), np.full(10, size * (size - 1) / 2)), "call", comm)
        x += 1
        call.start()
        got = call.wait()
        assert_all(np.array_equal(got, np.full(10, size * (size + 1) / 2)), "start/wait", comm)
