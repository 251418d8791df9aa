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


def _fresh(comm):
    """A new communicator: its calls are numbered from #0, so the guard compares #0, #1,
    #3, #7, ... (the calls that make the sequence 1, 2, 4, 8, ...)."""
    return comm.Dup()


@pytest.mark.reliability("bad_input")
@pytest.mark.parametrize("path", ["mpi", "ring", "bcast"])
def test_the_guard_stops_a_mismatch_at_the_first_call_without_check_mode(comm, monkeypatch, path):
    """Same byte count, different dtype or op: MPI would return wrong numbers and exit 0;
    the always-on guard raises on every rank before any data moves, naming both calls."""
    if comm.Get_size() < 2:
        pytest.skip("needs two ranks to disagree")
    monkeypatch.delenv("HPCPAR_CHECK", raising=False)
    rank = comm.Get_rank()
    fresh = _fresh(comm)
    try:
        with pytest.raises(CollectiveMismatchError) as info:
            if path == "bcast":
                hpcpar.bcast(np.ones(4) if rank else np.ones(8, np.float32), root=0, comm=fresh)
            else:
                hpcpar.allreduce(
                    np.ones(4), MPI.SUM if rank == 0 else MPI.MAX, comm=fresh, algorithm=path
                )
        message = str(info.value)
        assert "differ at #0 on" in message, message
        if path == "bcast":
            assert "rank(s) 0 called bcast" in message and "count 8, float32" in message
            assert "count 4, float64" in message, message
        else:
            assert f"rank(s) 0 called allreduce ({path}, count 4, float64, op SUM)" in message
            assert "op MAX" in message, message
        # nothing moved: the communicator is usable, and correct calls are correct
        got = hpcpar.allreduce(np.ones(2), comm=fresh)
        assert_all(got[0] == comm.Get_size(), "a call after the refused one", comm)
    finally:
        fresh.Free()


@pytest.mark.reliability("bad_input")
@pytest.mark.parametrize("flight_on", [True, False])
def test_the_guard_names_a_later_mismatch_within_its_window(comm, monkeypatch, flight_on):
    """A mismatch at call #4 is found when the ranks compare at #7, and named from the
    flight record; with the record off the window and the ranks are named."""
    if comm.Get_size() < 2:
        pytest.skip("needs two ranks to disagree")
    from hpcpar.runtime import flight

    monkeypatch.delenv("HPCPAR_CHECK", raising=False)
    rank = comm.Get_rank()
    fresh = _fresh(comm)
    was = flight.enabled()
    flight.set_enabled(flight_on)
    try:
        for _ in range(4):  # #0-#3, compared at #0, #1 and #3
            hpcpar.allreduce(np.ones(3), comm=fresh, algorithm="mpi")
        # #4: MAX on rank 0, SUM elsewhere: wrong numbers, no error from MPI (a dtype of
        # the same byte count can make MPI's own algorithm split the data differently)
        hpcpar.allreduce(np.ones(3), MPI.MAX if rank == 0 else MPI.SUM, comm=fresh, algorithm="mpi")
        for _ in range(2):  # #5, #6
            hpcpar.allreduce(np.ones(3), comm=fresh, algorithm="mpi")
        with pytest.raises(CollectiveMismatchError) as info:
            hpcpar.allreduce(np.ones(3), comm=fresh, algorithm="mpi")  # #7: compared
        message = str(info.value)
        if flight_on:
            assert "differ at #4 on" in message, message
            assert "rank(s) 0 called allreduce (mpi, count 3, float64, op MAX)" in message
        else:
            assert "passed different arguments" in message and "calls #4-#7" in message
            assert "rank(s) 0 and rank(s) 1" in message, message
    finally:
        flight.set_enabled(was)
        fresh.Free()


def test_the_guard_passes_the_same_call_made_through_either_path(comm):
    """A strided array takes the general path, a contiguous one the fast path: the same
    call on both, which the guard must not take for a mismatch."""
    fresh = _fresh(comm)
    try:
        for _ in range(9):  # #0-#8: compared at #0, #1, #3 and #7
            data = np.arange(8.0)
            x = data[::2] if comm.Get_rank() % 2 else data[:4].copy()
            got = hpcpar.allreduce(x, comm=fresh, algorithm="mpi")
            expect = sum(
                (np.arange(8.0)[::2] if r % 2 else np.arange(4.0)) for r in range(comm.Get_size())
            )
            assert_all(np.array_equal(got, expect), f"{got} vs {expect}", comm)
    finally:
        fresh.Free()


