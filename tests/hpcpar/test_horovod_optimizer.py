"""``hvd.DistributedOptimizer`` against torch on the whole batch, at any rank count.

The reference is one process's training on every rank's rows (gathered with mpi4py):
Horovod's average of the ranks' gradients of their mean losses is the gradient of the
mean loss over the whole batch when the ranks' batches are the same size.
"""

from __future__ import annotations

import warnings

import pytest
from mpi4py import MPI

from hpcpar.testing import assert_all

torch = pytest.importorskip("torch", reason="hpcpar.horovod.torch needs torch")
hvd = pytest.importorskip("hpcpar.horovod.torch")

pytestmark = pytest.mark.mpi
ROWS = 4


@pytest.fixture(autouse=True, scope="module")
def started():
    hvd.init()
    yield
    hvd.shutdown()


def _check(ok, what):
    assert_all(bool(ok), what, MPI.COMM_WORLD)


def _model(seed=3):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)
    ).double()


def _batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(ROWS, 6, generator=g, dtype=torch.float64), torch.randint(
        0, 3, (ROWS,), generator=g
    )


def _whole(step, size):
    parts = [_batch(step, r) for r in range(size)]
    return torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])


def _loss(model, x, y):
    return torch.nn.functional.cross_entropy(model(x), y)


def _same(a_model, b_model, tol):
    return all(
        torch.allclose(p, q, rtol=tol, atol=tol)
        for p, q in zip(a_model.parameters(), b_model.parameters(), strict=True)
    )


@pytest.mark.parametrize(
    "kind, thread", [("sgd-momentum", False), ("adam", False), ("sgd-momentum", True)]
)
def test_training_matches_one_process_on_the_whole_batch(kind, thread, monkeypatch):
    from hpcpar.horovod.torch import optimizer

    # thread: full buckets reduced on the communication thread during the backward
    # pass, as where the host has a core to spare
    monkeypatch.setattr(optimizer, "spare_core", lambda comm: thread)
    model, reference = _model(), _model()
    make = {
        "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
    }[kind]
    opt = hvd.DistributedOptimizer(make(model.parameters()), model.named_parameters())
    ref_opt = make(reference.parameters())
    assert isinstance(opt, type(ref_opt))
    for step in range(4):
        opt.zero_grad()
        _loss(model, *_batch(step, hvd.rank())).backward()
        opt.step()
        ref_opt.zero_grad()
        _loss(reference, *_whole(step, hvd.size())).backward()
        ref_opt.step()
    _check(_same(model, reference, 1e-10), f"{kind}: parameters differ from the reference")
    assert "bucket" in opt.bucket_plan
    assert opt._sync.overlap == (thread and MPI.Query_thread() >= MPI.THREAD_SERIALIZED)


def test_backward_passes_per_step_accumulates_then_reduces_once():
    model, reference = _model(), _model()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        model.named_parameters(),
        backward_passes_per_step=2,
    )
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(2):
        opt.zero_grad()
        ref_opt.zero_grad()
        for half in range(2):
            _loss(model, *_batch(10 * step + half, hvd.rank())).backward()
            _loss(reference, *_whole(10 * step + half, hvd.size())).backward()
        opt.step()
        ref_opt.step()
    _check(_same(model, reference, 1e-10), "accumulated gradients differ")
    # a third pass before step() is Horovod's AssertionError (at one rank Horovod
    # registers no hooks, and neither does this)
    if hvd.size() > 1:
        for half in range(2):
            _loss(model, *_batch(half, hvd.rank())).backward()
        with pytest.raises(AssertionError, match="backward_passes_per_step"):
            _loss(model, *_batch(2, hvd.rank())).backward()
    opt.synchronize()


