"""Elastic restart: a version saved by N ranks restored on every N' in 1..4 (sub-groups
of the job's ranks play the two jobs), from each file level, after a node's storage is
lost, for 1-D, 2-D and uneven blocks cut along each axis; every block is checked bit for
bit against the global array it came from."""

from __future__ import annotations

import json
import math
import os
import shutil

import numpy as np
import pytest
from hpcpar.checkpoint import Checkpointer, CheckpointError, Replicated, Sharded
from hpcpar.checkpoint.sharding import even_block
from states import shared_dir

import hpcpar

pytestmark = pytest.mark.mpi

SIZE = hpcpar.default_comm().Get_size()


def global_arrays():
    rng = np.random.default_rng(5)
    return {
        "v": rng.standard_normal(1001),  # 1-D, uneven
        "rows": rng.integers(-9, 9, (13, 5)).astype(np.int32),  # 2-D cut along axis 0
        "cols": rng.standard_normal((6, 11)).astype(np.float32),  # 2-D cut along axis 1
        "grid": np.arange(7 * 9 * 2, dtype=np.int64).reshape(7, 9, 2),  # cut along 0 and 1
    }


def grid_block(shape, rank, size):
    """An uneven two-axis decomposition: rank r of size gets a block of a 2 x ceil grid."""
    if size == 1:
        return (0, 0, 0), shape
    rows = 2
    cols = math.ceil(size / rows)
    i, j = divmod(rank, cols)
    r_off, r_len = even_block(shape, 0, i, rows)[0][0], even_block(shape, 0, i, rows)[1][0]
    last_row = size - cols  # the ranks of the second row (fewer when size is odd)
    n = cols if i == 0 else last_row
    c = even_block(shape, 1, j, n)
    return (r_off, c[0][1], 0), (r_len, c[1][1], shape[2])


def state_for(rank, size):
    g = global_arrays()
    out = {}
    for name, axis in (("v", 0), ("rows", 0), ("cols", 1)):
        off, shp = even_block(g[name].shape, axis, rank, size)
        box = tuple(slice(o, o + n) for o, n in zip(off, shp, strict=True))
        out[name] = Sharded(g[name][box].copy(), g[name].shape, off)
    off, shp = grid_block(g["grid"].shape, rank, size)
    box = tuple(slice(o, o + n) for o, n in zip(off, shp, strict=True))
    return {
        "params": [out["v"], (out["rows"], out["cols"])],
        "grid": Sharded(g["grid"][box].copy(), g["grid"].shape, off),
        "model": Replicated(np.linspace(0, 1, 37)),
        "meta": {"epoch": 3, "names": ["a", "b"], "none": None, "pair": (1, 2.5)},
    }


def check_block(leaf, name):
    g = global_arrays()[name]
    box = tuple(slice(o, o + n) for o, n in zip(leaf.offset, leaf.block.shape, strict=True))
    assert isinstance(leaf, Sharded) and leaf.global_shape == g.shape
    assert leaf.block.dtype == g.dtype and np.array_equal(leaf.block, g[box]), name


def in_group(comm, n, work):
    """Run ``work(sub)`` on the first ``n`` ranks (a job of ``n`` ranks), then meet."""
    rank = comm.Get_rank()
    sub = comm.Split(0 if rank < n else 1, rank)
    try:
        if rank < n:
            work(sub)
    finally:
        sub.Free()
        comm.Barrier()


def save_at(root, comm, n, levels, step=1):
    def work(sub):
        with (
            hpcpar.Hierarchy(sub, layout="ppn:1") as h,
            Checkpointer(root, comm=h, levels=levels, overwrite=True) as ck,
        ):
            ck.save(step, state_for(sub.Get_rank(), n)).wait()

    in_group(comm, n, work)


def restore_at(root, comm, n, levels, expect_from, old):
    def work(sub):
        with (
            hpcpar.Hierarchy(sub, layout="ppn:1") as h,
            Checkpointer(root, comm=h, levels=levels) as ck,
        ):
            step, got = ck.restore()
            assert step == 1
            (v, (rows, cols)) = got["params"]
            for leaf, name in ((v, "v"), (rows, "rows"), (cols, "cols"), (got["grid"], "grid")):
                check_block(leaf, name)
            assert isinstance(got["params"][1], tuple) and isinstance(got["params"], list)
            assert np.array_equal(np.asarray(got["model"]), np.linspace(0, 1, 37))
            assert got["meta"] == {"epoch": 3, "names": ["a", "b"], "none": None, "pair": (1, 2.5)}
            assert set(ck.restored_from) <= expect_from, ck.restored_from
            # default targets: near-equal blocks along the axis the saved blocks were cut on
            # (axis 0 when they were not cut)
            off, shp = even_block((6, 11), 1 if old > 1 else 0, sub.Get_rank(), n)
            assert cols.offset == off and cols.block.shape == shp

    in_group(comm, n, work)


