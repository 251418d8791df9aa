"""Sync data-parallel SGD at 1-4 ranks equals one process with the same global batch."""

from __future__ import annotations

import numpy as np
import pytest
from hpcpar.apps.sgd import SgdError, SyncTrainer, load_dataset, make_model

import hpcpar
from hpcpar.testing import assert_all, layouts_for

pytest.importorskip("sklearn", reason="the bundled datasets come with scikit-learn")
pytestmark = pytest.mark.mpi


def _alone_and_together(comm, layout, steps, **options):
    """Final parameters of ``steps`` sync steps on digits: one process, then all ranks."""
    data = load_dataset("digits")

    def run(c):
        model = make_model("mlp", data.n_features, data.n_classes, hidden=16, seed=4)
        trainer = SyncTrainer(model, data, c, lr=0.05, **options)
        for index in range(steps):
            trainer.train_step(trainer._rows(0, index))
        return model.params

    alone = run(None)
    with hpcpar.Hierarchy(comm, layout=layout) as h:
        return alone, run(h)


@pytest.mark.parametrize("layout", layouts_for(hpcpar.default_comm().Get_size())[:3])
@pytest.mark.parametrize("bucket_bytes", [256, 25 << 20])  # many small buckets, or one
def test_sync_equals_single_process(comm, layout, bucket_bytes):
    alone, together = _alone_and_together(
        comm, layout, 20, batch=12 * comm.Get_size(), bucket_bytes=bucket_bytes
    )
    worst = float(np.abs(together - alone).max())
    assert_all(worst < 1e-10, f"parameters differ by {worst}", comm)


def test_batch_must_divide(comm):
    if comm.Get_size() == 1:
        pytest.skip("every batch divides over one rank")
    data = load_dataset("wine")
    model = make_model("softmax", data.n_features, data.n_classes)
    with pytest.raises(SgdError, match="multiple of the number of ranks"):
        SyncTrainer(model, data, comm, batch=comm.Get_size() * 4 + 1)


def test_local_sgd_reaches_95_percent(comm):
    data = load_dataset("digits")
    model = make_model("mlp", data.n_features, data.n_classes, seed=1)
    trainer = SyncTrainer(
        model, data, comm, batch=32 * comm.Get_size(), lr=0.1, mode="local", local_steps=4
    )
    for epoch in range(12):
        stats = trainer.epoch(epoch)
    params = comm.allgather(model.params)
    assert_all(all(np.array_equal(params[0], p) for p in params), "models differ", comm)
    assert_all(stats.test_accuracy >= 0.95, f"accuracy {stats.test_accuracy}", comm)


def test_async_parameter_server_learns(comm):
    from hpcpar.apps.sgd.async_ps import AsyncTrainer

    data = load_dataset("digits")
    model = make_model("mlp", data.n_features, data.n_classes, seed=1)
    trainer = AsyncTrainer(model, data, comm, batch=16, lr=0.1, clip=5.0)
    for epoch in range(6):
        stats = trainer.epoch(epoch)
    params = comm.allgather(model.params)
    assert_all(all(np.array_equal(params[0], p) for p in params), "models differ", comm)
    assert_all(stats.test_accuracy >= 0.95, f"accuracy {stats.test_accuracy}", comm)
    if comm.Get_rank() == 0:
        steps = trainer.version
        assert len(trainer.staleness) == steps  # every gradient applied once, staleness kept
        if comm.Get_size() <= 2:
            assert stats.extra["max_staleness"] == 0  # one worker: never stale


