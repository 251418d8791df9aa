"""``hvd.join``, ``hvd.SyncBatchNorm``, the grouped allgather/reducescatter, the
timeline and Horovod's environment variables, against torch on the gathered data."""

from __future__ import annotations

import json

import pytest
from mpi4py import MPI

from hpcpar.testing import assert_all

torch = pytest.importorskip("torch", reason="hpcpar.horovod.torch needs torch")
hvd = pytest.importorskip("hpcpar.horovod.torch")

pytestmark = pytest.mark.mpi


@pytest.fixture(autouse=True, scope="module")
def started():
    hvd.init()
    yield
    hvd.shutdown()


def _check(ok, what):
    assert_all(bool(ok), what, MPI.COMM_WORLD)


def _batch(step, rank, rows=3):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(rows, 4, generator=g, dtype=torch.float64)


def test_join_serves_the_steps_of_ranks_with_more_data():
    """Rank r has r + 1 batches: at step s the ranks with data average their gradients
    with zeros from the joined ranks (Horovod's rule), over the set's size."""
    r, p = hvd.rank(), hvd.size()
    torch.manual_seed(4)
    model = torch.nn.Linear(4, 1).double()
    start = [t.detach().clone() for t in model.parameters()]
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters()
    )
    for step in range(r + 1):
        opt.zero_grad()
        model(_batch(step, r)).sum().backward()
        opt.step()
    last = hvd.join()
    # a joined rank stops stepping: the last rank to join has the trained model
    hvd.broadcast_parameters(model.state_dict(), root_rank=last)
    # the reference: plain SGD on the summed gradients of the ranks with data / p
    ref = torch.nn.Linear(4, 1).double()
    with torch.no_grad():
        for t, s in zip(ref.parameters(), start, strict=True):
            t.copy_(s)
    for step in range(p):
        grads = [torch.zeros_like(t) for t in ref.parameters()]
        for q in range(p):
            if step <= q:
                ref.zero_grad()
                ref(_batch(step, q)).sum().backward()
                grads = [g + t.grad for g, t in zip(grads, ref.parameters(), strict=True)]
        with torch.no_grad():
            for t, g in zip(ref.parameters(), grads, strict=True):
                t.sub_(0.1 * g / p)
    ok = all(
        torch.allclose(a, b, atol=1e-12)
        for a, b in zip(model.parameters(), ref.parameters(), strict=True)
    )
    _check(ok, "joined training differs from the reference")
    _check(last == p - 1, f"join returned {last}, not the last rank to join ({p - 1})")
    hvd.allreduce(torch.ones(1))  # every rank is back: collectives work again


@pytest.mark.parametrize("momentum", [0.1, None])
def test_sync_batch_norm_is_batch_norm_on_the_whole_batch(momentum):
    r, p = hvd.rank(), hvd.size()
    torch.manual_seed(9)
    sync = hvd.SyncBatchNorm(3, momentum=momentum).double()
    ref = torch.nn.BatchNorm2d(3, momentum=momentum).double()
    with torch.no_grad():
        for m in (sync, ref):
            m.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
            m.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    for step in range(2):
        parts = [
            torch.randn(2, 3, 2, 2, generator=torch.Generator().manual_seed(7 * step + q)).double()
            for q in range(p)
        ]
        x = parts[r].clone().requires_grad_(True)
        y = sync(x)
        (y * torch.arange(y.numel(), dtype=y.dtype).view_as(y)).sum().backward()
        whole = torch.cat(parts).requires_grad_(True)
        ry = ref(whole)
        (ry * torch.cat([torch.arange(y.numel(), dtype=y.dtype).view_as(y)] * p)).sum().backward()
        rows = slice(2 * r, 2 * r + 2)
        _check(torch.allclose(y, ry[rows], atol=1e-10), "SyncBatchNorm output")
        _check(torch.allclose(x.grad, whole.grad[rows], atol=1e-9), "input gradient")
        # each rank's weight gradient is its rows' share: summed, the whole batch's
        summed = hvd.allreduce(sync.weight.grad, op=hvd.Sum)
        _check(torch.allclose(summed, ref.weight.grad, atol=1e-9), "weight gradient")
        _check(torch.allclose(sync.running_var, ref.running_var, atol=1e-12), "running var")
        _check(torch.allclose(sync.running_mean, ref.running_mean, atol=1e-12), "running mean")
        sync.zero_grad()
        ref.zero_grad()
    sync.eval()
    ref.eval()
    x = _batch(0, r)[:, :3].reshape(3, 3, 1, 1)
    _check(torch.allclose(sync(x), ref(x)), "evaluation uses the running statistics")
    with pytest.raises(ValueError, match="2D input"):
        sync(torch.ones(3))


