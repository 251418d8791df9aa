"""Nonblocking collectives: overlap with compute, several in flight, dropped requests."""

from __future__ import annotations

import gc
import warnings

import numpy as np
import pytest
from collective_cases import contribution, fold
from mpi4py import MPI

import hpcpar
from hpcpar.collectives import CollectiveRequest, PendingRequestWarning, algorithms_for, last_stats
from hpcpar.testing import assert_all

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("algorithm", algorithms_for("allreduce"))
def test_iallreduce_overlaps_compute(comm, algorithm):
    rank, size = comm.Get_rank(), comm.Get_size()
    h = hpcpar.Hierarchy(comm, layout="ppn:2")
    n = 200_000
    x = contribution(rank, n, "f8")
    request = hpcpar.iallreduce(x, comm=h, algorithm=algorithm)
    x[:] = -1.0  # the input was copied when the call started
    tests, acc = 0, np.zeros(1000)
    while not request.test():  # compute between progress calls
        acc += np.sin(np.arange(1000.0))
        tests += 1
    result = request.wait()
    want = fold(MPI.SUM, [contribution(r, n, "f8") for r in range(size)])
    assert_all(np.array_equal(result, want) and request.done, f"iallreduce {algorithm}", comm)
    h.free()


def test_many_collectives_in_flight(comm):
    rank, size = comm.Get_rank(), comm.Get_size()
    h = hpcpar.Hierarchy(comm, layout="ppn:2")
    a, b = contribution(rank, 5000, "f8"), contribution(rank, 7, "i8")
    bc = contribution(0, 300, "f8") if rank == 0 else np.zeros(300)
    requests = [
        hpcpar.iallreduce(a, comm=h, algorithm="ring"),
        hpcpar.iallreduce(b, MPI.MAX, comm=h, algorithm="recursive_doubling"),
        hpcpar.ibcast(bc, 0, comm=h, algorithm="scatter_allgather"),
        hpcpar.iallgather(b, comm=h, algorithm="ring"),
        hpcpar.ireduce_scatter(a, comm=h, algorithm="two_level"),
        hpcpar.ialltoallv(a[:size], [1] * size, comm=h, algorithm="pairwise"),
        hpcpar.ibarrier(comm=h, algorithm="dissemination"),
        hpcpar.ireduce(b, 0, comm=h, algorithm="binomial"),
        hpcpar.iallreduce(a, comm=h, algorithm="pipelined"),
    ]
    for request in reversed(requests):  # completion order must not matter
        request.wait()
    sums = fold(MPI.SUM, [contribution(r, 5000, "f8") for r in range(size)])
    maxes = fold(MPI.MAX, [contribution(r, 7, "i8") for r in range(size)])
    results = [r.wait() for r in requests]
    checks = [
        np.array_equal(results[0], sums),
        np.array_equal(results[1], maxes),
        np.array_equal(results[2], contribution(0, 300, "f8")),
        np.array_equal(results[3], np.stack([contribution(r, 7, "i8") for r in range(size)])),
        np.array_equal(results[8], sums),
    ]
    assert_all(all(checks), f"concurrent collectives: {checks}", comm)
    h.free()


def test_dropped_request_is_reported(comm):
    pending = MPI.Grequest.Start()  # completes only when told to

    def never_finishes():
        yield [pending]

    request = CollectiveRequest("iallreduce", never_finishes(), lambda value: value)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del request
        gc.collect()
    pending.Complete()  # leave nothing behind in MPI
    pending.Wait()
    messages = [str(w.message) for w in caught if issubclass(w.category, PendingRequestWarning)]
    assert messages and "dropped before completion" in messages[0]
    assert "test_dropped_request_is_reported" in messages[0]


def test_counters_after_nonblocking(comm):
    request = hpcpar.iallreduce(np.ones(64), comm=comm, algorithm="ring")
    request.wait()
    stats = last_stats()
    assert_all(stats.algorithm == "ring" and stats.collective == "allreduce", str(stats), comm)
