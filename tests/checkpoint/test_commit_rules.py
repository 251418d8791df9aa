"""What a commit promises: every committed version can be restored, or the save fails.

Large steps, a commit marker that cannot be written, two jobs in one directory, a new
run into an old run's directory, ranks that disagree on the step: each either commits a
version that ``restore()`` returns, or fails on every rank with ``CheckpointError``.
"""

from __future__ import annotations

import errno

import numpy as np
import pytest
from hpcpar.checkpoint import Checkpointer, CheckpointError
from hpcpar.checkpoint import saving as saving_module
from hpcpar.checkpoint.inspect import scan
from hpcpar.checkpoint.shard import write_atomic
from states import same, shared_dir

from hpcpar.testing import assert_all

pytestmark = pytest.mark.mpi


def state_of(rank, step):
    return {"w": np.full(5, float(step * 10 + rank)), "step": step}


def _raises_everywhere(comm, action, match):
    try:
        action()
    except CheckpointError as exc:
        ok, text = match in str(exc), str(exc)
    else:
        ok, text = False, "no error"
    assert_all(ok, f"expected {match!r} on every rank, got: {text}", comm)


@pytest.mark.parametrize("step", [10**12, 10**15 + 7, 2**64 - 1])
def test_any_64_bit_step_is_committed_and_restored(comm, tmp_path, step):
    rank = comm.Get_rank()
    root = shared_dir(comm, tmp_path) / "big"
    with Checkpointer(root, comm=comm, levels=["local"]) as ck:
        ck.save(999_999_999_999, state_of(rank, 1)).wait()  # 12 digits, sorts below
        ck.save(step, state_of(rank, 2)).wait()
        assert_all(ck.versions() == [step, 999_999_999_999], str(ck.versions()), comm)
    with Checkpointer(root, comm=comm, levels=["local"]) as again:
        got_step, got = again.restore()
        assert_all(got_step == step and same(got, state_of(rank, 2)), f"got {got_step}", comm)
    if rank == 0:
        files = scan(root)["levels"]["local"]["files"][step]
        assert len([f for f in files if f[0] == "shard"]) == comm.Get_size()


def test_steps_beyond_64_bits_and_negative_are_refused(comm, tmp_path):
    root = shared_dir(comm, tmp_path) / "range"
    with Checkpointer(root, comm=comm, levels=["local"]) as ck:
        for bad in (2**64, -1, 1.5, True):
            _raises_everywhere(comm, lambda bad=bad: ck.save(bad, {"x": 1}), "step must be")
        ck.save(np.int64(3), {"x": 1}).wait()  # numpy integers are steps too
        assert_all(ck.versions() == [3], str(ck.versions()), comm)


def test_ranks_passing_different_steps_fail_together(comm, tmp_path):
    if comm.Get_size() < 2:
        pytest.skip("needs 2+ ranks to disagree")
    root = shared_dir(comm, tmp_path) / "disagree"
    rank = comm.Get_rank()
    with Checkpointer(root, comm=comm, levels=["local"]) as ck:
        _raises_everywhere(comm, lambda: ck.save(3 + (rank == 1), {"x": 1}), "different steps")
        ck.save(5, {"x": 1}).wait()  # the checkpointer is still usable
        assert_all(ck.versions() == [5], str(ck.versions()), comm)


def test_a_bad_state_on_one_rank_fails_every_rank(comm, tmp_path):
    root = shared_dir(comm, tmp_path) / "onebad"
    rank = comm.Get_rank()
    last = comm.Get_size() - 1
    with Checkpointer(root, comm=comm, levels=["local"]) as ck:
        state = {"x": object()} if rank == last else {"x": 1}
        _raises_everywhere(comm, lambda: ck.save(1, state), f"rank {last}: state key 'x'")


@pytest.mark.reliability("fault")
def test_an_unwritable_commit_marker_fails_every_rank(comm, tmp_path, monkeypatch):
    rank = comm.Get_rank()
    root = shared_dir(comm, tmp_path) / "full"
    real = saving_module.write_atomic

    def full_disk(path, text):
        if path.name.endswith(".committed") and "000000000002" in path.name:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, text)

    monkeypatch.setattr(saving_module, "write_atomic", full_disk)
    with Checkpointer(root, comm=comm, levels=["local"]) as ck:
        ck.save(1, state_of(rank, 1)).wait()
        handle = ck.save(2, state_of(rank, 2))
        _raises_everywhere(comm, handle.wait, "No space left on device")
        assert_all(ck.versions() == [1], f"versions {ck.versions()}", comm)
        got_step, got = ck.restore()  # the files hold 1 only
        ck.save(3, state_of(rank, 3)).wait()
        assert_all(ck.versions() == [3, 1], f"after: {ck.versions()}", comm)
    leftovers = [p.name for p in root.rglob("*") if p.name.endswith(".tmp")]
    assert_all(not leftovers, f"temporary files left: {leftovers}", comm)
    assert_all(got_step == 1 and same(got, state_of(rank, 1)), f"restored {got_step}", comm)