def test_grouped_allgather_and_reducescatter_with_gradients():
    r, p = hvd.rank(), hvd.size()
    a = torch.full((r + 1, 2), float(r), requires_grad=True)
    b = torch.arange(3, dtype=torch.float64).repeat(2 * p, 1) + r
    b.requires_grad_(True)
    ga, gb = hvd.grouped_allgather([a, b])
    want_a = torch.cat([torch.full((q + 1, 2), float(q)) for q in range(p)])
    want_b = torch.cat(
        [torch.arange(3, dtype=torch.float64).repeat(2 * p, 1) + q for q in range(p)]
    )
    _check(torch.equal(ga, want_a) and torch.equal(gb, want_b), "grouped allgather")
    (ga.sum() + 3 * gb.sum()).backward()
    _check(torch.equal(a.grad, torch.ones_like(a)), "grouped allgather gradient")
    c = b.detach().clone().requires_grad_(True)
    sa, sc = hvd.grouped_reducescatter([b.detach().clone(), c], op=hvd.Sum)
    rows = slice(2 * r, 2 * r + 2)
    total = sum(torch.arange(3, dtype=torch.float64).repeat(2 * p, 1) + q for q in range(p))
    _check(torch.equal(sa, total[rows]) and torch.equal(sc, total[rows]), "grouped reducescatter")
    sc.sum().backward()  # Sum: each input row's gradient is the set's size
    _check(torch.equal(c.grad, torch.full_like(c, float(p))), "reducescatter gradient")
    x = torch.ones(2 * p, 1, requires_grad=True)
    hvd.reducescatter(x).sum().backward()  # Average
    _check(torch.equal(x.grad, torch.ones_like(x)), "average reducescatter gradient")


def test_timeline_has_every_ranks_collectives(tmp_path):
    path = MPI.COMM_WORLD.bcast(str(tmp_path / "timeline.json"), root=0)
    hvd.start_timeline(path)
    for _ in range(3):
        hvd.allreduce(torch.ones(4))
    hvd.allgather(torch.ones(2, 2))
    hvd.stop_timeline()
    if hvd.rank() == 0:
        events = json.load(open(path))["traceEvents"]
        spans = [e for e in events if e.get("ph") == "X"]
        assert {e["pid"] for e in spans} == set(range(hvd.size()))
        assert any("allgather" in e["name"] for e in spans)


def test_environment_variables_are_honoured_or_refused(monkeypatch):
    from hpcpar.horovod import environment

    monkeypatch.setenv("HOROVOD_CPU_OPERATIONS", "gloo")
    with pytest.raises(
        ValueError, match=r"HOROVOD_CPU_OPERATIONS=gloo: hpcpar\.horovod runs over MPI"
    ):
        environment.check(0)
    monkeypatch.delenv("HOROVOD_CPU_OPERATIONS")
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "64MB")
    with pytest.raises(ValueError, match="expected a number of bytes"):
        environment.check(0)
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "1024")
    assert environment.fusion_threshold() == 1024
    monkeypatch.setenv("HOROVOD_AUTOTUNE", "1")
    assert environment.fusion_threshold() is None
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "5")
    with pytest.warns(RuntimeWarning, match="HOROVOD_CYCLE_TIME: a bucket goes out"):
        environment.check(0)
    monkeypatch.setenv("HOROVOD_HIERARCHICAL_ALLREDUCE", "1")
    assert environment.allreduce_algorithm() == "two_level"
