"""Checkpointer: round trips, background saves, atomic commits, verified restores, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hpcpar.checkpoint import Checkpointer, CheckpointError, faults, young_daly_interval
from states import same, shared_dir

import hpcpar
from hpcpar.testing import assert_all, layouts_for

pytestmark = pytest.mark.mpi


def state_of(rank, step):
    rng = np.random.default_rng([rank, step])
    return {
        "model": {"w": rng.standard_normal((7, 5)), "b": rng.integers(0, 9, 4)},
        "step": step,
        "name": f"rank{rank}",
        "lr": 0.1,
        "done": False,
        "extra": None,
    }


@pytest.mark.parametrize("layout", layouts_for(hpcpar.default_comm().Get_size())[:4])
def test_round_trip_and_restart_from_files(comm, tmp_path, layout):
    rank = comm.Get_rank()
    root = shared_dir(comm, tmp_path) / "ck"
    h = hpcpar.Hierarchy(comm, layout=layout)
    with Checkpointer(root, comm=h) as ck:
        for step in (1, 2, 3):
            state = state_of(rank, step)
            handle = ck.save(step, state)
            state["model"]["w"][:] = -1  # the caller may change its arrays at once
            handle.wait()
        assert_all(ck.versions() == [3, 2], f"keep 2 versions: {ck.versions()}", comm)
        got_step, got = ck.restore()
        assert_all(got_step == 3 and same(got, state_of(rank, 3)), "restore from memory", comm)
    with Checkpointer(root, comm=h) as again:  # a new process would see only the files
        got_step, got = again.restore()
        assert_all(got_step == 3 and same(got, state_of(rank, 3)), "restore from files", comm)
        older_step, older = again.restore(step=2)
        assert_all(
            older_step == 2 and same(older, state_of(rank, 2)), "restore an older version", comm
        )
    h.free()


def test_lazy_save_copies_in_the_background(comm, tmp_path):
    root = shared_dir(comm, tmp_path) / "lazy"
    with Checkpointer(root, comm=comm, levels=["local"]) as ck:
        state = state_of(comm.Get_rank(), 5)
        handle = ck.save(5, state, lazy=True)
        handle.wait_snapshot()
        assert handle.snapshot_done()
        state["model"]["w"][:] = 0
        handle.wait()
    with Checkpointer(root, comm=comm, levels=["local"]) as ck:
        _, got = ck.restore()
        assert_all(same(got, state_of(comm.Get_rank(), 5)), "lazy save", comm)


@pytest.mark.reliability("fault")
def test_corruption_and_uncommitted_versions_fall_back(comm, tmp_path):
    rank, size = comm.Get_rank(), comm.Get_size()
    root = shared_dir(comm, tmp_path) / "faults"
    with Checkpointer(root, comm=comm, levels=["local"], policy={"keep": {"local": 3}}) as ck:
        for step in (10, 20, 30):
            ck.save(step, state_of(rank, step)).wait()
    # version 30: flip a byte in the last rank's shard; version 20: drop its commit marker
    if rank == size - 1:
        faults.flip_bytes(faults.shard_path(root, "local", 30, rank), offset=3)
    comm.Barrier()
    if rank == 0:
        (root / "commits" / "local" / f"v{20:012d}.committed").unlink()
    comm.Barrier()
    with Checkpointer(root, comm=comm, levels=["local"]) as ck:
        assert_all(ck.versions() == [30, 10], f"versions {ck.versions()}", comm)
        step, got = ck.restore()
        assert_all(step == 10 and same(got, state_of(rank, 10)), f"fell back to {step}", comm)
        assert_all(ck.restored_from == ["local"] * size, f"{ck.restored_from}", comm)
        with pytest.raises(CheckpointError, match=r"no recoverable version 30.*checksum"):
            ck.restore(step=30)


def test_shard_bytes_read_in_ranges_match_the_whole_file():
    """``read_into`` (the XOR level's pieces) against ``join``, which decodes as the state."""
    from hpcpar.checkpoint.shard import decode_shard, encode_shard
    from hpcpar.checkpoint.state import flatten_state, unflatten_state

    flat = flatten_state(state_of(3, 1))
    shard = encode_shard(1, 3, flat)
    whole = shard.join()
    assert same(unflatten_state(decode_shard(whole, 1, 3, where="test")), state_of(3, 1))
    assert whole.size == shard.nbytes
    rng = np.random.default_rng(0)
    for start in [
        0,
        1,
        whole.size - 5,
        whole.size,
        whole.size + 3,
        *rng.integers(0, whole.size, 20),
    ]:
        out = np.full(int(rng.integers(1, 200)), 7, dtype=np.uint8)
        shard.read_into(int(start), out)
        expect = np.zeros(out.size, dtype=np.uint8)
        have = whole[start : start + out.size]
        expect[: have.size] = have
        assert np.array_equal(out, expect), start


def test_young_daly_interval():
    # Young's first-order optimum sqrt(2CM) when C << M; Daly's correction is small there
    assert young_daly_interval(10.0, 86400.0) == pytest.approx(np.sqrt(2 * 10 * 86400), rel=0.01)
    c, m = 60.0, 3600.0
    r = c / (2 * m)
    assert young_daly_interval(c, m) == pytest.approx(
        np.sqrt(2 * c * m) * (1 + np.sqrt(r) / 3 + r / 9) - c
    )
    assert young_daly_interval(100.0, 40.0) == 40.0  # C >= 2M: checkpoint every MTBF
    for bad in (0, -1.0, float("nan"), "1"):
        with pytest.raises(CheckpointError, match="positive number"):
            young_daly_interval(bad, 10.0)


def test_suggest_interval_uses_measured_cost(comm, tmp_path):
    with Checkpointer(shared_dir(comm, tmp_path) / "yd", comm=comm, levels=["local"]) as ck:
        with pytest.raises(CheckpointError, match="save once first"):
            ck.suggest_interval(3600.0)
        ck.save(1, state_of(comm.Get_rank(), 1)).wait()
        cost = ck.timings["local"][0]
        assert ck.suggest_interval(3600.0) == pytest.approx(young_daly_interval(cost, 3600.0))
        with pytest.raises(CheckpointError, match="not in use"):
            ck.suggest_interval(3600.0, level="hdf5")


def test_bad_input(comm, tmp_path):
    root = shared_dir(comm, tmp_path)
    with pytest.raises(CheckpointError, match="unknown level"):
        Checkpointer(root / "a", comm=comm, levels=["tape"])
    with pytest.raises(CheckpointError, match="positive integer"):
        Checkpointer(root / "b", comm=comm, policy={"every": {"local": 0}})
    with pytest.raises(CheckpointError, match=r"policy.keep.local must be a positive integer"):
        Checkpointer(root / "b", comm=comm, policy={"keep": {"local": -2}})
    with pytest.raises(CheckpointError, match="'hdf5' is not one of the levels"):
        Checkpointer(root / "b", comm=comm, policy={"every": {"hdf5": 5}})
    with pytest.raises(CheckpointError, match="xor_group must be an integer >= 2"):
        Checkpointer(root / "b", comm=comm, levels=["xor"], policy={"xor_group": 1})
    with pytest.raises(CheckpointError, match=r"policy\.recycle must be true or false, not 'no'"):
        Checkpointer(root / "b", comm=comm, policy={"recycle": "no"})
    with pytest.raises(CheckpointError, match="distinct"):
        Checkpointer(root / "b", comm=comm, levels=["local", "local"])
    if comm.Get_size() == 1:
        with pytest.raises(CheckpointError, match="partner level needs at least 2 nodes"):
            Checkpointer(root / "b", comm=comm, levels=["partner"])
    with Checkpointer(root / "c", comm=comm) as ck:
        with pytest.raises(CheckpointError, match=r"'model/opt'.*unsupported type set"):
            ck.save(1, {"model": {"opt": {1, 2}}})
        with pytest.raises(CheckpointError, match=r"'x'.*arrays of Python objects"):
            ck.save(1, {"x": np.array([None, 1], dtype=object)})
        with pytest.raises(CheckpointError, match="step must be"):
            ck.save(-1, {})
        with pytest.raises(CheckpointError, match="no recoverable"):
            ck.restore()
    if comm.Get_rank() == 0:
        (root / "d").mkdir()
        (root / "d" / "hpcpar-checkpoint.json").write_text(
            json.dumps({"format": "hpcpar-checkpoint", "ranks": 99})
        )
    comm.Barrier()
    # a directory of a job with another rank count opens (its versions reshard)
    ck = Checkpointer(root / "d", comm=comm)
    with ck, pytest.raises(CheckpointError, match="no recoverable"):
        ck.restore()
