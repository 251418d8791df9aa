"""PyTorch models over hpcpar (``hpcpar.apps.sgd.torch.DataParallel``) at 1-4 ranks: the
same model as one process training on the whole global batch, whatever the buckets,
the overlap or the virtual layout; unused parameters, gradient accumulation, parameters
from rank 0, and models that differ between ranks."""

from __future__ import annotations

import numpy as np
import pytest

import hpcpar
from hpcpar.testing import assert_all, layouts_for

torch = pytest.importorskip("torch", reason="the torch front end needs torch (pip install torch)")
from hpcpar.apps.sgd import SgdError  # noqa: E402
from hpcpar.apps.sgd.torch import DataParallel  # noqa: E402

pytestmark = pytest.mark.mpi

GLOBAL_BATCH = 24  # divides over 1, 2, 3 and 4 ranks


def make_net(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(10, 32),
        torch.nn.Tanh(),
        torch.nn.Linear(32, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 3),
    ).double()


def data(steps=4):
    rng = np.random.default_rng(1)
    x = torch.from_numpy(rng.standard_normal((steps, GLOBAL_BATCH, 10)))
    y = torch.from_numpy(rng.integers(0, 3, (steps, GLOBAL_BATCH)))
    return x, y


def train(model, rows, steps=4, lr=0.1, momentum=0.9):
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    x, y = data(steps)
    for s in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x[s][rows]), y[s][rows])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach().numpy().copy() for p in model.parameters()]


def reference(steps=4):
    return train(make_net(), slice(None), steps)


def my_rows(comm):
    share = GLOBAL_BATCH // comm.Get_size()
    return slice(comm.Get_rank() * share, (comm.Get_rank() + 1) * share)


@pytest.mark.parametrize("layout", layouts_for(hpcpar.default_comm().Get_size())[:3])
@pytest.mark.parametrize(
    ("bucket_mib", "overlap"), [(25.0, True), (1e-6, True), (1e-6, False), ("auto", True)]
)
def test_the_same_model_as_one_process_on_the_whole_batch(comm, layout, bucket_mib, overlap):
    expect = reference()
    net = make_net(seed=comm.Get_rank())
    with (
        hpcpar.Hierarchy(comm, layout=layout) as h,
        DataParallel(net, comm=h, bucket_mib=bucket_mib, overlap=overlap) as model,
    ):
        got = train(model, my_rows(comm))
        if bucket_mib == "auto":  # chosen after the first pass, the same on every rank
            assert model.bucket_plan.startswith("auto: ")
            assert_all(len(set(comm.allgather(model.bucket_bytes))) == 1, "choices differ", comm)
        elif bucket_mib < 1:
            assert len(model.buckets) == 6  # one parameter per bucket
    worst = max(float(np.abs(a - b).max()) for a, b in zip(got, expect, strict=True))
    assert_all(worst < 1e-12, f"parameters differ from one process's by {worst}", comm)


def test_parameters_and_buffers_come_from_rank_0(comm):
    net = make_net(seed=comm.Get_rank())
    net.register_buffer("scale", torch.full((3,), float(comm.Get_rank())))
    with DataParallel(net, comm=comm):
        first = make_net(seed=0)
        same = all(
            torch.equal(a, b) for a, b in zip(net.parameters(), first.parameters(), strict=True)
        )
        assert_all(same and float(net.scale.sum()) == 0.0, "not rank 0's weights", comm)


class Branches(torch.nn.Module):
    """``shared`` on every rank, ``only_0`` on rank 0 only, ``never`` on none."""

    def __init__(self, rank):
        super().__init__()
        self.rank = rank
        torch.manual_seed(0)
        self.shared = torch.nn.Linear(4, 2).double()
        self.only_0 = torch.nn.Linear(4, 2).double()
        self.never = torch.nn.Linear(4, 2).double()

    def forward(self, x):
        out = self.shared(x)
        return out + self.only_0(x) if self.rank == 0 else out


def test_unused_parameters_count_as_zero_and_unused_everywhere_keep_their_gradient(comm):
    x = torch.ones(3, 4, dtype=torch.float64)
    with DataParallel(Branches(comm.Get_rank()), comm=comm) as model:
        model.module.never.weight.grad = torch.full((2, 4), 7.0, dtype=torch.float64)
        model(x).sum().backward()
        net = model.module
    alone = Branches(0)
    alone(x).sum().backward()
    size = comm.Get_size()
    ok = torch.allclose(net.shared.weight.grad, alone.shared.weight.grad)
    ok &= torch.allclose(net.only_0.weight.grad, alone.only_0.weight.grad / size)
    ok &= bool((net.never.weight.grad == 7.0).all()) and net.never.bias.grad is None
    assert_all(ok, "unused parameters' gradients are wrong", comm)


