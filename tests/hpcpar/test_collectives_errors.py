"""Bad input to collectives: one clear error on every rank, never a hang."""

from __future__ import annotations

import numpy as np
import pytest
from collective_cases import affine, contribution
from mpi4py import MPI

import hpcpar
from hpcpar.collectives import CollectiveError, CollectiveMismatchError, OpError
from hpcpar.testing import assert_all

pytestmark = pytest.mark.mpi


@pytest.mark.reliability("bad_input")
def test_unknown_algorithm_lists_the_valid_ones(comm):
    with pytest.raises(CollectiveError) as info:
        hpcpar.allreduce(np.ones(3), algorithm="butterfly")
    message = str(info.value)
    assert "'butterfly'" in message and "ring" in message and "rabenseifner" in message
    with pytest.raises(CollectiveError, match="scatter_allgather"):
        hpcpar.bcast(np.ones(3), algorithm="ring")


@pytest.mark.reliability("bad_input")
def test_non_commutative_op_refuses_reordering_algorithms(comm):
    x = contribution(comm.Get_rank(), 4, [("m", "f8"), ("c", "f8")])
    for algorithm in ("ring", "multi_leader"):
        with pytest.raises(CollectiveError, match="not commutative"):
            hpcpar.allreduce(x, affine, algorithm=algorithm)


def test_non_commutative_with_roundrobin_layout(comm):
    if comm.Get_size() < 3:
        pytest.skip("a round-robin layout is contiguous below 3 ranks")
    h = hpcpar.Hierarchy(comm, layout="roundrobin:2")
    x = contribution(comm.Get_rank(), 4, [("m", "f8"), ("c", "f8")])
    with pytest.raises(CollectiveError, match="contiguous runs of ranks"):
        hpcpar.allreduce(x, affine, comm=h, algorithm="two_level")
    h.free()


@pytest.mark.reliability("bad_input")
@pytest.mark.parametrize("root", [-1, 99, 1.5, "0"])
def test_bad_root(comm, root):
    with pytest.raises(CollectiveError, match="root must be a rank"):
        hpcpar.bcast(np.ones(2), root)
    with pytest.raises(CollectiveError, match="root must be a rank"):
        hpcpar.reduce(np.ones(2), root)


@pytest.mark.reliability("bad_input")
def test_bad_buffers_and_counts(comm):
    size = comm.Get_size()
    with pytest.raises(CollectiveError, match="shape"):
        hpcpar.allreduce(np.ones(3), out=np.ones(4))
    with pytest.raises(CollectiveError, match="dtype"):
        hpcpar.allreduce(np.ones(3), out=np.ones(3, dtype=np.float32))
    frozen = np.ones(3)
    frozen.flags.writeable = False
    with pytest.raises(CollectiveError, match="read-only"):
        hpcpar.allreduce(np.ones(3), out=frozen)
    with pytest.raises(CollectiveError, match="object"):
        hpcpar.allreduce(np.array([object()]))
    with pytest.raises(CollectiveError, match="add up to"):
        hpcpar.reduce_scatter(np.ones(5), counts=[1] * size)
    with pytest.raises(CollectiveError, match="non-negative"):
        hpcpar.alltoallv(np.ones(2), [-1] + [0] * (size - 1))
    if size > 1:  # at one rank every size is a multiple of the rank count
        with pytest.raises(CollectiveError, match="multiple"):
            hpcpar.alltoall(np.ones(size + 1))
    with pytest.raises(OpError, match="integer or bool"):
        hpcpar.allreduce(np.ones(3), MPI.BAND)
    with pytest.raises(OpError, match="complex"):
        hpcpar.allreduce(np.ones(3, complex), MPI.MAX)