def _random_calls(rng, length):
    """A call sequence: (blocking, count, dtype, op) of allreduces of 1-4 8-byte elements."""
    return [
        (
            bool(rng.integers(2)),
            int(rng.integers(1, 5)),
            np.float64 if rng.integers(2) else np.int64,
            MPI.SUM if rng.integers(3) else MPI.MAX,
        )
        for _ in range(length)
    ]


def _perturbed(calls, kind, at):
    """``calls`` with one change at ``at`` that MPI cannot see: each position keeps its
    count and element size, so the library runs the same steps and returns wrong sums
    (a changed count or element size can make it choose other steps and hang)."""
    mine = list(calls)
    blocking, count, dtype, op = mine[at]
    if kind == "swap":  # the two calls' arguments change places, each keeps its call kind
        other = mine[at + 1]
        mine[at], mine[at + 1] = (blocking, *other[1:]), (other[0], count, dtype, op)
    elif kind == "dtype":
        mine[at] = (blocking, count, np.int64 if dtype is np.float64 else np.float64, op)
    else:
        mine[at] = (blocking, count, dtype, MPI.MAX if op is MPI.SUM else MPI.SUM)
    return mine


@pytest.mark.reliability("bad_input")
@pytest.mark.timeout(300)
def test_the_guard_reports_any_one_reordered_or_changed_call(comm, monkeypatch, record_property):
    """Random sequences of blocking and nonblocking allreduces through the library's call,
    one call's dtype or op changed, or two calls swapped, on one rank (counts and element
    sizes kept, so MPI itself sees nothing and returns wrong sums): every rank raises
    CollectiveMismatchError, together, within 256 calls of the change."""
    if comm.Get_size() < 2:
        pytest.skip("needs two ranks to disagree")
    monkeypatch.delenv("HPCPAR_CHECK", raising=False)
    rank, size = comm.Get_rank(), comm.Get_size()
    seed = comm.bcast(int(np.random.SeedSequence().entropy % (1 << 32)) if rank == 0 else None)
    rng = np.random.default_rng(seed)
    trials = 0
    for trial in range(15):
        kind = ("swap", "dtype", "op")[trial % 3]
        # the cases first (#2/#3, #300/#301, #301/#302), then random positions
        at = (2, 300, 301)[trial] if trial < 3 else int(rng.integers(0, 700))
        calls = _random_calls(rng, at + 2 + 260)
        while kind == "swap" and calls[at][2:] == calls[at + 1][2:]:  # a swap that changes
            calls[at + 1] = _random_calls(rng, 1)[0]
        calls[at + 1] = (calls[at + 1][0], calls[at][1], *calls[at + 1][2:])  # same count
        victim = int(rng.integers(size))
        mine = _perturbed(calls, kind, at) if rank == victim else calls
        algorithm = ("mpi", "auto")[int(rng.integers(2))]  # auto: the library's call here
        fresh = comm.Dup()
        reported = None
        try:
            for i, (blocking, count, dtype, op) in enumerate(mine):
                x = np.full(count, 1.0 + rank, dtype=dtype)
                try:
                    if blocking:
                        hpcpar.allreduce(x, op, comm=fresh, algorithm=algorithm)
                    else:
                        hpcpar.iallreduce(x, op, comm=fresh, algorithm=algorithm).wait()
                except CollectiveMismatchError:
                    reported = i
                    break
        finally:
            fresh.Free()
        where = f"seed {seed}, trial {trial}: {kind} at #{at} on rank {victim} ({algorithm})"
        assert_all(reported is not None, f"never reported: {where}", comm)
        assert_all(at <= reported <= at + 1 + 256, f"reported at #{reported}: {where}", comm)
        assert_all(comm.allgather(reported) == [reported] * size, f"not together: {where}", comm)
        trials += 1
    record_property("reliability_cases", trials)