@pytest.mark.parametrize("layout", [None, "ppn:2", "ppn:1"])
@pytest.mark.parametrize("dataset", ["digits", "synthetic_sparse"])
def test_hogwild_learns_on_shared_node_models(comm, layout, dataset):
    from hpcpar.apps.sgd.hogwild import HogwildTrainer

    data = load_dataset(dataset)
    name = "mlp" if dataset == "digits" else "softmax"
    model = make_model(name, data.n_features, data.n_classes, seed=1)
    with hpcpar.Hierarchy(comm, layout=layout) as h:
        trainer = HogwildTrainer(model, data, h, batch=16, lr=0.1 if name == "mlp" else 2.0)
        for epoch in range(6 if name == "mlp" else 3):
            stats = trainer.epoch(epoch)
        trainer.free()
    params = comm.allgather(model.params)
    assert_all(all(np.array_equal(params[0], p) for p in params), "models differ", comm)
    target = 0.95 if name == "mlp" else 0.75
    assert_all(stats.test_accuracy >= target, f"accuracy {stats.test_accuracy}", comm)


@pytest.mark.parametrize("layout", layouts_for(hpcpar.default_comm().Get_size())[:2])
def test_sharded_sync_equals_one_process_composing_the_same_batches(comm, layout):
    size, rank = comm.Get_size(), comm.Get_rank()
    whole = load_dataset("digits")
    mine = load_dataset("digits", shard=(rank, size))
    rows = comm.allgather(mine.y_train.size)
    assert_all(sum(rows) == whole.y_train.size == mine.n_total, "shards cover the rows", comm)
    assert_all(max(rows) - min(rows) <= 1, "shards are even", comm)
    batch = 12 * size

    def run(data, c, shards=0):
        model = make_model("mlp", data.n_features, data.n_classes, hidden=16, seed=4)
        trainer = SyncTrainer(model, data, c, batch=batch, lr=0.05, shards=shards)
        for epoch in range(2):
            trainer.epoch(epoch)
        return model.params, trainer.steps_per_epoch

    alone, steps = run(whole, None, shards=size)
    with hpcpar.Hierarchy(comm, layout=layout) as h:
        together, steps_here = run(mine, h)
    worst = float(np.abs(together - alone).max())
    assert_all(worst < 1e-10 and steps == steps_here, f"parameters differ by {worst}", comm)


def test_h5_shards_read_only_their_rows_and_standardise_globally(comm, tmp_path):
    h5py = pytest.importorskip("h5py")
    path = comm.bcast(str(tmp_path / "d.h5"), root=0)
    rng = np.random.default_rng(0)
    x, y = rng.normal(3.0, 2.0, (403, 7)), rng.integers(0, 3, 403)
    if comm.Get_rank() == 0:
        with h5py.File(path, "w") as f:
            f["x"], f["y"] = x, y
    comm.Barrier()
    whole = load_dataset(path)
    mine = load_dataset(path, shard=(comm.Get_rank(), comm.Get_size()), comm=comm)
    lo = sum(comm.allgather(mine.y_train.size)[: comm.Get_rank()])
    expect = whole.x_train[lo : lo + mine.y_train.size]
    assert_all(np.allclose(mine.x_train, expect, atol=1e-12), "shard rows differ", comm)
    assert_all(
        np.array_equal(mine.y_train, whole.y_train[lo : lo + mine.y_train.size]),
        "shard labels differ",
        comm,
    )
    assert_all(np.allclose(mine.x_test, whole.x_test, atol=1e-12), "test rows differ", comm)
    with pytest.raises(SgdError, match="shard 5 of 2 does not exist"):
        load_dataset(path, shard=(5, 2))


@pytest.mark.parametrize("layout", layouts_for(hpcpar.default_comm().Get_size())[:2])
def test_reproducible_sync_is_bitwise_one_process(comm, layout):
    alone, together = _alone_and_together(comm, layout, 15, batch=48, reproducible=True)
    assert_all(np.array_equal(together, alone), "not bit for bit", comm)
    with pytest.raises(SgdError, match="into 5 chunks"):  # 48 rows do not cut into 5
        SyncTrainer(
            make_model("softmax", 64, 10),
            load_dataset("digits"),
            comm,
            batch=48,
            reproducible=True,
            chunks=5,
        )
