"""The cost model's message and byte formulas equal the collectives' own counters exactly."""

from __future__ import annotations

import numpy as np
import pytest
from collective_cases import affine, contribution
from mpi4py import MPI

import hpcpar
from hpcpar.collectives import algorithms_for, last_stats
from hpcpar.collectives.cost.counts import counts_for
from hpcpar.collectives.tally import Layout
from hpcpar.testing import assert_all, layouts_for

pytestmark = pytest.mark.mpi
SIZE = MPI.COMM_WORLD.Get_size()
SIZES = [0, 1, 7, 13, 1000, 20_000]  # 20,000 float64 = 160 KB: leaders switch to Rabenseifner


def observed():
    s = last_stats()
    return (s.messages_intra, s.bytes_intra, s.messages_inter, s.bytes_inter, s.reduced_bytes)


def check(comm, h, label, expected_counts):
    got, want = observed(), expected_counts.as_tuple()
    return None if got == want else f"{label}: counters {got} != formula {want}"


@pytest.mark.parametrize("layout", layouts_for(SIZE))
def test_allreduce_bcast_reduce_counts(comm, layout, monkeypatch):
    monkeypatch.setenv("HPCPAR_SEGMENT_BYTES", "4096")  # several pipeline segments
    rank, size = comm.Get_rank(), comm.Get_size()
    h = hpcpar.Hierarchy(comm, layout=layout)
    lay = Layout(tuple(h.node_of))
    problems = []
    for n in SIZES:
        x = contribution(rank, n, "f8")
        for algorithm in algorithms_for("allreduce")[1:]:
            hpcpar.allreduce(x, comm=h, algorithm=algorithm)
            problems.append(
                check(
                    comm,
                    h,
                    f"allreduce {algorithm} n={n}",
                    counts_for("allreduce", algorithm, lay, rank, n, 8),
                )
            )
        for root in sorted({0, size - 1}):
            for algorithm in algorithms_for("bcast")[1:]:
                hpcpar.bcast(x.copy(), root, comm=h, algorithm=algorithm)
                problems.append(
                    check(
                        comm,
                        h,
                        f"bcast {algorithm} root={root} n={n}",
                        counts_for("bcast", algorithm, lay, rank, n, 8, root=root),
                    )
                )
            for algorithm in algorithms_for("reduce")[1:]:
                hpcpar.reduce(x, root, comm=h, algorithm=algorithm)
                problems.append(
                    check(
                        comm,
                        h,
                        f"reduce {algorithm} root={root} n={n}",
                        counts_for("reduce", algorithm, lay, rank, n, 8, root=root),
                    )
                )
    if h.node_of == sorted(h.node_of):  # non-commutative reduce goes through rank 0
        y = contribution(rank, 5, [("m", "f8"), ("c", "f8")])
        hpcpar.reduce(y, size - 1, affine, comm=h, algorithm="binomial")
        problems.append(
            check(
                comm,
                h,
                "reduce non-commutative",
                counts_for(
                    "reduce", "binomial", lay, rank, 5, 16, root=size - 1, commutative=False
                ),
            )
        )
        # a non-commutative op keeps the leaders on Rabenseifner (the ring reorders)
        z = contribution(rank, 20_000, [("m", "f8"), ("c", "f8")])
        for algorithm in ("two_level", "pipelined"):
            hpcpar.allreduce(z, affine, comm=h, algorithm=algorithm)
            problems.append(
                check(
                    comm,
                    h,
                    f"allreduce {algorithm} non-commutative",
                    counts_for("allreduce", algorithm, lay, rank, 20_000, 16, commutative=False),
                )
            )
    bad = [p for p in problems if p]
    assert_all(not bad, f"layout {layout}: {bad[:3]}", comm)
    h.free()


@pytest.mark.parametrize("layout", layouts_for(SIZE))
def test_gather_scatter_alltoall_barrier_counts(comm, layout):
    rank, size = comm.Get_rank(), comm.Get_size()
    h = hpcpar.Hierarchy(comm, layout=layout)
    lay = Layout(tuple(h.node_of))
    problems = []
    for n in SIZES:
        counts = [(n + 5 * r) % (n + 3) for r in range(size)]
        for algorithm in algorithms_for("allgather")[1:]:
            hpcpar.allgather(
                contribution(rank, counts[rank], "f4"), counts=counts, comm=h, algorithm=algorithm
            )
            problems.append(
                check(
                    comm,
                    h,
                    f"allgather {algorithm} n={n}",
                    counts_for("allgather", algorithm, lay, rank, 0, 4, counts=counts),
                )
            )
        for algorithm in algorithms_for("reduce_scatter")[1:]:
            hpcpar.reduce_scatter(
                contribution(rank, sum(counts), "f8"), counts=counts, comm=h, algorithm=algorithm
            )
            problems.append(
                check(
                    comm,
                    h,
                    f"reduce_scatter {algorithm} n={n}",
                    counts_for(
                        "reduce_scatter", algorithm, lay, rank, sum(counts), 8, counts=counts
                    ),
                )
            )
        for algorithm in algorithms_for("alltoall")[1:]:
            hpcpar.alltoall(contribution(rank, n * size, "i2"), comm=h, algorithm=algorithm)
            problems.append(
                check(
                    comm,
                    h,
                    f"alltoall {algorithm} n={n}",
                    counts_for("alltoall", algorithm, lay, rank, n * size, 2),
                )
            )
        mine = [(rank + d + n) % 4 for d in range(size)]
        hpcpar.alltoallv(contribution(rank, sum(mine), "f8"), mine, comm=h, algorithm="pairwise")
        problems.append(
            check(
                comm,
                h,
                f"alltoallv n={n}",
                counts_for("alltoallv", "pairwise", lay, rank, 0, 8, counts=mine),
            )
        )
    for algorithm in algorithms_for("barrier")[1:]:
        hpcpar.barrier(comm=h, algorithm=algorithm)
        problems.append(
            check(
                comm, h, f"barrier {algorithm}", counts_for("barrier", algorithm, lay, rank, 0, 1)
            )
        )
    bad = [p for p in problems if p]
    assert_all(not bad, f"layout {layout}: {bad[:3]}", comm)
    h.free()


def test_mpi_algorithm_has_no_formula(comm):
    hpcpar.allreduce(np.ones(3), algorithm="mpi")
    assert last_stats().inside_mpi
    assert counts_for("allreduce", "mpi", Layout((0,)), 0, 3, 8) is None
