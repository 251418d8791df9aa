"""PowerSGD at 1-4 ranks: against a one-process run of the same algorithm on the gathered
matrices, exact for matrices of rank r, error feedback's invariant, torch's warm-up."""

from __future__ import annotations

import numpy as np
import pytest

import hpcpar
from hpcpar.collectives import CollectiveError
from hpcpar.testing import assert_all

pytestmark = pytest.mark.mpi


def _reference(everyone, q):
    """One power iteration on the gathered matrices, as the module docstring states."""
    m = np.sum(everyone, axis=0)
    p = m @ q
    for i in range(p.shape[1]):  # Gram-Schmidt
        p[:, i] /= np.linalg.norm(p[:, i])
        p[:, i + 1 :] -= np.outer(p[:, i], p[:, i] @ p[:, i + 1 :])
    return p @ (m.T @ p).T


def test_one_step_matches_a_one_process_power_iteration(comm):
    h = hpcpar.Hierarchy(comm, layout="ppn:1")
    rng = np.random.default_rng(comm.Get_rank())
    m = rng.standard_normal((40, 30))
    v = rng.standard_normal(30)
    psgd = hpcpar.PowerSGD(3, comm=h, start_powerSGD_iter=0, random_seed=5)
    got_m, got_v = psgd.allreduce([m, v])
    everyone = comm.allgather(m)
    if h.n_nodes == 1:
        want = np.sum(everyone, axis=0)
    else:
        q = np.random.default_rng(5).standard_normal((30, 3))
        want = _reference(everyone, q)
    ok = np.allclose(got_m, want, atol=1e-10) and np.allclose(
        got_v, np.sum(comm.allgather(v), axis=0), atol=1e-12
    )
    assert_all(ok and len({got_m.tobytes() for got_m in comm.allgather(got_m)}) == 1, "step", comm)
    h.free()


def test_a_sum_of_rank_r_is_recovered_and_the_warmup_is_exact(comm):
    h = hpcpar.Hierarchy(comm, layout="ppn:1")
    rng = np.random.default_rng(comm.Get_rank())
    u = np.random.default_rng(9).standard_normal((64, 2))
    m = u @ rng.standard_normal((2, 48))  # every rank's matrix in one 2-d column space
    psgd = hpcpar.PowerSGD(2, comm=h, start_powerSGD_iter=1)
    first = psgd.allreduce([m])[0]  # the warm-up call: exact
    second = psgd.allreduce([m])[0]
    exact = np.sum(comm.allgather(m), axis=0)
    ok = np.allclose(first, exact, atol=1e-12) and np.allclose(second, exact, atol=1e-9)
    assert_all(ok, "rank-2 sums", comm)
    h.free()


def test_error_feedback_keeps_what_is_owed(comm):
    """sum of results + the ranks' errors == the sum of every rank's matrices."""
    h = hpcpar.Hierarchy(comm, layout="ppn:1")
    rng = np.random.default_rng(10 + comm.Get_rank())
    psgd = hpcpar.PowerSGD(1, comm=h, start_powerSGD_iter=0)
    total_in, total_out = np.zeros((20, 16)), np.zeros((20, 16))
    for _ in range(6):
        m = rng.standard_normal((20, 16))
        total_in += np.sum(comm.allgather(m), axis=0)
        total_out += psgd.allreduce([m])[0]
    owed = np.sum(comm.allgather(psgd.owed([(20, 16)])[0]), axis=0)
    ok = np.allclose(total_out + owed, total_in, atol=1e-9)
    if h.n_nodes > 1:
        ok = ok and not np.allclose(total_out, total_in, atol=1e-3)  # rank 1 does lose
    assert_all(ok, "error feedback", comm)
    h.free()


@pytest.mark.reliability("bad_input")
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"matrix_approximation_rank": 0}, "matrix_approximation_rank"),
        ({"start_powerSGD_iter": -1}, "start_powerSGD_iter"),
        ({"min_compression_rate": float("nan")}, "min_compression_rate"),
    ],
)
def test_bad_settings(comm, kwargs, match):
    with pytest.raises(CollectiveError, match=match):
        hpcpar.PowerSGD(**kwargs)


@pytest.mark.reliability("bad_input")
def test_integer_tensors_are_refused(comm):
    with pytest.raises(CollectiveError, match="float32 or float64"):
        hpcpar.PowerSGD(comm=comm).allreduce([np.ones((4, 4), np.int64)])
