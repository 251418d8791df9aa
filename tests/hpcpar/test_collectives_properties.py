"""Property-based collectives: random sizes, layouts, algorithms and roots (hypothesis).

Every rank must draw the same examples: hypothesis runs derandomized, and each example
is checked to be identical on all ranks before it is used.
"""

from __future__ import annotations

import numpy as np
import pytest
from collective_cases import contribution, fold
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import hpcpar
from hpcpar.collectives import algorithms_for
from hpcpar.testing import assert_all

pytestmark = pytest.mark.mpi
SIZE = MPI.COMM_WORLD.Get_size()
SETTINGS = settings(
    derandomize=True,
    database=None,
    max_examples=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


@st.composite
def layouts(draw):
    kind = draw(st.sampled_from(["real", "ppn", "nodes", "roundrobin"]))
    if kind == "real":
        return None
    if kind == "ppn":
        return f"ppn:{draw(st.integers(1, SIZE + 1))}"
    if kind == "roundrobin":
        return f"roundrobin:{draw(st.integers(1, SIZE))}"
    cuts = sorted(draw(st.sets(st.integers(1, SIZE - 1), max_size=SIZE - 1))) if SIZE > 1 else []
    sizes = [b - a for a, b in zip([0, *cuts], [*cuts, SIZE], strict=True)]
    return "nodes:" + ",".join(map(str, sizes))


def same_everywhere(comm, example):
    assert_all(
        comm.bcast(example, root=0) == example, f"ranks drew different examples: {example}", comm
    )


@SETTINGS
@given(
    layout=layouts(),
    n=st.integers(0, 3000),
    algorithm=st.sampled_from(algorithms_for("allreduce")),
    dtype=st.sampled_from(["f8", "i4", "u1", "c8"]),
    seed=st.integers(0, 10**6),
)
def test_allreduce_random(layout, n, algorithm, dtype, seed):
    comm = hpcpar.default_comm()
    same_everywhere(comm, (layout, n, algorithm, dtype, seed))
    rank, size = comm.Get_rank(), comm.Get_size()
    with hpcpar.Hierarchy(comm, layout=layout) as h:
        got = hpcpar.allreduce(contribution(rank, n, dtype, seed), comm=h, algorithm=algorithm)
    want = fold(MPI.SUM, [contribution(r, n, dtype, seed) for r in range(size)])
    assert_all(np.array_equal(got, want), f"allreduce {algorithm} {layout} n={n} {dtype}", comm)


@SETTINGS
@given(
    layout=layouts(),
    n=st.integers(0, 3000),
    root=st.integers(0, SIZE - 1),
    algorithm=st.sampled_from(algorithms_for("bcast")),
    seed=st.integers(0, 10**6),
)
def test_bcast_random(layout, n, root, algorithm, seed):
    comm = hpcpar.default_comm()
    same_everywhere(comm, (layout, n, root, algorithm, seed))
    rank = comm.Get_rank()
    buf = contribution(root, n, "f8", seed) if rank == root else np.zeros(n)
    with hpcpar.Hierarchy(comm, layout=layout) as h:
        hpcpar.bcast(buf, root, comm=h, algorithm=algorithm)
    assert_all(
        np.array_equal(buf, contribution(root, n, "f8", seed)), f"bcast {algorithm} {layout}", comm
    )


@SETTINGS
@given(
    layout=layouts(),
    counts=st.lists(st.integers(0, 50), min_size=SIZE, max_size=SIZE),
    algorithm=st.sampled_from(algorithms_for("allgather")),
    seed=st.integers(0, 10**6),
)
def test_allgather_random(layout, counts, algorithm, seed):
    comm = hpcpar.default_comm()
    same_everywhere(comm, (layout, counts, algorithm, seed))
    rank, size = comm.Get_rank(), comm.Get_size()
    with hpcpar.Hierarchy(comm, layout=layout) as h:
        got = hpcpar.allgather(
            contribution(rank, counts[rank], "i8", seed), counts=counts, comm=h, algorithm=algorithm
        )
    want = np.concatenate([contribution(r, counts[r], "i8", seed) for r in range(size)])
    assert_all(np.array_equal(got, want), f"allgather {algorithm} {layout} {counts}", comm)


@SETTINGS
@given(
    layout=layouts(),
    counts=st.lists(st.integers(0, 40), min_size=SIZE, max_size=SIZE),
    algorithm=st.sampled_from(algorithms_for("reduce_scatter")),
    seed=st.integers(0, 10**6),
)
def test_reduce_scatter_random(layout, counts, algorithm, seed):
    comm = hpcpar.default_comm()
    same_everywhere(comm, (layout, counts, algorithm, seed))
    rank, size = comm.Get_rank(), comm.Get_size()
    n = sum(counts)
    with hpcpar.Hierarchy(comm, layout=layout) as h:
        got = hpcpar.reduce_scatter(
            contribution(rank, n, "f8", seed), counts=counts, comm=h, algorithm=algorithm
        )
    total = fold(MPI.SUM, [contribution(r, n, "f8", seed) for r in range(size)])
    start = sum(counts[:rank])
    assert_all(
        np.array_equal(got, total[start : start + counts[rank]]),
        f"reduce_scatter {algorithm}",
        comm,
    )
