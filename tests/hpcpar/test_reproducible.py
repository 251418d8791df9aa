"""reproducible=True: the same bits across algorithms, layouts and rank counts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from collective_cases import affine, contribution
from mpi4py import MPI

import hpcpar
from hpcpar.collectives import algorithms_for
from hpcpar.collectives.reproducible import grid_exponent, join_limbs, split_limbs
from hpcpar.testing import assert_all, layouts_for


def adversarial(rank: int, n: int, decades: int = 300) -> np.ndarray:
    """Values spanning 1e-300..1e300 with cancellation: naive sums depend on order."""
    rng = np.random.default_rng([7, rank])
    mags = 10.0 ** rng.integers(-decades, decades, n)
    values = rng.standard_normal(n) * mags
    values[::7] = 1e16 * (1 if rank % 2 else -1)  # big values that cancel between ranks
    values[1::7] = 1.0 + rank * 1e-16
    return values


CONTRIBUTORS = 2  # ranks beyond this add zeros, so the multiset is the same at any size >= 2


def share(rank: int, n: int, decades: int) -> np.ndarray:
    return adversarial(rank, n, decades) if rank < CONTRIBUTORS else np.zeros(n)


def serial_reproducible_sum(parts: list[np.ndarray]) -> np.ndarray:
    """The documented scheme run serially: max exponent, limbs, exact integer sum."""
    exponent = np.max([grid_exponent(p) for p in parts], axis=0)
    limbs = np.sum([split_limbs(p, exponent) for p in parts], axis=0)
    return join_limbs(limbs, exponent)


def test_binned_sum_is_order_independent_and_accurate():
    parts = [adversarial(r, 500) for r in range(6)]
    first = serial_reproducible_sum(parts)
    rng = np.random.default_rng(3)
    for _ in range(5):
        order = rng.permutation(len(parts))
        assert np.array_equal(serial_reproducible_sum([parts[i] for i in order]), first)
    exact = np.array([math.fsum(p[i] for p in parts) for i in range(500)])
    biggest = np.max(np.abs(parts), axis=0)
    # fsum rounds the exact sum once and we round a pre-rounded sum once: they may land
    # on neighbouring floats (one ulp), plus the pre-rounding of each part
    bound = np.abs(np.spacing(first)) + len(parts) * np.ldexp(biggest, -79)
    assert np.all(np.abs(first - exact) <= bound)
    naive = [np.sum([parts[i] for i in rng.permutation(6)], axis=0) for _ in range(5)]
    assert any(
        not np.array_equal(naive[0], other) for other in naive[1:]
    )  # the data is adversarial


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", ["f8", "f4", "c16"])
def test_same_bits_across_algorithms_layouts_and_rank_counts(comm, dtype):
    rank, size = comm.Get_rank(), comm.Get_size()
    n, decades = 1000, 30 if dtype == "f4" else 300
    mine = share(rank, n, decades)
    if dtype == "c16":
        mine = mine + 1j * share(rank, n, decades)[::-1]
    mine = mine.astype(dtype)
    # The reference sums only the contributing ranks: ranks adding zeros must not
    # change a bit, so this checks rank-count independence at every size >= 2.
    parts = [share(r, n, decades) for r in range(min(size, CONTRIBUTORS))]
    real = serial_reproducible_sum([p.astype(dtype).real.astype("f8") for p in parts])
    if dtype == "c16":
        imag = serial_reproducible_sum([p[::-1].astype("f8") for p in parts])
        want = (real + 1j * imag).astype(dtype)
    else:
        want = real.astype(dtype)
    results = {}
    for layout in layouts_for(size):
        h = hpcpar.Hierarchy(comm, layout=layout)
        for algorithm in algorithms_for("allreduce"):
            got = hpcpar.allreduce(mine, comm=h, algorithm=algorithm, reproducible=True)
            results[(layout, algorithm)] = got.tobytes() == want.tobytes()
        h.free()
    bad = [key for key, ok in results.items() if not ok]
    assert_all(not bad, f"reproducible {dtype}: differs for {bad}", comm)


@pytest.mark.mpi
def test_non_finite_values_follow_ieee(comm):
    rank, size = comm.Get_rank(), comm.Get_size()
    x = np.array(
        [
            1.0,
            np.inf if rank == 0 else 1.0,
            np.inf if rank == 0 else -np.inf,
            np.nan if rank == size - 1 else 0.0,
        ]
    )
    got = hpcpar.allreduce(x, reproducible=True, algorithm="ring")
    want_middle = np.inf if size == 1 else np.nan
    ok = (
        got[0] == size
        and got[1] == np.inf
        and (np.isnan(got[2]) == np.isnan(want_middle))
        and np.isnan(got[3])
    )
    assert_all(ok, f"non-finite reproducible sum: {got}", comm)


@pytest.mark.mpi
def test_other_ops_fold_in_rank_order(comm):
    rank, size = comm.Get_rank(), comm.Get_size()
    dtype = np.dtype([("m", "f8"), ("c", "f8")])
    mine = contribution(rank, 50, dtype)
    acc = contribution(0, 50, dtype)
    for r in range(1, size):
        acc = affine(acc, contribution(r, 50, dtype))
    prod = np.prod([contribution(r, 50, "f8") * 0.1 for r in range(size)], axis=0)
    for algorithm in ("mpi", "recursive_doubling", "rabenseifner"):
        got = hpcpar.allreduce(mine, affine, algorithm=algorithm, reproducible=True)
        assert_all(got.tobytes() == acc.tobytes(), f"ordered fold {algorithm}", comm)
        p = hpcpar.allreduce(
            contribution(rank, 50, "f8") * 0.1, MPI.PROD, algorithm=algorithm, reproducible=True
        )
        assert_all(p.tobytes() == prod.tobytes(), f"PROD fold {algorithm}", comm)