LEVELS = [
    (["local"], False),
    (["local", "partner"], False),
    (["local", "partner"], True),
    (["local", "xor"], True),
    (["local", "hdf5"], True),
    (["hdf5"], False),
]


@pytest.mark.reliability("fault")
@pytest.mark.parametrize(("levels", "lose_node"), LEVELS)
def test_saved_at_n_restored_at_every_n(comm, tmp_path, levels, lose_node):
    root = shared_dir(comm, tmp_path) / "ck"
    smallest = 2 if len(levels) > 1 and levels[1] in ("partner", "xor") else 1
    if lose_node:
        smallest = max(smallest, 2)
    counts = range(smallest, SIZE + 1)
    if not counts:
        pytest.skip("the level needs 2+ ranks (2+ virtual nodes)")
    for old in counts:
        save_at(root, comm, old, levels)
        if lose_node:  # node old-1 (ppn:1: saved rank old-1) loses its storage
            if comm.Get_rank() == 0:
                shutil.rmtree(root / "nodes" / f"node{old - 1}", ignore_errors=True)
            comm.Barrier()
        for new in range(1, SIZE + 1):
            # one node cannot hold partner or XOR copies: a job of one rank opens the
            # others (a resharding restore reads every level that committed the version)
            usable = levels if new > 1 else [lv for lv in levels if lv not in ("partner", "xor")]
            restore_at(root, comm, new, usable, set(levels), old)


def test_explicit_targets_any_box_and_per_rank_lists(comm, tmp_path):
    root = shared_dir(comm, tmp_path) / "ck"
    rank, size = comm.Get_rank(), comm.Get_size()
    g = global_arrays()["rows"]
    with Checkpointer(root, comm=comm, levels=["local"], overwrite=True) as ck:
        off, shp = even_block(g.shape, 0, rank, size)
        ck.save(
            1,
            {
                "rows": Sharded(g[off[0] : off[0] + shp[0]].copy(), g.shape, off),
                "mine": np.full(rank + 1, rank),
                "tag": f"r{rank}",
            },
        ).wait()
    with Checkpointer(root, comm=comm, levels=["local"]) as ck:
        # any box, overlapping other ranks' boxes: rows rank..rank+4, columns 1..3
        box = ((rank, 1), (5, 3))
        _, got = ck.restore(reshard={"rows": box}, per_rank="all")
        assert got["rows"].offset == box[0]
        assert np.array_equal(got["rows"].block, g[rank : rank + 5, 1:4])
        assert [list(a) for a in got["mine"]] == [[r] * (r + 1) for r in range(size)]
        assert got["tag"] == [f"r{r}" for r in range(size)] if size > 1 else got["tag"] == "r0"
        # per-rank leaves restored on the same number of ranks stay this rank's own
        _, got = ck.restore(reshard=1)
        assert got["tag"] == f"r{rank}" and np.array_equal(got["mine"], np.full(rank + 1, rank))
        assert got["rows"].offset == even_block(g.shape, 1, rank, size)[0]


