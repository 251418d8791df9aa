"""``hpcpar.horovod.torch`` against torch's own arithmetic on every rank's data, at any rank count.

Each test gathers every rank's input with mpi4py's own allgather (the independent
reference) and computes what Horovod defines with torch on the whole.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from hpcpar.testing import assert_all

torch = pytest.importorskip("torch", reason="hpcpar.horovod.torch needs torch")
hvd = pytest.importorskip("hpcpar.horovod.torch")

pytestmark = pytest.mark.mpi

DTYPES = [torch.int32, torch.int64, torch.uint8, torch.float32, torch.float64]


@pytest.fixture(autouse=True, scope="module")
def started():
    hvd.init()
    yield
    hvd.shutdown()


def _all(x: torch.Tensor) -> torch.Tensor:
    """Every rank's ``x`` stacked in rank order (mpi4py's pickle allgather)."""
    return torch.stack(MPI.COMM_WORLD.allgather(x.clone()))


def _check(ok, what):
    assert_all(bool(ok), what, MPI.COMM_WORLD)


def _input(dtype, shape=(3, 5)):
    r = hvd.rank()
    if dtype.is_floating_point:
        g = torch.Generator().manual_seed(17 + r)
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return ((torch.arange(int(np.prod(shape))).reshape(shape) * (r + 2)) % 7 + r).to(dtype)


def test_ranks_come_from_the_hierarchy():
    import hpcpar

    h = hpcpar.Hierarchy()
    assert hvd.is_initialized()
    assert (hvd.size(), hvd.rank()) == (MPI.COMM_WORLD.Get_size(), MPI.COMM_WORLD.Get_rank())
    assert (hvd.local_size(), hvd.local_rank()) == (h.node.Get_size(), h.local_rank)
    assert (hvd.cross_size(), hvd.cross_rank()) == (h.rail.Get_size(), h.rail.Get_rank())
    pairs = MPI.COMM_WORLD.allgather((hvd.cross_rank(), hvd.local_rank()))
    assert len(set(pairs)) == len(pairs)  # (node, local rank) names one process
    assert hvd.mpi_built() and hvd.mpi_enabled() and not hvd.gloo_built()
    assert hvd.nccl_built() == 0 and not hvd.cuda_built()
    assert hvd.mpi_threads_supported() == (MPI.Query_thread() == MPI.THREAD_MULTIPLE)
    h.free()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allreduce_every_op_against_torch(dtype):
    x = _input(dtype)
    every = _all(x)
    p = hvd.size()
    wide = every.double() if dtype.is_floating_point else every.long()
    sums = wide.sum(0)
    want = {
        hvd.Sum: sums.to(dtype),
        hvd.Min: every.min(0).values,
        hvd.Max: every.max(0).values,
        hvd.Product: wide.prod(0).to(dtype),
        hvd.Average: (sums.double() * (1.0 / p)).to(dtype),  # integers: toward zero
    }
    for op, expect in want.items():
        got = hvd.allreduce(x, op=op)
        assert got.dtype == dtype and torch.equal(x, _input(dtype))  # input unchanged
        exact = not dtype.is_floating_point or op in (hvd.Min, hvd.Max)
        ok = torch.equal(got, expect) if exact else torch.allclose(got, expect, rtol=1e-5)
        _check(ok, f"allreduce op {op} on {dtype}")
    # in place, asynchronous, the deprecated average flag
    y = x.clone()
    handle = hvd.allreduce_async_(y, op=hvd.Sum)
    while not hvd.poll(handle):
        pass
    assert hvd.synchronize(handle) is y
    _check(torch.equal(y, sums.to(dtype)) or dtype.is_floating_point, "allreduce_async_")
    with pytest.warns(DeprecationWarning):
        z = hvd.allreduce(x, average=False)
    _check(torch.allclose(z.double(), sums.to(dtype).double()), "average=False is Sum")


def test_prescale_and_postscale_as_horovod_applies_them():
    x = _input(torch.int32)
    every = _all(x)
    pre = (every.double() * 3.0).to(torch.int32).long().sum(0)
    want = (pre.double() * (0.5 / hvd.size())).to(torch.int32)
    got = hvd.allreduce(x, op=hvd.Average, prescale_factor=3.0, postscale_factor=0.5)
    _check(torch.equal(got, want), "integer scaling toward zero")
    f = _input(torch.float32)
    got = hvd.allreduce(f, op=hvd.Sum, prescale_factor=0.25, postscale_factor=2.0)
    _check(torch.allclose(got, _all(f).double().sum(0).float() * 0.5, rtol=1e-5), "float scaling")


def test_grouped_allreduce_fuses_tensors_of_several_dtypes():
    tensors = [
        _input(torch.float32, (4,)),
        _input(torch.int64, (2, 3)),
        _input(torch.float32, (1,)),
    ]
    got = hvd.grouped_allreduce(tensors, op=hvd.Sum)
    for t, g in zip(tensors, got, strict=True):
        want = _all(t).sum(0).to(t.dtype)
        ok = torch.allclose(g.double(), want.double(), rtol=1e-5) and g.shape == t.shape
        _check(ok, f"grouped allreduce of {t.dtype}{tuple(t.shape)}")
    inplace = [t.clone() for t in tensors]
    assert hvd.grouped_allreduce_(inplace, op=hvd.Max)[1] is inplace[1]
    _check(torch.equal(inplace[1], _all(tensors[1]).max(0).values), "grouped_allreduce_ Max")


def test_fp16_compression_returns_the_dtype_within_half_precision():
    x = _input(torch.float32, (64,))
    got = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
    want = _all(x.half().float()).sum(0)
    assert got.dtype == torch.float32
    _check(torch.allclose(got, want, rtol=1e-2, atol=1e-2 * hvd.size()), "fp16 allreduce")


def test_allgather_with_uneven_first_dimensions_and_objects():
    r, p = hvd.rank(), hvd.size()
    x = torch.full((r + 1, 2), r, dtype=torch.int64)
    got = hvd.allgather(x)
    want = torch.cat([torch.full((i + 1, 2), i, dtype=torch.int64) for i in range(p)])
    _check(torch.equal(got, want), "uneven allgather")
    flags = hvd.allgather(torch.tensor([r % 2 == 0]))
    _check(flags.tolist() == [i % 2 == 0 for i in range(p)], "allgather of bool")
    assert hvd.allgather_object({"rank": r}) == [{"rank": i} for i in range(p)]
    assert hvd.broadcast_object({"from": r, "list": [1, 2]}, root_rank=p - 1) == {
        "from": p - 1,
        "list": [1, 2],
    }


def test_broadcast_and_broadcast_parameters():
    r, p = hvd.rank(), hvd.size()
    root = p - 1
    x = torch.arange(6, dtype=torch.float32) + r
    got = hvd.broadcast(x, root_rank=root)
    _check(torch.equal(got, torch.arange(6, dtype=torch.float32) + root), "broadcast")
    _check(torch.equal(x, torch.arange(6, dtype=torch.float32) + r), "input unchanged")
    torch.manual_seed(r)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    flat = torch.cat([t.flatten() for t in model.state_dict().values()])
    _check(all(torch.equal(flat, o) for o in MPI.COMM_WORLD.allgather(flat)), "same parameters")
    with pytest.raises(ValueError, match="invalid params"):
        hvd.broadcast_parameters(model, root_rank=0)


@pytest.mark.parametrize("kind", ["sgd-momentum", "adam"])
def test_broadcast_optimizer_state_gives_every_rank_the_roots(kind):
    r = hvd.rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    if kind == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=0.01 * (r + 1))
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1 * (r + 1), momentum=0.9)
    for step in range(r + 1):  # a different history on every rank
        opt.zero_grad()
        (model(torch.full((4, 3), float(r + step))) ** 2).sum().backward()
        opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    state = opt.state_dict()
    flat = torch.cat(
        [t.flatten().double() for s in state["state"].values() for t in s.values()]
        + [torch.tensor([g["lr"] for g in state["param_groups"]], dtype=torch.float64)]
    )
    _check(all(torch.equal(flat, o) for o in MPI.COMM_WORLD.allgather(flat)), f"{kind} state")
    assert state["param_groups"][0]["lr"] == pytest.approx(0.01 if kind == "adam" else 0.1)
    with pytest.raises(ValueError, match="LBFGS"):
        hvd.broadcast_optimizer_state(torch.optim.LBFGS(model.parameters()), root_rank=0)


def test_alltoall_with_and_without_splits():
    r, p = hvd.rank(), hvd.size()
    splits = [(r + i) % 3 for i in range(p)]  # zero rows to some ranks
    x = torch.cat([torch.full((s, 2), 10 * r + i) for i, s in enumerate(splits)])
    out, received = hvd.alltoall(x, splits=splits)
    want_splits = [(i + r) % 3 for i in range(p)]
    want = torch.cat([torch.full(((i + r) % 3, 2), 10 * i + r) for i in range(p)])
    _check(received.tolist() == want_splits and torch.equal(out, want.to(out.dtype)), "alltoall")
    even = torch.arange(2 * p, dtype=torch.float64) + 100 * r
    got = hvd.alltoall(even)
    want = torch.cat([torch.tensor([2.0 * r, 2.0 * r + 1]) + 100 * i for i in range(p)])
    _check(torch.equal(got, want), "even alltoall")
    with pytest.raises(ValueError, match="splits must be"):
        hvd.alltoall(x, splits=[1] * (p + 1))


def test_reducescatter_blocks_as_horovod_splits_them():
    r, p = hvd.rank(), hvd.size()
    n = 2 * p + 1  # the first rank gets one more row
    x = _input(torch.float64, (n, 3))
    total = _all(x).sum(0)
    rows = [n // p + (1 if i < n % p else 0) for i in range(p)]
    start = sum(rows[:r])
    got = hvd.reducescatter(x, op=hvd.Sum)
    _check(torch.allclose(got, total[start : start + rows[r]]), "reducescatter Sum")
    got = hvd.reducescatter(x)  # Average by default
    _check(torch.allclose(got, total[start : start + rows[r]] / p), "reducescatter Average")


def test_process_sets_limit_a_collective_to_their_ranks():
    r, p = hvd.rank(), hvd.size()
    if p == 1:  # the even ranks are every rank: the global set again
        with pytest.raises(ValueError, match="already has a process set"):
            hvd.add_process_set([0])
        return
    evens = hvd.add_process_set(list(range(0, p, 2)))
    try:
        assert evens.included() == (r % 2 == 0)
        x = torch.tensor([float(r)])
        if evens.included():
            got = hvd.allreduce(x, op=hvd.Sum, process_set=evens)
            assert got.item() == sum(range(0, p, 2))  # only the set's ranks are here
            assert evens.rank() == r // 2 and evens.size() == len(range(0, p, 2))
        else:
            with pytest.raises(ValueError, match="not in process set"):
                hvd.allreduce(x, process_set=evens)
        hvd.barrier()
    finally:
        assert hvd.remove_process_set(evens)
    assert not hvd.remove_process_set(evens)


def test_gradients_flow_through_the_collectives():
    r, p = hvd.rank(), hvd.size()
    x = torch.full((3,), float(r + 1), requires_grad=True)
    hvd.allreduce(x, op=hvd.Sum).sum().backward()
    _check(torch.equal(x.grad, torch.full((3,), float(p))), "allreduce gradient")
    y = torch.ones((r + 1, 2), requires_grad=True)
    (hvd.allgather(y) * 2).sum().backward()
    _check(torch.equal(y.grad, torch.full((r + 1, 2), 2.0 * p)), "allgather gradient")
    z = torch.ones(4, requires_grad=True)
    hvd.broadcast(z, root_rank=0).sum().backward()
    want = torch.full((4,), float(p)) if r == 0 else torch.zeros(4)
    _check(torch.equal(z.grad, want), "broadcast gradient")


def test_bad_input_is_one_clear_error():
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(torch.ones(2), op=hvd.Adasum)
    with pytest.raises(ValueError, match="unknown reduction op 9"):
        hvd.allreduce(torch.ones(2), op=9)
    with pytest.raises(ValueError, match="supersedes average"):
        hvd.allreduce(torch.ones(2), average=True, op=hvd.Sum)
    with pytest.raises(ValueError, match="required to be contiguous"):
        hvd.allreduce(torch.ones(4, 4).t())
    with pytest.raises(ValueError, match="not supported"):
        hvd.allreduce(torch.ones(2, dtype=torch.complex64))
    assert hvd.synchronize(123456) is None and hvd.poll(123456)


def test_before_init_every_call_says_so():
    hvd.shutdown()
    try:
        assert not hvd.is_initialized()
        for call in (hvd.size, hvd.rank, hvd.local_rank, lambda: hvd.allreduce(torch.ones(1))):
            with pytest.raises(ValueError, match=r"not been initialized; use hvd\.init\(\)"):
                call()
    finally:
        hvd.init()