def test_no_sync_accumulates_and_the_next_backward_averages_it_all(comm):
    x, y = data(2)
    rows = my_rows(comm)
    f = torch.nn.functional
    with DataParallel(make_net(), comm=comm) as model:
        with model.no_sync():
            f.cross_entropy(model(x[0][rows]), y[0][rows]).backward()
        f.cross_entropy(model(x[1][rows]), y[1][rows]).backward()
        got = [p.grad.numpy().copy() for p in model.parameters()]
    alone = make_net()
    for s in range(2):
        f.cross_entropy(alone(x[s]), y[s]).backward()
    worst = max(
        float(np.abs(a - p.grad.numpy()).max())
        for a, p in zip(got, alone.parameters(), strict=True)
    )
    assert_all(worst < 1e-12, f"accumulated gradients differ by {worst}", comm)


@pytest.mark.reliability("bad_input")
def test_models_that_differ_between_ranks_are_named_on_every_rank(comm):
    if comm.Get_size() < 2:
        pytest.skip("needs two ranks to disagree")
    width = 32 if comm.Get_rank() == 0 else 33
    net = torch.nn.Sequential(torch.nn.Linear(10, width), torch.nn.Linear(width, 3))
    with pytest.raises(SgdError, match=r"models differ: rank \d has 0.weight of shape"):
        DataParallel(net, comm=comm)
    with pytest.raises(SgdError, match=r"0.weight is bfloat16, which hpcpar's collectives"):
        DataParallel(make_net().to(torch.bfloat16), comm=comm)
    for bad in (0, -1.0, True, "big", float("nan")):
        with pytest.raises(SgdError, match="bucket_mib"):
            DataParallel(make_net(), comm=comm, bucket_mib=bad)


@pytest.mark.parametrize("hierarchical", [False, True])
def test_zero_stage_1_trains_the_unsharded_model_with_a_share_of_the_state(comm, hierarchical):
    """Adam's moments sharded over the ranks (reduce-scatter, step a slice, allgather):
    the model of one process training Adam on the whole batch."""
    from hpcpar.apps.sgd.torch import ZeroOptimizer

    def adam(params):
        return torch.optim.Adam(params, lr=0.01)

    x, y = data(4)
    f = torch.nn.functional
    alone = make_net()
    opt = adam(alone.parameters())
    for s in range(4):
        opt.zero_grad()
        f.cross_entropy(alone(x[s]), y[s]).backward()
        opt.step()
    rows = my_rows(comm)
    with (
        hpcpar.Hierarchy(comm, layout="ppn:2") as h,
        DataParallel(make_net(seed=comm.Get_rank()), comm=h) as model,
    ):
        zero = ZeroOptimizer(model, adam, hierarchical=hierarchical)
        # two levels where layout ppn:2 makes them: several nodes, one with two ranks
        two = hierarchical and comm.Get_size() > 2
        assert zero.algorithm == ("two_level" if two else "auto"), zero.algorithm
        for s in range(4):
            zero.zero_grad()
            f.cross_entropy(model(x[s][rows]), y[s][rows]).backward()
            zero.step()
        total = sum(p.numel() for p in alone.parameters())
        held = sum(
            v.numel()
            for st in zero.optimizer.state.values()
            for v in st.values()
            if torch.is_tensor(v) and v.dim()
        )
        assert_all(held == 2 * zero.counts[comm.Get_rank()], f"{held} moments held", comm)
        assert_all(comm.allreduce(held) == 2 * total, "every moment held once", comm)
        worst = max(
            float((a - b).abs().max().detach())
            for a, b in zip(model.parameters(), alone.parameters(), strict=True)
        )
    assert_all(worst < 1e-10, f"parameters differ from unsharded Adam by {worst}", comm)


@pytest.mark.parametrize("outer", ["average", "nesterov"])
def test_local_sgd_averages_the_moves_of_independent_inner_steps(comm, outer):
    """Three inner steps per rank on its own rows, then the outer step: plain averaging
    (outer SGD at learning rate 1) or DiLoCo's Nesterov outer step, computed here from
    the models every rank trained alone."""
    from hpcpar.apps.sgd.torch import LocalSGD

    def nesterov(params):
        return torch.optim.SGD(params, lr=0.7, momentum=0.9, nesterov=True)

    x, y = data(6)
    f = torch.nn.functional
    rows = my_rows(comm)
    flat = lambda net: torch.cat([p.detach().reshape(-1) for p in net.parameters()])  # noqa: E731
    # what each rank does alone, and the outer steps done by hand
    alone = make_net()
    common = torch.nn.Parameter(flat(alone))
    outer_opt = nesterov([common]) if outer == "nesterov" else torch.optim.SGD([common], lr=1.0)
    inner_opt = torch.optim.SGD(alone.parameters(), lr=0.1)
    for s in range(6):
        inner_opt.zero_grad()
        f.cross_entropy(alone(x[s][rows]), y[s][rows]).backward()
        inner_opt.step()
        if s % 3 == 2:
            moved = comm.allreduce((common.detach() - flat(alone)).numpy()) / comm.Get_size()
            common.grad = torch.from_numpy(moved)
            outer_opt.step()
            with torch.no_grad():
                torch.nn.utils.vector_to_parameters(common.detach().clone(), alone.parameters())
    with DataParallel(make_net(seed=comm.Get_rank()), comm=comm) as model:
        inner = torch.optim.SGD(model.parameters(), lr=0.1)
        local = LocalSGD(
            model, inner, steps=3, make_outer=nesterov if outer == "nesterov" else None
        )
        synced = []
        for s in range(6):
            local.zero_grad()
            f.cross_entropy(model(x[s][rows]), y[s][rows]).backward()
            synced.append(local.step())
        got = flat(model.module)
    assert synced == [False, False, True] * 2
    worst = float((got - flat(alone)).abs().max())
    assert_all(worst < 1e-12, f"local SGD differs from the hand-made steps by {worst}", comm)
    with pytest.raises(SgdError, match="steps must be a positive integer"):
        LocalSGD(model, inner, steps=0)


