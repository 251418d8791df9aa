"""Partner, XOR and HDF5 levels under injected faults, on 2-4 virtual nodes.

Each test saves versions with every rank's state drawn from its own seed, damages the
checkpoint as a failure would, restores in a fresh Checkpointer (as a restarted job
would) and checks the version, every array bit for bit against the seeded original,
and the level that served each rank.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hpcpar.checkpoint import Checkpointer, CheckpointError, faults
from states import same, shared_dir

import hpcpar
from hpcpar.testing import assert_all

pytestmark = pytest.mark.mpi

SIZE = hpcpar.default_comm().Get_size()
LAYOUTS = {2: ["ppn:1"], 3: ["ppn:1", "nodes:2,1"], 4: ["ppn:1", "ppn:2", "nodes:2,1,1"]}.get(
    SIZE, ["ppn:1"]
)
# XOR sets need every node's ranks matched by ranks of other nodes (nodes:2,1 cannot)
XOR_LAYOUTS = [x for x in LAYOUTS if x != "nodes:2,1"]
needs_nodes = pytest.mark.skipif(SIZE < 2, reason="needs 2+ ranks to simulate 2+ nodes")


def state_of(rank, step):
    rng = np.random.default_rng([rank, step, 7])
    return {
        "w": rng.standard_normal((64 + 13 * rank, 3)).astype(np.float32),
        "opt": {"m": rng.integers(-5, 5, 100 + rank), "t": step},
        "tag": f"r{rank}",
    }


def save_versions(root, h, levels, steps=(1, 2, 3), policy=None):
    rank = h.comm.Get_rank()
    with Checkpointer(root, comm=h, levels=levels, policy=policy) as ck:
        for step in steps:
            ck.save(step, state_of(rank, step)).wait()


def on_rank0(comm, action):
    if comm.Get_rank() == 0:
        action()
    comm.Barrier()


def restore(root, h, levels, step=None, policy=None):
    with Checkpointer(root, comm=h, levels=levels, policy=policy) as ck:
        got_step, got = ck.restore(step)
        return got_step, got, ck.restored_from


def check(comm, got_step, got, expect_step, served, expect_served):
    rank = comm.Get_rank()
    assert_all(got_step == expect_step, f"restored {got_step}, expected {expect_step}", comm)
    assert_all(same(got, state_of(rank, expect_step)), "restored state differs", comm)
    assert_all(served == expect_served, f"served by {served}, expected {expect_served}", comm)


@pytest.mark.reliability("fault")
@needs_nodes
@pytest.mark.parametrize("layout", LAYOUTS)
def test_lost_node_is_served_by_partner_copies(comm, tmp_path, layout):
    root = shared_dir(comm, tmp_path) / "p"
    with hpcpar.Hierarchy(comm, layout=layout) as h:
        save_versions(root, h, ["local", "partner"])
        lost = h.n_nodes - 1
        on_rank0(comm, lambda: faults.delete_node(root, lost))
        step, got, served = restore(root, h, ["local", "partner"])
        expect = ["partner" if n == lost else "local" for n in h.node_of]
        check(comm, step, got, 3, served, expect)


@pytest.mark.reliability("fault")
@needs_nodes
@pytest.mark.parametrize("layout", XOR_LAYOUTS)
def test_lost_node_is_rebuilt_from_xor_parity(comm, tmp_path, layout):
    root = shared_dir(comm, tmp_path) / "x"
    with hpcpar.Hierarchy(comm, layout=layout) as h:
        save_versions(root, h, ["local", "xor"])
        on_rank0(comm, lambda: faults.delete_node(root, 0))
        step, got, served = restore(root, h, ["local", "xor"])
        expect = ["xor" if n == 0 else "local" for n in h.node_of]
        check(comm, step, got, 3, served, expect)


@needs_nodes
@pytest.mark.parametrize("piece, word", [(24, 8), (40, 1)])
def test_xor_rebuilds_in_pieces_and_from_parity_of_odd_chunks(
    comm, tmp_path, monkeypatch, piece, word
):
    """Pieces far smaller than a shard (the last one shorter), and parity whose chunks
    are not whole words (as hpcpar wrote it before: the rebuild XORs bytes then)."""
    from hpcpar.checkpoint import parity
    from hpcpar.checkpoint.levels import xor

    monkeypatch.setattr(xor, "PIECE_BYTES", piece)
    monkeypatch.setattr(parity, "WORD", word)
    root = shared_dir(comm, tmp_path) / "xp"
    with hpcpar.Hierarchy(comm, layout="ppn:1") as h:  # sets of every rank: m = size
        save_versions(root, h, ["local", "xor"])
        monkeypatch.setattr(parity, "WORD", 8)  # restored by this version
        on_rank0(comm, lambda: faults.delete_node(root, 0))
        step, got, served = restore(root, h, ["local", "xor"])
        expect = ["xor" if n == 0 else "local" for n in h.node_of]
        check(comm, step, got, 3, served, expect)


@pytest.mark.reliability("fault")
@needs_nodes
def test_a_rebuild_that_fails_its_checks_is_refused_on_every_rank(comm, tmp_path, monkeypatch):
    from hpcpar.checkpoint.levels import xor

    rebuild = xor.XorLevel._rebuild

    def damaged(self, *args):
        out = rebuild(self, *args)
        if out is not None:
            out[out.size // 2] ^= 1  # one bit of the rebuilt shard
        return out

    monkeypatch.setattr(xor.XorLevel, "_rebuild", damaged)
    root = shared_dir(comm, tmp_path) / "xd"
    with hpcpar.Hierarchy(comm, layout="ppn:1") as h:
        save_versions(root, h, ["local", "xor"], steps=(1,))
        on_rank0(comm, lambda: faults.delete_node(root, 0))
        with pytest.raises(CheckpointError, match="XOR rebuild failed its checks"):
            restore(root, h, ["local", "xor"])


@pytest.mark.reliability("fault")
@needs_nodes
@pytest.mark.parametrize("layout", XOR_LAYOUTS)
def test_two_lost_nodes_of_one_xor_group_fall_to_hdf5(comm, tmp_path, layout):
    from hpcpar.checkpoint.levels import Job
    from hpcpar.checkpoint.levels.xor import xor_sets

    root = shared_dir(comm, tmp_path) / "x2"
    with hpcpar.Hierarchy(comm, layout=layout) as h:
        save_versions(root, h, ["local", "xor"], steps=(1,))
        save_versions(root, h, ["local", "xor", "hdf5"], steps=(2, 3))
        lost = {0, 1}  # one XOR group: the default group has 4 nodes

        def damage():
            for node in lost:
                faults.delete_node(root, node)

        on_rank0(comm, damage)
        step, got, served = restore(root, h, ["local", "xor", "hdf5"])
        # a set that lost one member rebuilds it; a set that lost two needs HDF5
        sets = xor_sets(Job(comm, list(h.node_of), root, root), 4)
        gone = {r for r, n in enumerate(h.node_of) if n in lost}
        expect = [
            "local" if r not in gone else "xor" if len(gone & set(s)) == 1 else "hdf5"
            for r in range(comm.Get_size())
            for s in sets
            if r in s
        ]
        assert "hdf5" in expect
        check(comm, step, got, 3, served, expect)
        # without the HDF5 level nothing can rebuild those ranks: a clear error
        with pytest.raises(CheckpointError, match=r"no recoverable version .*XOR set .* lost"):
            restore(root, h, ["local", "xor"])


def test_xor_refuses_a_layout_it_cannot_protect(comm, tmp_path):
    root = shared_dir(comm, tmp_path) / "bad"
    layout = "nodes:2,1" if comm.Get_size() == 3 else None
    message = "rank 1 has no partner" if layout else "xor level needs at least 2 nodes"
    if comm.Get_size() not in (1, 3):
        pytest.skip("the impossible layouts tried are at 1 and 3 ranks")
    with (
        hpcpar.Hierarchy(comm, layout=layout or "ppn:1") as h,
        pytest.raises(CheckpointError, match=message),
    ):
        Checkpointer(root, comm=h, levels=["local", "xor"])


@pytest.mark.reliability("fault")
@needs_nodes
@pytest.mark.parametrize("fault", ["flip", "truncate"])
def test_damaged_shard_is_served_by_the_next_level(comm, tmp_path, fault):
    size = comm.Get_size()
    root = shared_dir(comm, tmp_path) / fault
    with hpcpar.Hierarchy(comm, layout="ppn:1") as h:
        save_versions(root, h, ["local", "partner", "hdf5"])
        path = faults.shard_path(root, "local", 3, size - 1, node=size - 1)
        if fault == "flip":
            on_rank0(comm, lambda: faults.flip_bytes(path, offset=17))
        else:
            on_rank0(comm, lambda: faults.truncate_manifest(path))
        # the partner level's own shard is a hard link of the same file: damaged too;
        # the copy kept by the next node serves the rank
        step, got, served = restore(root, h, ["local", "partner", "hdf5"])
        check(comm, step, got, 3, served, ["local"] * (size - 1) + ["partner"])


@needs_nodes
@pytest.mark.parametrize("piece", [40, 256 << 10])
def test_every_rank_is_served_by_its_partner_copy_at_once(comm, tmp_path, monkeypatch, piece):
    """Every rank's own shard damaged, every copy whole: all copies travel at once (at 2
    ranks each holds the other's), in pieces of 40 B and of 256 KiB (1 MiB shards: MPI's
    rendezvous protocol, where a send waits for its receive)."""
    from hpcpar.checkpoint.levels import partner

    monkeypatch.setattr(partner, "PIECE_BYTES", piece)
    rank, size = comm.Get_rank(), comm.Get_size()
    state = {"w": np.random.default_rng(rank).standard_normal(1 << 17), "r": rank}
    root = shared_dir(comm, tmp_path) / "pall"
    with hpcpar.Hierarchy(comm, layout="ppn:1") as h:
        with Checkpointer(root, comm=h, levels=["local", "partner"]) as ck:
            ck.save(1, state).wait()

        def damage():
            for r in range(size):  # (the partner level's own shard is the same file)
                faults.flip_bytes(faults.shard_path(root, "local", 1, r, node=r), offset=9)

        on_rank0(comm, damage)
        step, got, served = restore(root, h, ["local", "partner"])
        assert_all(step == 1 and same(got, state), "restored state differs", comm)
        assert_all(served == ["partner"] * size, f"served by {served}", comm)


@pytest.mark.reliability("fault")
@needs_nodes
def test_damage_everywhere_falls_back_to_an_older_version(comm, tmp_path):
    size = comm.Get_size()
    root = shared_dir(comm, tmp_path) / "old"
    with hpcpar.Hierarchy(comm, layout="ppn:1") as h:
        save_versions(root, h, ["local", "partner"])

        def damage():
            faults.flip_bytes(faults.shard_path(root, "local", 3, 0, node=0), offset=5)
            copy = root / "nodes" / "node1" / "partner" / f"v{3:012d}" / "copy-rank0.shard"
            faults.flip_bytes(copy, offset=5)

        on_rank0(comm, damage)
        step, got, served = restore(root, h, ["local", "partner"])
        check(comm, step, got, 2, served, ["local"] * size)


@pytest.mark.reliability("fault")
@needs_nodes
def test_enospc_on_one_rank_commits_nothing_there_and_loses_nothing(comm, tmp_path):
    rank, size = comm.Get_rank(), comm.Get_size()
    root = shared_dir(comm, tmp_path) / "full"
    with hpcpar.Hierarchy(comm, layout="ppn:1") as h:
        with Checkpointer(root, comm=h, levels=["local", "hdf5"]) as ck:
            ck.save(1, state_of(rank, 1)).wait()
            ck.fault = faults.Fault(enospc="local", step=2, rank=size - 1)
            handle = ck.save(2, state_of(rank, 2))
            with pytest.raises(CheckpointError, match=r"not committed at local: rank .*space"):
                handle.wait()
            assert_all(ck.committed() == {"local": [1], "hdf5": [2, 1]}, f"{ck.committed()}", comm)
        leftovers = list(root.glob("nodes/*/local/v000000000002/*"))
        assert_all(not leftovers, f"files of the failed version remain: {leftovers}", comm)
        step, got, served = restore(root, h, ["local", "hdf5"])
        check(comm, step, got, 2, served, ["hdf5"] * size)
        step, got, served = restore(root, h, ["local", "hdf5"], step=1)
        check(comm, step, got, 1, served, ["local"] * size)


@pytest.mark.reliability("fault")
@needs_nodes
@pytest.mark.parametrize("first", ["partner", "local"])  # own write fails / the copy's does
def test_enospc_at_the_partner_level_fails_it_without_a_hang(comm, tmp_path, monkeypatch, first):
    """Shards sent in many small pieces; one rank's write fails at the partner level
    (its own shard when partner is written first, else the copy it holds: the own shard
    is then a hard link). Every piece is still received, the save reports the failure,
    and the copies of the previous version still rebuild a lost node."""
    from hpcpar.checkpoint.levels import partner

    monkeypatch.setattr(partner, "PIECE_BYTES", 64)
    rank, size = comm.Get_rank(), comm.Get_size()
    root = shared_dir(comm, tmp_path) / "pfull"
    levels = ["partner", "hdf5"] if first == "partner" else ["local", "partner", "hdf5"]
    with hpcpar.Hierarchy(comm, layout="ppn:1") as h:
        with Checkpointer(root, comm=h, levels=levels) as ck:
            ck.save(1, state_of(rank, 1)).wait()
            ck.fault = faults.Fault(enospc="partner", step=2, rank=size - 1)
            handle = ck.save(2, state_of(rank, 2))
            with pytest.raises(CheckpointError, match=r"not committed at partner: rank .*space"):
                handle.wait()
            assert_all(ck.committed()["partner"] == [1], f"{ck.committed()}", comm)
        on_rank0(comm, lambda: faults.delete_node(root, 0))
        step, got, served = restore(root, h, ["local", "partner"], step=1)
        check(comm, step, got, 1, served, ["partner" if n == 0 else first for n in h.node_of])


@needs_nodes
def test_policy_intervals_and_keep_counts(comm, tmp_path):
    root = shared_dir(comm, tmp_path) / "pol"
    policy = {"every": {"partner": 2, "hdf5": 3}, "keep": {"local": 3, "partner": 1}}
    with hpcpar.Hierarchy(comm, layout="ppn:1") as h:
        save_versions(root, h, ["memory", "local", "partner", "hdf5"], range(1, 8), policy)
        with Checkpointer(root, comm=h, levels=["local", "partner", "hdf5"], policy=policy) as ck:
            assert_all(
                ck.committed() == {"local": [7, 6, 5], "partner": [7], "hdf5": [7, 4]},
                f"{ck.committed()}",
                comm,
            )
        on_rank0(comm, lambda: faults.delete_node(root, 0))
        step, got, served = restore(root, h, ["local", "partner", "hdf5"])
        expect = ["partner" if n == 0 else "local" for n in h.node_of]
        check(comm, step, got, 7, served, expect)


@needs_nodes
def test_xor_sets_lie_on_distinct_nodes(comm):
    from hpcpar.checkpoint.levels import Job
    from hpcpar.checkpoint.levels.xor import xor_sets

    for layout in XOR_LAYOUTS:
        with hpcpar.Hierarchy(comm, layout=layout) as h:
            job = Job(comm, list(h.node_of), Path("."), Path("."))
            for k in (2, 4):
                sets = xor_sets(job, k)
                flat = sorted(r for s in sets for r in s)
                assert flat == list(range(comm.Get_size())), (layout, k, sets)
                for s in sets:
                    nodes = [h.node_of[r] for r in s]
                    assert len(s) >= 2 and len(set(nodes)) == len(nodes), (layout, k, sets)


def sized_state(rank, step, n):
    rng = np.random.default_rng([rank, step, 11])
    return {"w": rng.standard_normal(n), "step": step}


@pytest.mark.parametrize("recycle", [True, False])
def test_pruned_files_are_written_over_by_later_versions(comm, tmp_path, recycle):
    """A pruned shard becomes the spare the next version writes over (same inode); a
    shorter version cuts the old tail off, a longer one grows it; every restore is exact."""
    from hpcpar.checkpoint.inspect import verify

    rank, size = comm.Get_rank(), comm.Get_size()
    root = shared_dir(comm, tmp_path) / f"rec{int(recycle)}"
    levels = ["local", "partner"] if size > 1 else ["local"]
    policy = {"keep": {name: 1 for name in levels}, "recycle": recycle}
    sizes = {1: 5000, 2: 3000, 3: 1000, 4: 7000, 5: 20}
    with hpcpar.Hierarchy(comm, layout="ppn:1") as h:
        with Checkpointer(root, comm=h, levels=levels, policy=policy) as ck:
            local = ck.levels[0]
            inodes = {}
            for step, n in sizes.items():
                spare = local.spare(local.own_path(step))
                before = spare.stat().st_ino if spare.exists() else None
                ck.save(step, sized_state(rank, step, n)).wait()
                inodes[step] = local.own_path(step).stat().st_ino
                if step >= 3 and recycle:
                    assert_all(before is not None, f"no spare before step {step}", comm)
                reused = before == inodes[step]
                assert_all(reused == (recycle and before is not None), f"step {step}", comm)
                got_step, got = ck.restore()
                assert_all(got_step == step, f"restored {got_step}", comm)
                assert_all(same(got, sized_state(rank, step, n)), f"step {step} differs", comm)
            spares = list(root.glob("nodes/*/*/.spare/*"))
            assert_all(bool(spares) == recycle, f"spares: {spares}", comm)
        with Checkpointer(root, comm=h, levels=levels, policy=policy) as again:
            got_step, got = again.restore()  # from the files, in a new checkpointer
            assert_all(same(got, sized_state(rank, 5, 20)), "restart differs", comm)
        if rank == 0:
            rows = verify(root)
            assert rows and not [row for row in rows if row[4]], rows
        comm.Barrier()


def test_files_of_versions_that_never_committed_are_removed(comm, tmp_path):
    """A job killed while writing leaves files of a version with no marker; once a newer
    version commits they are deleted (temporary names too), newer ones are left alone."""
    import shutil

    rank, size = comm.Get_rank(), comm.Get_size()
    root = shared_dir(comm, tmp_path) / "orphans"
    levels = ["local", "partner", "hdf5"] if size > 1 else ["local", "hdf5"]
    with hpcpar.Hierarchy(comm, layout="ppn:1") as h:
        save_versions(root, h, levels, steps=(1, 2))

        def fake_crashes():  # copies of version 2's files as versions 3 and 9, uncommitted
            for level in levels:
                for old in sorted(root.glob(f"**/{level}/v{2:012d}")):
                    for step in (3, 9):
                        new = old.with_name(f"v{step:012d}")
                        shutil.copytree(old, new)
                        for path in new.glob("rank*"):
                            path.rename(path.with_name(f".{path.name}.tmp"))
                            break  # one file as a write cut short, the rest whole

        on_rank0(comm, fake_crashes)
        with Checkpointer(root, comm=h, levels=levels) as ck:
            assert_all(ck.committed()["local"] == [2, 1], f"{ck.committed()}", comm)
            ck.save(4, state_of(rank, 4)).wait()
        left = {p.name for p in root.glob("**/v*") if p.is_dir()}
        assert_all(f"v{3:012d}" not in left, f"version 3 left: {sorted(left)}", comm)
        assert_all(f"v{9:012d}" in left, "version 9 (newer) was removed", comm)
        unused = list(root.glob("nodes/*/hdf5"))  # the HDF5 level keeps no spares
        assert_all(not unused, f"HDF5 spares: {unused}", comm)
        step, got, served = restore(root, h, levels)
        check(comm, step, got, 4, served, ["local"] * size)