@pytest.mark.reliability("bad_input")
def test_bad_layouts_are_refused_on_every_rank_and_nothing_is_written(comm, tmp_path):
    root = shared_dir(comm, tmp_path) / "ck"
    rank, size = comm.Get_rank(), comm.Get_size()
    g = np.arange(40.0)
    good = {"x": Sharded(g[rank * 10 // size : (rank + 1) * 10 // size], (10,), rank * 10 // size)}
    bad_states = {
        "overlap": {"x": Sharded(g[:10], (10,), 0)} if size > 1 else None,
        "gap": {"x": Sharded(g[:1], (10,), rank)},
        "global shapes": {"x": Sharded(g[: 10 if rank == 0 else 0], (10 + rank,), 0)}
        if size > 1
        else None,
        "outside": None,
    }
    with Checkpointer(root, comm=comm, levels=["local"], overwrite=True) as ck:
        ck.save(1, good).wait()
        for state in bad_states.values():
            if state is None:
                continue
            with pytest.raises(CheckpointError, match=r"overlap|gap|global shape"):
                ck.save(2, state)
        with pytest.raises(CheckpointError, match="does not fit"):
            Sharded(g[:5], (4,), 0)
        with pytest.raises(CheckpointError, match=r"declared differently|dict keys must"):
            ck.save(
                2,
                {"x": Sharded(g[:10], (10,), 0) if rank == 0 else g[:10]}
                if size > 1
                else {"x": {1: 2}},
            )
        assert ck.versions() == [1]
    with Checkpointer(root, comm=comm, levels=["local"]) as ck:
        for target in ({"x": ((8,), (5,))}, 3, {"x": "row"}):
            with pytest.raises(CheckpointError, match=r"does not fit|does not exist|axis or"):
                ck.restore(reshard=target)
        step, got = ck.restore()  # nothing lost
        assert step == 1 and np.array_equal(got["x"].block, good["x"].block)


@pytest.mark.reliability("bad_input")
def test_per_rank_leaves_on_another_rank_count_are_named(comm, tmp_path):
    if SIZE < 2:
        pytest.skip("needs 2+ ranks to change the rank count")
    root = shared_dir(comm, tmp_path) / "ck"

    def save(sub):
        with Checkpointer(root, comm=sub, levels=["local"], overwrite=True) as ck:
            r = sub.Get_rank()
            ck.save(1, {"w": np.zeros(3) + r, "same": 7, "differs": r}).wait()

    in_group(comm, 2, save)

    def restore(sub):
        with Checkpointer(root, comm=sub, levels=["local"]) as ck:
            with pytest.raises(
                CheckpointError, match=r"per-rank leaves 'differs', 'w'|'w', 'differs'"
            ):
                ck.restore()
            _, got = ck.restore(per_rank="all")
            assert got["same"] == 7 and got["differs"] == [0, 1]
            assert [a.tolist() for a in got["w"]] == [[0.0] * 3, [1.0] * 3]

    in_group(comm, 1, restore)


@pytest.mark.reliability("bad_input")
def test_any_pytree_round_trips_with_its_types_and_other_objects_are_named(tmp_path):
    from hpcpar.checkpoint.state import flatten_state, unflatten_state

    state = {
        "layers": [{"w": np.ones((2, 2)), "b": np.zeros(2)}, {"w": np.eye(3)}],
        "shape": (3, (4, 5), []),
        "empty": {"d": {}, "l": [], "t": ()},
        "scalars": [np.float32(1.5), np.int64(7), True, None, "s", 2**70],
    }
    with Checkpointer(tmp_path / "ck", comm=None, levels=["local"]) as ck:
        ck.save(1, state).wait()
    with Checkpointer(tmp_path / "ck", comm=None, levels=["local"]) as ck:
        _, got = ck.restore()
    assert got["shape"] == (3, (4, 5), []) and isinstance(got["shape"][1], tuple)
    assert got["empty"] == {"d": {}, "l": [], "t": ()}
    assert got["scalars"] == [1.5, 7, True, None, "s", 2**70]
    assert all(
        np.array_equal(a[k], b[k])
        for a, b in zip(got["layers"], state["layers"], strict=True)
        for k in a
    )
    for bad, key in (
        ({"a": [1, {2}]}, "'a/1'"),
        ({"a": {"b": (object(),)}}, "'a/b/0'"),
        ({"a": {3: 1}}, "'a/3'"),
        ({"a": [Sharded]}, "'a/0'"),
    ):
        with pytest.raises(CheckpointError, match=key):
            flatten_state(bad)
    assert unflatten_state(flatten_state({"x": [1, (2,)]})) == {"x": [1, (2,)]}


def test_versions_of_another_rank_count_are_pruned_whole(comm, tmp_path):
    if SIZE < 2:
        pytest.skip("needs 2+ ranks to change the rank count")
    root = shared_dir(comm, tmp_path) / "ck"
    save_at(root, comm, SIZE, ["local", "hdf5"])

    def go_on(sub):
        with (
            hpcpar.Hierarchy(sub, layout="ppn:1") as h,
            Checkpointer(
                root, comm=h, levels=["local", "hdf5"], policy={"keep": {"local": 1, "hdf5": 1}}
            ) as ck,
        ):
            step, got = ck.restore()
            ck.save(step + 1, got).wait()
            ck.save(step + 2, got).wait()

    in_group(comm, SIZE - 1, go_on)
    if comm.Get_rank() == 0:
        left = sorted(str(p.relative_to(root)) for p in root.rglob("v000000000001"))
        assert left == [], left  # every node's folder of the old job's version is gone
        assert len(list(root.glob("nodes/node*/local/v000000000003/*.shard"))) == SIZE - 1
    comm.Barrier()


@pytest.mark.parametrize("lose_node", [False, True])
def test_export_writes_global_arrays_to_one_plain_hdf5_file(comm, tmp_path, lose_node):
    import h5py
    from hpcpar.checkpoint.export import export

    root = shared_dir(comm, tmp_path) / "ck"
    rank, size = comm.Get_rank(), comm.Get_size()
    levels = ["local", "partner"] if size > 1 else ["local"]
    with (
        hpcpar.Hierarchy(comm, layout="ppn:1") as h,
        Checkpointer(root, comm=h, levels=levels) as ck,
    ):
        state = state_for(rank, size)
        state["mine"] = np.arange(4) + rank  # per rank: stacked along a rank axis
        state["odd"] = np.ones(rank + 1)  # per rank, shapes differ: one dataset per rank
        ck.save(9, state).wait()
    if lose_node and size > 1 and rank == 0:
        shutil.rmtree(root / "nodes" / "node0")  # rank 0's shard comes from its partner copy
    comm.Barrier()
    if rank == 0:
        out = tmp_path / "v9.h5"
        assert export(root, out) == 9
        g = global_arrays()
        with h5py.File(out, "r") as f:
            assert f.attrs["step"] == 9 and f.attrs["ranks"] == size
            assert np.array_equal(f["params/0"][()], g["v"])
            assert np.array_equal(f["params/1/0"][()], g["rows"])
            assert np.array_equal(f["params/1/1"][()], g["cols"])
            assert np.array_equal(f["grid"][()], g["grid"]) and f["grid"].dtype == g["grid"].dtype
            assert np.array_equal(f["model"][()], np.linspace(0, 1, 37))
            assert f["model"].attrs["hpcpar_layout"] == "replicated"
            assert np.array_equal(f["mine"][()], np.arange(4)[None, :] + np.arange(size)[:, None])
            odd = [f["odd"][0]] if size == 1 else [f[f"odd/rank{r}"][()] for r in range(size)]
            assert all(np.array_equal(a, np.ones(r + 1)) for r, a in enumerate(odd))
            assert f.attrs["meta/epoch"] == 3
            assert json.loads(f.attrs["hpcpar_metadata"])["meta/names/1"] == "b"
    comm.Barrier()


@pytest.mark.reliability("bad_input")
@pytest.mark.skipif(SIZE > 1, reason="the command line runs in the one-rank session")
def test_export_and_inspect_from_the_command_line(tmp_path, capsys):
    from hpcpar.cli.main import main

    root, out = tmp_path / "ck", tmp_path / "v.h5"
    with Checkpointer(root, comm=None, levels=["local"]) as ck:
        ck.save(3, {"w": Sharded(np.arange(6.0), (6,), 0), "r": Replicated(np.ones(2))}).wait()
    assert main(["checkpoint", "export", str(root), "--to", str(out)]) == 0
    assert "exported version 3" in capsys.readouterr().out
    assert main(["checkpoint", "inspect", str(root)]) == 0
    text = capsys.readouterr().out
    assert "sharded: block at (0,) of (6,)" in text and "replicated" in text
    assert ".tree" not in text and ".layout" not in text
    to = ["--to", str(out), "--force"]  # out exists: replacing it is allowed
    for args, message in (
        (["--step", "8", *to], "version 8"),
        ([], "needs --to"),
        (["--to", str(tmp_path / "no" / "x.h5")], "x.h5"),
    ):
        assert main(["checkpoint", "export", str(root), *args]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "no").exists() and out.exists()  # nothing half-written


@pytest.mark.reliability("bad_input")
@pytest.mark.skipif(SIZE > 1, reason="the command line runs in the one-rank session")
def test_export_never_writes_over_the_checkpoint_a_device_or_a_file_unasked(tmp_path, capsys):
    import h5py
    from hpcpar.checkpoint.inspect import scan

    from hpcpar.cli.main import main

    root, local = tmp_path / "ck", tmp_path / "node-local"
    with Checkpointer(root, comm=None, levels=["local"], local_dir=local) as ck:
        ck.save(3, {"w": np.arange(6.0), "step": 41, "ranks": "mine"}).wait()
    before = {p: p.read_bytes() for p in [*root.rglob("*"), *local.rglob("*")] if p.is_file()}
    metadata = next(p for p in before if p.name == "hpcpar-checkpoint.json")
    shard = next(p for p in before if p.suffix == ".shard")
    kept = tmp_path / "kept.h5"
    kept.write_bytes(b"mine")
    refused = [
        (metadata, "inside the checkpoint's folder"),
        (shard, "inside the checkpoint"),
        (root / "new.h5", "inside the checkpoint"),
        (local / "x.h5", "inside the check"),
        (kept, "exists; pass --force"),
        (tmp_path, "not a regular file"),
    ]
    if os.path.exists("/dev/null"):
        refused.append((type(tmp_path)("/dev/null"), "not a regular file"))
    for to, message in refused:
        assert (
            main(
                [
                    "checkpoint",
                    "export",
                    str(root),
                    "--local-dir",
                    str(local),
                    "--to",
                    str(to),
                    "--force" if to != kept else "--step=3",
                ]
            )
            == 2
        )
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, (to, err)
    after = {p: p.read_bytes() for p in [*root.rglob("*"), *local.rglob("*")] if p.is_file()}
    assert after == before and kept.read_bytes() == b"mine"
    assert scan(root, local)["levels"]["local"]["committed"] == [3]
    # asked to: a regular file is replaced; the state's "step" and "ranks" are kept apart
    assert (
        main(
            [
                "checkpoint",
                "export",
                str(root),
                "--local-dir",
                str(local),
                "--to",
                str(kept),
                "--force",
            ]
        )
        == 0
    )
    with h5py.File(kept, "r") as f:
        assert f.attrs["step"] == 3 and f.attrs["ranks"] == 1
        assert f.attrs["state/step"] == 41 and f.attrs["state/ranks"] == "mine"
        assert np.array_equal(f["w"][0], np.arange(6.0))  # a per-rank array: a rank axis
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.reliability("fault")
@pytest.mark.parametrize("node_local", [False, True])
def test_small_pieces_many_checksum_blocks_and_a_damaged_block(
    comm, tmp_path, monkeypatch, node_local
):
    """Pieces far smaller than the arrays (sends overlap reads, targets not contiguous),
    arrays of several checksum blocks read in part, and a flipped byte in one block: the
    saved rank it belongs to is read again from the next level. With ``node_local`` each
    restoring rank sees only some saved ranks' files (as on nodes with their own disks),
    so the others' parts reach it in messages."""
    from hpcpar.checkpoint import reshard

    monkeypatch.setattr(reshard.move, "PIECE_BYTES", 1 << 16)
    restoring = [1]
    if node_local:
        everything = reshard.find_sources

        def visible_here(*args):
            found = everything(*args)
            me, n = comm.Get_rank(), restoring[0]
            return {r: (v if r % n == me else {}) for r, v in found.items()}

        monkeypatch.setattr(reshard, "find_sources", visible_here)
    root = shared_dir(comm, tmp_path) / "ck"
    rank, size = comm.Get_rank(), comm.Get_size()
    big = np.random.default_rng(1).standard_normal(400_003)  # 3.2 MB: 4 checksum blocks
    wide = np.arange(40 * 3001, dtype=np.int32).reshape(40, 3001)
    off, shp = even_block(big.shape, 0, rank, size)
    woff, wshp = even_block(wide.shape, 0, rank, size)
    state = {
        "big": Sharded(big[off[0] : off[0] + shp[0]].copy(), big.shape, off),
        "wide": Sharded(wide[woff[0] : woff[0] + wshp[0]].copy(), wide.shape, woff),
    }
    with Checkpointer(root, comm=comm, levels=["local", "hdf5"]) as ck:
        ck.save(1, state).wait()
    if rank == 0:  # a byte in the middle of saved rank 0's first array
        from hpcpar.checkpoint import faults

        faults.flip_bytes(faults.shard_path(root, "local", 1, 0), 1 << 19)
    comm.Barrier()

    def restore(sub):
        with Checkpointer(root, comm=sub, levels=["local", "hdf5"]) as ck:
            n = sub.Get_size()
            _, got = ck.restore(reshard={"big": 0, "wide": 1})  # wide: cut the other way
            o, s = even_block(big.shape, 0, sub.Get_rank(), n)
            assert np.array_equal(got["big"].block, big[o[0] : o[0] + s[0]])
            o, s = even_block(wide.shape, 1, sub.Get_rank(), n)
            assert np.array_equal(got["wide"].block, wide[:, o[1] : o[1] + s[1]])
            assert ck.restored_from[0] == "hdf5" and set(ck.restored_from[1:]) <= {"local"}

    for n in range(1, SIZE + 1):
        restoring[0] = n
        in_group(comm, n, restore)