def _grads(model, rows):
    x, y = data(1)
    model.module.zero_grad()
    torch.nn.functional.cross_entropy(model(x[0][rows]), y[0][rows]).backward()
    return np.concatenate([p.grad.numpy().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("layout", ["ppn:1", "ppn:2"])
def test_compressed_gradients_are_within_the_bound_and_exact_on_one_node(comm, layout):
    from hpcpar.collectives.compression import codec_for

    with hpcpar.Hierarchy(comm, layout=layout) as h:
        with DataParallel(make_net(), comm=h, bucket_mib=1e-6, overlap=False) as exact:
            want = _grads(exact, my_rows(comm))
        with DataParallel(
            make_net(), comm=h, bucket_mib=1e-6, overlap=False, compression="bf16"
        ) as coded:
            got = _grads(coded, my_rows(comm))
            nodes = h.n_nodes
    if nodes == 1:
        assert_all(np.array_equal(got, want), "one node: the exact gradients", comm)
    else:  # per element within the bound times the ranks' largest gradients, averaged
        scale = float(np.abs(want).max()) * comm.Get_size()
        limit = codec_for("bf16").bound(nodes) * scale / comm.Get_size() + 1e-12
        err = float(np.abs(got - want).max())
        assert_all(0 < err <= limit, f"bf16 gradients off by {err} (bound {limit})", comm)


def test_error_feedback_state_survives_a_checkpoint_on_other_buckets(comm):
    with hpcpar.Hierarchy(comm, layout="ppn:1") as h:
        with DataParallel(
            make_net(),
            comm=h,
            bucket_mib=1e-6,
            overlap=False,
            compression="1bit",
            error_feedback=True,
        ) as model:
            train(model, my_rows(comm), steps=2)
            saved = model.feedback_state()
            held = np.sum(comm.allgather(saved["owed"].block), axis=0)
        with DataParallel(
            make_net(),
            comm=h,
            bucket_mib=25.0,
            overlap=False,
            compression="1bit",
            error_feedback=True,
        ) as other:  # one bucket now: what each parameter is owed moves with it
            other.load_feedback_state({"owed": saved["owed"].block})
            again = np.sum(comm.allgather(other.feedback_state()["owed"].block), axis=0)
    ok = np.allclose(again, held, atol=1e-6) and (h.n_nodes == 1 or np.abs(held).max() > 0)
    assert_all(ok, "the owed residuals after a restore into other buckets", comm)


@pytest.mark.reliability("bad_input")
def test_bad_compression_arguments_are_sgd_errors(comm):
    with pytest.raises(SgdError, match="unknown compression"):
        DataParallel(make_net(), comm=comm, compression="zip")
    with pytest.raises(SgdError, match="needs a compression"):
        DataParallel(make_net(), comm=comm, error_feedback=True)


def test_powersgd_buckets_warm_up_exact_then_approximate_the_matrices(comm):
    with hpcpar.Hierarchy(comm, layout="ppn:1") as h:
        with DataParallel(make_net(), comm=h, bucket_mib=25.0, overlap=False) as exact:
            want = _grads(exact, my_rows(comm))
        psgd = hpcpar.PowerSGD(2, comm=h, start_powerSGD_iter=1, min_compression_rate=1.0)
        with DataParallel(
            make_net(), comm=h, bucket_mib=25.0, overlap=False, compression=psgd
        ) as model:
            first = _grads(model, my_rows(comm))  # the warm-up step: exact
            second = _grads(model, my_rows(comm))  # the same step again, approximated
            shapes = [tuple(p.shape) for p in model.parameters()]
            nodes = h.n_nodes
    ok = np.allclose(first, want, rtol=0, atol=1e-12)
    at = 0
    for shape in shapes:
        n = int(np.prod(shape))
        a, b = second[at : at + n], want[at : at + n]
        at += n
        if len(shape) == 1 or nodes == 1:  # vectors (and everything on one node) exact
            ok = ok and np.allclose(a, b, rtol=0, atol=1e-12)
        else:  # a projection of the exact sum: never farther from it than its norm
            ok = ok and np.linalg.norm(a - b) <= np.linalg.norm(b) * (1 + 1e-9)
    ok = ok and (nodes == 1 or not np.allclose(second, want, atol=1e-9))
    assert_all(ok, "PowerSGD buckets", comm)