def test_write_atomic_leaves_no_temporary_file(tmp_path, monkeypatch):
    target = tmp_path / "v000000000001.committed"

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("hpcpar.checkpoint.shard.os.fsync", no_space)
    with pytest.raises(OSError):
        write_atomic(target, "{}")
    assert list(tmp_path.iterdir()) == []


def test_a_second_checkpointer_on_one_directory_is_refused(comm, tmp_path):
    root = shared_dir(comm, tmp_path) / "twice"
    with Checkpointer(root, comm=comm, levels=["local"]) as ck:
        ck.save(1, {"x": 1}).wait()
        _raises_everywhere(comm, lambda: Checkpointer(root, comm=comm), "is in use by process")
    with Checkpointer(root, comm=comm, levels=["local"]) as again:  # released on close
        assert_all(again.versions() == [1], "reopened", comm)


def test_a_new_run_cannot_save_below_the_old_runs_versions(comm, tmp_path):
    rank = comm.Get_rank()
    root = shared_dir(comm, tmp_path) / "rerun"
    with Checkpointer(root, comm=comm, levels=["local"]) as old:
        for step in (10, 20):
            old.save(step, state_of(rank, step)).wait()
    with Checkpointer(root, comm=comm, levels=["local"]) as new:
        _raises_everywhere(comm, lambda: new.save(5, state_of(rank, 5)), "not newer than")
        _raises_everywhere(comm, lambda: new.save(20, state_of(rank, 20)), "not newer than")
        new.save(21, state_of(rank, 21)).wait()
        got_step, _ = new.restore()
        assert_all(got_step == 21, f"restored {got_step}", comm)
    with Checkpointer(root, comm=comm, levels=["local"], overwrite=True) as fresh:
        assert_all(fresh.versions() == [], f"overwrite left {fresh.versions()}", comm)
        fresh.save(1, state_of(rank, 1)).wait()
    with Checkpointer(root, comm=comm, levels=["local"]) as after:
        got_step, got = after.restore()
        assert_all(got_step == 1 and same(got, state_of(rank, 1)), f"got {got_step}", comm)


def test_saving_after_restoring_an_older_version_discards_the_newer(comm, tmp_path):
    rank = comm.Get_rank()
    root = shared_dir(comm, tmp_path) / "rollback"
    policy = {"keep": {"local": 5}}
    with Checkpointer(root, comm=comm, levels=["local"], policy=policy) as ck:
        for step in (1, 2, 3):
            ck.save(step, state_of(rank, step)).wait()
    with Checkpointer(root, comm=comm, levels=["local"], policy=policy) as ck:
        got_step, _ = ck.restore(step=2)
        _raises_everywhere(comm, lambda: ck.save(2, state_of(rank, 2)), "not newer than")
        ck.save(4, state_of(rank, 40)).wait()
        assert_all(ck.versions() == [4, 2, 1], f"versions {ck.versions()}", comm)
    with Checkpointer(root, comm=comm, levels=["local"], policy=policy) as ck:
        got_step, got = ck.restore()
        assert_all(got_step == 4 and same(got, state_of(rank, 40)), f"got {got_step}", comm)


def test_another_rank_count_opens_the_directory_and_may_start_a_new_run(comm, tmp_path):
    root = shared_dir(comm, tmp_path) / "ranks"
    if comm.Get_rank() == 0:
        root.mkdir()
        write_atomic(
            root / "hpcpar-checkpoint.json", '{"format": "hpcpar-checkpoint", "ranks": 99}'
        )
    comm.Barrier()
    with Checkpointer(root, comm=comm, levels=["local"]) as ck:  # its versions would reshard
        assert_all(ck.versions() == [], "nothing committed", comm)
    with Checkpointer(root, comm=comm, levels=["local"], overwrite=True) as ck:
        ck.save(1, {"x": 1}).wait()
        assert_all(ck.versions() == [1], "new run", comm)