@pytest.mark.reliability("bad_input")
def test_check_mode_names_the_ranks_that_differ(comm, monkeypatch):
    if comm.Get_size() < 2:
        pytest.skip("needs two ranks to disagree")
    monkeypatch.setenv("HPCPAR_CHECK", "1")
    rank = comm.Get_rank()
    with pytest.raises(
        CollectiveMismatchError, match=r"different count: 4 on rank\(s\) 0; 5 on rank"
    ):
        hpcpar.allreduce(np.ones(4 if rank == 0 else 5))
    with pytest.raises(CollectiveMismatchError, match="different root"):
        hpcpar.bcast(np.ones(2), root=0 if rank else 1)
    with pytest.raises(CollectiveMismatchError, match="different dtype"):
        hpcpar.allreduce(np.ones(2, dtype=np.float32 if rank else np.float64))
    with pytest.raises(CollectiveMismatchError, match="different op"):
        hpcpar.allreduce(np.ones(2), MPI.SUM if rank else MPI.MAX)
    # and a correct call still works with checking on
    assert_all(hpcpar.allreduce(np.ones(2))[0] == comm.Get_size(), "checked call", comm)


@pytest.mark.reliability("bad_input")
def test_check_mode_compares_the_algorithm_that_runs(comm, monkeypatch):
    """A per-rank HPCPAR_ALGORITHM_ALLREDUCE makes ``auto`` differ: named, not a hang."""
    if comm.Get_size() < 2:
        pytest.skip("needs two ranks to disagree")
    monkeypatch.setenv("HPCPAR_CHECK", "1")
    rank = comm.Get_rank()
    monkeypatch.setenv("HPCPAR_ALGORITHM_ALLREDUCE", "ring" if rank == 0 else "recursive_doubling")
    with pytest.raises(
        CollectiveMismatchError, match=r"different algorithm: 'ring' on rank\(s\) 0"
    ):
        hpcpar.allreduce(np.ones(8))
    # a choice that fails on one rank only is reported everywhere instead of hanging
    monkeypatch.setenv("HPCPAR_ALGORITHM_ALLREDUCE", "ring" if rank else "no_such_algorithm")
    with pytest.raises(CollectiveMismatchError, match="unknown algorithm 'no_such_algorithm'"):
        hpcpar.allreduce(np.ones(8))
    monkeypatch.delenv("HPCPAR_ALGORITHM_ALLREDUCE")
    assert_all(hpcpar.allreduce(np.ones(2))[0] == comm.Get_size(), "checked call", comm)


@pytest.mark.reliability("bad_input")
def test_ranks_started_with_different_algorithm_settings_fail_at_once(comm, tmp_path, monkeypatch):
    """Without HPCPAR_CHECK: a per-rank algorithm variable or profile is found when hpcpar
    first uses a communicator, on every rank, instead of a hang or wrong results."""
    if comm.Get_size() < 2:
        pytest.skip("needs two ranks to disagree")
    monkeypatch.delenv("HPCPAR_CHECK", raising=False)
    rank = comm.Get_rank()
    monkeypatch.setenv("HPCPAR_ALGORITHM_ALLREDUCE", "ring" if rank == 0 else "mpi")
    fresh = comm.Dup()
    try:
        named = r"different HPCPAR_ALGORITHM_ALLREDUCE: 'ring' on rank\(s\) 0;"
        with pytest.raises(CollectiveMismatchError, match=named):
            hpcpar.allreduce(np.ones(4), comm=fresh)
        # profiles are compared by content: the same bytes at per-rank paths agree ...
        monkeypatch.delenv("HPCPAR_ALGORITHM_ALLREDUCE")
        own = tmp_path / f"profile-{rank}.json"
        own.write_text('{"format": "hpcpar-profile"}')
        monkeypatch.setenv("HPCPAR_PROFILE", str(own))
        from hpcpar.collectives.agree import agree, settings

        agree(fresh)
        # ... different bytes do not
        own.write_text(f'{{"format": "hpcpar-profile", "rank": {rank}}}')
        named = "different HPCPAR_PROFILE: a file with content"
        with pytest.raises(CollectiveMismatchError, match=named):
            agree(fresh)
        monkeypatch.delenv("HPCPAR_PROFILE")
        assert settings()["HPCPAR_PROFILE"] == "unset"
        # agreeing ranks then run normally on a new communicator
        again = comm.Dup()
        try:
            total = hpcpar.allreduce(np.full(4, rank + 1.0), comm=again)
            assert_all(np.array_equal(total, np.full(4, comm.allreduce(rank + 1.0))), "sum", comm)
        finally:
            again.Free()
    finally:
        fresh.Free()