@pytest.mark.parametrize(
    "how", ["groups-count", "groups-lists", "threshold-0", "sum-predivide", "fp16", "int8"]
)
def test_fusion_ops_and_compression_give_the_same_gradients(how, monkeypatch):
    model = _model()
    params = list(model.parameters())
    args = {}
    if how == "groups-count":
        args["groups"] = 2
    elif how == "groups-lists":
        args["groups"] = [[params[0], params[3]]]
    elif how == "threshold-0":
        monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "0")
    elif how == "sum-predivide":
        args["op"] = hvd.Sum
    else:
        args["compression"] = getattr(hvd.Compression, how)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(params, lr=0.1), model.named_parameters(), **args
    )
    if how == "threshold-0":
        assert len(opt._sync.buckets) == len(params)
    if how == "groups-lists":  # the group, then every other parameter on its own
        assert sorted(len(b.params) for b in opt._sync.buckets) == [1, 1, 2]
    if how == "int8":  # hpcpar's compressed allreduce with error feedback on the buckets
        assert all(
            b.compression.scheme == "int8" and b.feedback is not None for b in opt._sync.buckets
        )
    _loss(model, *_batch(0, hvd.rank())).backward()
    opt.synchronize()
    got = [p.grad.clone() for p in params]
    # the reference: each rank's own gradient, averaged (or summed) with torch
    mine = _model()
    _loss(mine, *_batch(0, hvd.rank())).backward()
    every = MPI.COMM_WORLD.allgather([p.grad for p in mine.parameters()])
    want = [torch.stack(gs).sum(0) for gs in zip(*every, strict=True)]
    if how != "sum-predivide":
        want = [w / hvd.size() for w in want]
    # int8 is coded across nodes only, and these ranks share one node: exact
    tol = 2e-3 if how == "fp16" else 1e-12
    ok = all(torch.allclose(g, w, rtol=tol, atol=tol) for g, w in zip(got, want, strict=True))
    _check(ok, f"{how}: gradients differ from torch's")
    assert all(g.dtype == torch.float64 for g in got)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with opt.skip_synchronize():
            opt.step()
    opt.zero_grad()


@pytest.mark.reliability("bad_input")
def test_hpcpars_compressions_are_for_the_optimizer_and_sums():
    with pytest.raises(ValueError, match="codes DistributedOptimizer's gradient buckets"):
        hvd.allreduce(torch.ones(4), compression=hvd.Compression.int8)
    model = _model()
    with pytest.raises(ValueError, match="use op Average or Sum"):
        hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            model.named_parameters(),
            compression=hvd.Compression.onebit,
            op=hvd.Max,
        )


def test_predivide_splits_the_average():
    model = _model()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        model.named_parameters(),
        gradient_predivide_factor=2.0,
    )
    reference = _model()
    _loss(reference, *_whole(0, hvd.size())).backward()
    _loss(model, *_batch(0, hvd.rank())).backward()
    opt.synchronize()
    ok = all(
        torch.allclose(p.grad, q.grad, rtol=1e-10, atol=1e-12)
        for p, q in zip(model.parameters(), reference.parameters(), strict=True)
    )
    _check(ok, "predivided average differs")
    with pytest.warns(UserWarning, match="skip_synchronize"):
        opt.step()


def test_parameters_a_rank_did_not_use_average_with_zeros():
    torch.manual_seed(5)
    a, b = torch.nn.Linear(3, 2).double(), torch.nn.Linear(3, 2).double()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD([*a.parameters(), *b.parameters()], lr=0.1),
        [
            *(("a." + n, p) for n, p in a.named_parameters()),
            *(("b." + n, p) for n, p in b.named_parameters()),
        ],
    )
    x = torch.ones(2, 3, dtype=torch.float64) * (hvd.rank() + 1)
    used = b if hvd.rank() % 2 else a  # odd ranks use b only, even ranks a only
    used(x).sum().backward()
    opt.synchronize()
    users_a = [r for r in range(hvd.size()) if r % 2 == 0]
    users_b = [r for r in range(hvd.size()) if r % 2 == 1]
    # d/dW sum(W x + c) = rows of x summed: 2 * (r+1) per entry; d/dc = 2
    want_aw = sum(2.0 * (r + 1) for r in users_a) / hvd.size()
    want_bw = sum(2.0 * (r + 1) for r in users_b) / hvd.size()
    ok = torch.allclose(a.weight.grad, torch.full((2, 3), want_aw, dtype=torch.float64))
    ok &= torch.allclose(b.weight.grad, torch.full((2, 3), want_bw, dtype=torch.float64))
    ok &= torch.allclose(
        b.bias.grad, torch.full((2,), 2.0 * len(users_b) / hvd.size(), dtype=torch.float64)
    )
    _check(ok, "unused parameters' gradients differ")


