"""The flight record: every rank records the same collectives in the same order, with
the user's call site, runs of identical calls as one entry, and point-to-point calls,
halo exchanges and checkpoint phases beside them."""

from __future__ import annotations

import inspect
import itertools

import numpy as np
import pytest

import hpcpar
from hpcpar.runtime import flight
from hpcpar.runtime.switches import HOT
from hpcpar.testing import assert_all

pytestmark = pytest.mark.mpi


def _line_of(marker: str) -> int:
    """The line of this file holding ``marker`` in a comment."""
    source, first = inspect.getsourcelines(test_every_rank_records_the_same_collectives)
    for offset, text in enumerate(source):
        if f"# {marker}" in text:
            return first + offset
    raise AssertionError(marker)


@pytest.fixture
def fresh():
    flight.set_enabled(True)
    flight.clear()
    yield
    flight.set_enabled(True)


def _mine(entries, comm_label):
    return [e for e in entries if e["comm"] == comm_label]


def test_every_rank_records_the_same_collectives(comm, fresh):
    rank, size = comm.Get_rank(), comm.Get_size()
    sub = comm.Dup()
    try:
        x = np.full(3, rank + 1.0)
        for _ in range(5):
            hpcpar.allreduce(x, comm=sub)  # loop
        hpcpar.bcast(np.arange(4.0) if rank == 0 else np.zeros(4), root=0, comm=sub)  # bcast
        request = hpcpar.iallreduce(np.ones(2, dtype=np.float32), comm=sub)  # iallreduce
        request.wait()
        hpcpar.allreduce(x, comm=sub, algorithm="ring")  # ring
        hpcpar.barrier(comm=sub)  # barrier
        entries = flight.snapshot()
    finally:
        sub.Free()
    labels = {e["comm"] for e in entries} - {"world"}
    assert len(labels) == 1, labels
    mine = _mine(entries, labels.pop())
    # the state is made by the first call (general path), then the fast path takes over
    ops = [(e["operation"], e["algorithm"], e["calls"]) for e in mine]
    assert ops[-4:] == [
        ("bcast", "mpi", 1),
        ("iallreduce", "mpi", 1),
        ("allreduce", "ring", 1),
        ("barrier", "mpi", 1),
    ], ops
    assert (
        sum(e["calls"] for e in mine if e["operation"] == "allreduce" and e["algorithm"] == "mpi")
        == 5
    )
    # sequence numbers: consecutive, runs included
    expected = 0
    for e in mine:
        assert e["seq"] == expected, mine
        expected += e["calls"]
    assert expected == 9
    here = __file__
    for e, marker in zip(mine[-4:], ["bcast", "iallreduce", "ring", "barrier"], strict=True):
        assert e["site"].startswith(f"{here}:{_line_of(marker)} in "), (e["site"], marker)
    assert mine[0]["site"].startswith(f"{here}:{_line_of('loop')} in ")
    assert mine[-3]["dtype"] in ("float32", "<f4")
    assert mine[-3]["count"] == 2 and mine[-4]["root"] == 0
    assert all(e["start"] is not None for e in mine) and mine[-1]["current"]
    assert all(e["end"] is not None and e["end"] >= e["start"] for e in mine[-4:])
    # every rank recorded the same calls (operation, algorithm, count, dtype, sequence)
    keys = [(e["seq"], e["operation"], e["algorithm"], e["count"], e["calls"]) for e in mine]
    every = comm.allgather(keys)
    assert_all(all(k == every[0] for k in every), "the same record on every rank", comm)
    assert size >= 1


def test_point_to_point_halo_and_checkpoint_phases_are_recorded(comm, fresh, tmp_path):
    from checkpoint import Checkpointer

    rank, size = comm.Get_rank(), comm.Get_size()
    if size >= 2 and rank < 2:
        if rank == 0:
            hpcpar.send(np.arange(6.0)[::2], 1, tag=3)
        else:
            got = hpcpar.recv(np.empty(3), 0, tag=3)
            assert np.array_equal(got, [0.0, 2.0, 4.0])
    cart = comm.Create_cart([size], periods=[True])
    halo = hpcpar.HaloExchange(cart, (4,), 1, np.float64)
    try:
        halo.exchange(np.zeros(6))
    finally:
        halo.free()
        cart.Free()
    root = comm.bcast(str(tmp_path) if rank == 0 else None, root=0)
    with Checkpointer(f"{root}/ck", comm=comm) as ck:
        ck.save(7, {"w": np.full(3, float(rank))}).wait()
        step, state = ck.restore()
    assert step == 7 and np.array_equal(state["w"], np.full(3, float(rank)))
    seen = [(e["comm"], e["operation"]) for e in flight.snapshot()]
    if size >= 2 and rank < 2:
        assert ("p2p", "send" if rank == 0 else "recv") in seen, seen
    assert ("halo", "halo exchange") in seen
    for phase in ("save", "wait", "restore"):
        assert ("checkpoint", f"checkpoint {phase}") in seen, seen
    assert any(op.startswith("checkpoint commit ") for _, op in seen), seen
    entries = flight.snapshot()
    save = next(e for e in entries if e["operation"] == "checkpoint save")
    assert save["count"] == 7 and save["site"].startswith(__file__)
    assert entries[-1]["current"] and entries[-1]["operation"] == "checkpoint restore"


def test_off_records_nothing_and_the_ring_keeps_the_newest(comm, fresh):
    flight.set_enabled(False)
    hpcpar.allreduce(np.ones(2))
    hpcpar.bcast(np.ones(2), root=0)
    assert flight.snapshot() == []
    flight.set_enabled(True)
    for i in range(flight.SLOTS + 10):  # different counts: an entry each
        hpcpar.bcast(np.ones(1 + i % 2), root=0, comm=comm)
        hpcpar.allreduce(np.ones(1 + i % 2), comm=comm)
    entries = flight.snapshot()
    assert len(entries) == flight.SLOTS
    seqs = [e["seq"] for e in entries]
    assert seqs == sorted(seqs) and entries[-1]["operation"] == "allreduce"


def test_persistent_starts_are_one_entry_and_keep_the_sequence(comm, fresh):
    hpcpar.allreduce(np.ones(1), comm=comm)
    x = np.ones(4)
    p = hpcpar.allreduce_init(x, comm=comm)
    try:
        for _ in range(3):
            p()
    finally:
        p.free()
    hpcpar.allreduce(np.ones(5), comm=comm)
    mine = [e for e in flight.snapshot() if e["comm"] == "world"]
    persistent = [e for e in mine if e["operation"] == "allreduce (persistent)"]
    if p.algorithm == "mpi":
        assert len(persistent) == 1 and persistent[0]["calls"] == 3, mine
    for before, after in itertools.pairwise(mine):
        assert after["seq"] == before["seq"] + before["calls"], mine


def test_a_background_phase_does_not_become_the_current_call(comm, fresh):
    hpcpar.bcast(np.ones(2), root=0, comm=comm)
    mine = HOT.current
    assert mine is not None and mine[flight.OPERATION] == "bcast"
    flight.finish(flight.point("checkpoint commit local", "checkpoint", None, 3, current=False))
    assert HOT.current is mine
    assert flight.snapshot()[-1]["operation"] == "checkpoint commit local"