@pytest.mark.parametrize("dense", [False, True])
def test_sparse_gradients_are_reduced_as_horovod_does(dense):
    torch.manual_seed(2)
    emb = torch.nn.Embedding(10, 3, sparse=True).double()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(emb.parameters(), lr=0.1), emb.named_parameters(), sparse_as_dense=dense
    )
    rows = torch.tensor([hvd.rank() % 10, (hvd.rank() + 3) % 10])
    emb(rows).sum().backward()
    opt.synchronize()
    want = torch.zeros(10, 3, dtype=torch.float64)
    for r in range(hvd.size()):
        for i in (r % 10, (r + 3) % 10):
            want[i] += 1.0 / hvd.size()
    got = emb.weight.grad.to_dense()
    _check(torch.allclose(got, want), f"sparse_as_dense={dense}: embedding gradient differs")
    with opt.skip_synchronize():
        opt.step()


def test_zero_grad_before_step_and_bad_arguments_are_horovods_errors():
    model = _model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(sgd, model.named_parameters())
    _loss(model, *_batch(0, hvd.rank())).backward()
    if hvd.size() > 1:
        with pytest.raises(AssertionError, match="zero_grad"):
            opt.zero_grad()
    opt.step()
    opt.zero_grad()
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.DistributedOptimizer(sgd, op=hvd.Adasum)
    with pytest.raises(ValueError, match="unknown reduction op"):
        hvd.DistributedOptimizer(sgd, op=9)
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        hvd.DistributedOptimizer(sgd, backward_passes_per_step=0)
    with pytest.raises(ValueError, match="op != Average"):
        hvd.DistributedOptimizer(sgd, op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="unique"):
        hvd.DistributedOptimizer(sgd, [("w", p) for p in model.parameters()])


def test_models_that_differ_between_ranks_are_named_on_every_rank():
    width = 4 if hvd.rank() == hvd.size() - 1 and hvd.size() > 1 else 5
    model = torch.nn.Linear(width, 2)
    if hvd.size() == 1:
        pytest.skip("one rank has nothing to differ from")
    with pytest.raises(ValueError, match=r"parameters differ: rank .* weight of shape"):
        hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters()
        )


def test_a_process_set_reduces_over_its_ranks_only():
    if hvd.size() < 2:
        pytest.skip("a proper subset needs two ranks")
    evens = hvd.add_process_set(list(range(0, hvd.size(), 2)))
    try:
        model = _model()
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), process_set=evens
        )
        _loss(model, *_batch(0, hvd.rank())).backward()
        opt.synchronize()
        mine = _model()
        _loss(mine, *_batch(0, hvd.rank())).backward()
        every = MPI.COMM_WORLD.allgather([p.grad for p in mine.parameters()])
        if hvd.rank() % 2 == 0:
            members = every[::2]
            want = [torch.stack(gs).mean(0) for gs in zip(*members, strict=True)]
        else:
            want = every[hvd.rank()]  # not in the set: its own gradients, untouched
        got = [p.grad for p in model.parameters()]
        ok = all(torch.allclose(g, w, atol=1e-12) for g, w in zip(got, want, strict=True))
        _check(ok, "process-set gradients differ")
    finally:
        hvd.remove_process_set(evens)
