"""Compressed allreduce under MPI: equal to a single-process reference of the same coding,
within the documented bound of the exact sum, exact inside one node, error feedback's
invariant, its checkpoint on another rank count, explain, and bad input on every rank."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import hpcpar
from hpcpar.collectives import CollectiveError, CollectiveMismatchError, last_stats
from hpcpar.collectives.compression import Compression, codec_for
from hpcpar.collectives.compression.schemes import TINY
from hpcpar.testing import assert_all, layouts_for

pytestmark = pytest.mark.mpi

SCHEMES = ["fp16", "bf16", "int8", "1bit"]


def _contribution(rank, n, dtype=np.float32):
    # small integers: every node's sum is exact in any order, so the reference's
    # coding of it is the schedule's bit for bit
    return np.random.default_rng(100 + rank).integers(-40, 41, n).astype(dtype)


def _code(codec, v, acc=None):
    payload = np.empty(codec.wire_bytes(v.size), np.uint8)
    codec.encode(np.ascontiguousarray(v, np.float32), payload)
    if acc is None:
        acc = np.empty(v.size, np.float32 if v.dtype == np.float32 else np.float64)
        codec.decode(payload, acc, add=False)
    else:
        codec.decode(payload, acc, add=True)
    return acc


def _reference(codec, node_sums):
    """decode(code(sum over nodes, in node order, of decode(code(node sum))))."""
    acc = _code(codec, node_sums[0])
    for v in node_sums[1:]:
        _code(codec, v, acc)
    return _code(codec, acc.astype(node_sums[0].dtype))


def _node_sums(h, everyone):
    return [np.sum([everyone[r] for r in h.ranks_of_node(i)], axis=0) for i in range(h.n_nodes)]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_equal_to_a_reference_and_within_the_bound_on_every_layout(comm, scheme):
    size, rank = comm.Get_size(), comm.Get_rank()
    n = 3001
    x = _contribution(rank, n)
    everyone = comm.allgather(x)
    exact = np.sum(everyone, axis=0)
    codec = codec_for(scheme, 64)
    for layout in layouts_for(size):
        h = hpcpar.Hierarchy(comm, layout=layout)
        result = hpcpar.allreduce(x, comm=h, compression=Compression(scheme, block=64))
        stats = last_stats()
        sums = _node_sums(h, everyone)
        same = comm.allgather(result.tobytes())
        if h.n_nodes == 1:  # nothing crosses a slow level: the exact call, bit for bit
            want = hpcpar.allreduce(x, comm=h)
            ok = np.array_equal(result, want) and stats.bytes_inter == 0
        else:
            want = _reference(codec, sums)
            rows = -(-n // 64) * 64
            peaks = sum(
                np.abs(np.resize(np.r_[s, np.zeros(rows - n)], rows)).reshape(-1, 64).max(1)
                for s in sums
            )
            limit = np.repeat(peaks, 64)[:n] * codec.bound(h.n_nodes) + 2 * TINY
            ok = (
                np.array_equal(result, want)
                and np.all(np.abs(result - exact) <= limit)
                and stats.algorithm == f"compressed_{scheme}"
            )
        assert_all(ok and len(set(same)) == 1, f"{scheme} on layout {layout}", comm)
        h.free()


def test_float64_sums_in_float64_and_counts_coded_bytes(comm):
    size, rank = comm.Get_size(), comm.Get_rank()
    h = hpcpar.Hierarchy(comm, layout="ppn:1")
    n = 20_000
    x = _contribution(rank, n, np.float64)
    result = hpcpar.allreduce(x, comm=h, compression="int8")
    stats = last_stats()
    exact = np.sum(comm.allgather(x), axis=0)
    codec = codec_for("int8")
    assert result.dtype == np.float64
    if size == 1:
        assert_all(np.array_equal(result, exact) and stats.bytes_inter == 0, "one node", comm)
        h.free()
        return
    want = _reference(codec, [v.astype(np.float64) for v in comm.allgather(x)])
    # each rank sends p-1 chunks of its vector and p-1 copies of its chunk's total,
    # coded, and 16 bytes per round of the agreement check
    from hpcpar.collectives.compression.allreduce import chunks, count_allreduce
    from hpcpar.collectives.registry import Shape
    from hpcpar.collectives.tally import Counts, Layout, groups_of

    parts = chunks(n, codec.block, size)
    coded = sum(codec.wire_bytes(c) for j, c in enumerate(parts) if j != rank)
    coded += (size - 1) * codec.wire_bytes(parts[rank])
    model = Counts()
    layout = Layout(tuple(range(size)))
    count_allreduce(model, groups_of(layout, rank), rank, Shape(n, 8), codec)
    ok = coded < stats.bytes_inter <= coded + 16 * size and stats.bytes_inter == model.bytes_inter
    assert_all(np.array_equal(result, want), "float64 reference", comm)
    assert_all(ok, f"coded bytes {stats.bytes_inter}, {coded} + agreement, model {model}", comm)
    assert_all(stats.bytes_inter < x.nbytes * 2 * (size - 1) / size / 3, "int8 sends < 1/3", comm)
    h.free()


def test_nonblocking_and_out(comm):
    rank = comm.Get_rank()
    h = hpcpar.Hierarchy(comm, layout="ppn:2")
    x = _contribution(rank, 5000)
    request = hpcpar.iallreduce(x, comm=h, compression="bf16")
    x_copy = x.copy()
    x[:] = 0  # copied when the call started
    result = request.wait()
    out = np.empty_like(x_copy)
    blocking = hpcpar.allreduce(x_copy, comm=h, compression="bf16", out=out)
    assert_all(blocking is out and np.array_equal(result, out), "iallreduce == allreduce", comm)
    h.free()


@pytest.mark.parametrize("scheme", ["1bit", "int8"])
def test_error_feedback_keeps_the_running_sum(comm, scheme):
    """sum of results + what every rank still owes == calls x the exact sum."""
    rank = comm.Get_rank()
    h = hpcpar.Hierarchy(comm, layout="ppn:2")
    rng = np.random.default_rng(rank)
    feedback = hpcpar.ErrorFeedback(h)
    plain_total = np.zeros(4000)
    fed_total = np.zeros(4000)
    exact_total = np.zeros(4000)
    for _ in range(12):
        x = rng.standard_normal(4000).astype(np.float32)
        exact_total += np.sum(comm.allgather(x), axis=0, dtype=np.float64)
        fed_total += hpcpar.allreduce(x, comm=h, compression=scheme, feedback=feedback)
        plain_total += hpcpar.allreduce(x, comm=h, compression=scheme)
    owed = np.sum(comm.allgather(feedback.owed()), axis=0, dtype=np.float64)
    scale = np.abs(exact_total).max()
    ok = np.allclose(fed_total + owed, exact_total, rtol=0, atol=1e-4 * scale)
    if h.n_nodes > 1:  # and feedback tracks better than coding alone
        ok = (
            ok and np.abs(fed_total - exact_total).mean() < np.abs(plain_total - exact_total).mean()
        )
    assert_all(ok, f"{scheme} with error feedback", comm)
    h.free()


def test_feedback_checkpoint_restores_on_another_rank_count(comm, tmp_path_factory):
    size, rank = comm.Get_size(), comm.Get_rank()
    from hpcpar.checkpoint import Checkpointer

    root = comm.bcast(str(tmp_path_factory.mktemp("ef")) if rank == 0 else None)
    h = hpcpar.Hierarchy(comm, layout="ppn:1")
    feedback = hpcpar.ErrorFeedback(h)
    x = np.random.default_rng(rank).standard_normal(3000).astype(np.float32)
    hpcpar.allreduce(x, comm=h, compression="1bit", feedback=feedback)
    owed_before = np.sum(comm.allgather(feedback.owed()), axis=0, dtype=np.float64)
    with Checkpointer(root, comm=comm, levels=["hdf5"]) as ck:
        ck.save(1, {"ef": feedback.state_dict()}).wait()
    # the same ranks: each gets its row back, and the next call runs as if uninterrupted
    same = hpcpar.ErrorFeedback(h)
    with Checkpointer(root, comm=comm, levels=["hdf5"]) as ck:
        same.load_state_dict(ck.restore()[1]["ef"])
    a = hpcpar.allreduce(x, comm=h, compression="1bit", feedback=feedback)
    b = hpcpar.allreduce(x, comm=h, compression="1bit", feedback=same)
    assert_all(np.array_equal(a, b), "restored on the same ranks", comm)
    # fewer ranks: what is owed in all is kept
    keep = max(1, size // 2)
    sub = comm.Split(0 if rank < keep else MPI.UNDEFINED, rank)
    if sub != MPI.COMM_NULL:
        hs = hpcpar.Hierarchy(sub, layout="ppn:1")
        restored = hpcpar.ErrorFeedback(hs)
        with Checkpointer(root, comm=sub, levels=["hdf5"]) as ck:
            restored.load_state_dict(ck.restore()[1]["ef"])
        owed_after = np.sum(sub.allgather(restored.owed()), axis=0, dtype=np.float64)
        ok = np.allclose(owed_after, owed_before, rtol=0, atol=1e-5 * np.abs(owed_before).max())
        y = np.ones(3000, np.float32)
        total = hpcpar.allreduce(y, comm=hs, compression="1bit", feedback=restored)
        left = np.sum(sub.allgather(restored.owed()), axis=0, dtype=np.float64)
        # the restored residual joined the sum: result + still owed == exact + owed before
        ok = ok and np.allclose(
            total + left, keep * 1.0 + owed_before, atol=1e-4 * max(1, np.abs(owed_before).max())
        )
        assert_all(ok, "restored on fewer ranks", sub)
        hs.free()
        sub.Free()
    comm.Barrier()
    h.free()


def test_explain_ranks_schemes_and_auto_respects_the_tolerance(comm):
    h = hpcpar.Hierarchy(comm, layout="ppn:1")
    plan = hpcpar.explain("allreduce", 16 << 20, h, itemsize=4, compression="auto", tolerance=1e-9)
    names = {s.scheme for s in plan.schemes}
    ok = names == {"exact", "fp16", "bf16", "int8", "1bit"} and plan.compression == "exact"
    loose = hpcpar.explain("allreduce", 16 << 20, h, itemsize=4, compression="auto", tolerance=3.0)
    ok = ok and "error bound" in str(loose) and "compression:" in str(loose)
    if h.n_nodes > 1:
        bounds = {s.scheme: s.bound for s in plan.schemes}
        ok = ok and bounds["fp16"] < bounds["bf16"] < bounds["int8"] < bounds["1bit"]
    else:
        ok = ok and loose.compression == "exact" and "one node" in loose.compression_reason
    # a tolerance no scheme meets runs exact: bit for bit the plain call
    x = _contribution(comm.Get_rank(), 1000)
    strict = hpcpar.allreduce(x, comm=h, compression="auto", tolerance=1e-9)
    ok = ok and np.array_equal(strict, hpcpar.allreduce(x, comm=h))
    assert_all(ok, "explain with compression", comm)
    h.free()


@pytest.mark.reliability("bad_input")
def test_bad_input_is_one_clear_error_on_every_rank(comm):
    h = hpcpar.Hierarchy(comm, layout="ppn:1")
    cases = [
        (
            lambda: hpcpar.allreduce(np.ones(4, np.int32), comm=h, compression="int8"),
            "float32 and float64",
        ),
        (
            lambda: hpcpar.allreduce(np.ones(4, np.float32), MPI.MAX, comm=h, compression="int8"),
            "op SUM only",
        ),
        (
            lambda: hpcpar.allreduce(np.ones(4), comm=h, compression="int8", reproducible=True),
            "cannot be combined",
        ),
        (
            lambda: hpcpar.allreduce(np.ones(4), comm=h, compression="int8", algorithm="ring"),
            "leave algorithm='auto'",
        ),
        (
            lambda: hpcpar.allreduce(np.ones(4), comm=h, compression=Compression("int8", block=0)),
            "block size",
        ),
        (
            lambda: hpcpar.allreduce(
                np.ones(4), comm=h, compression="auto", tolerance=float("nan")
            ),
            "tolerance",
        ),
        (
            lambda: hpcpar.allreduce(np.ones(4), comm=h, compression="auto", tolerance=-1),
            "tolerance",
        ),
        (
            lambda: hpcpar.allreduce(np.ones(4), comm=h, feedback=hpcpar.ErrorFeedback(h)),
            "feedback= applies",
        ),
    ]
    for call, match in cases:
        with pytest.raises(CollectiveError, match=match):
            call()
    if h.n_nodes > 1:
        with pytest.raises(CollectiveError, match="over tolerance"):
            hpcpar.allreduce(np.ones(4, np.float32), comm=h, compression="int8", tolerance=1e-6)
    comm.Barrier()
    h.free()


@pytest.mark.reliability("bad_input")
def test_ranks_that_disagree_on_the_scheme_fail_together(comm):
    if comm.Get_size() < 2:
        pytest.skip("needs two ranks to disagree")
    h = hpcpar.Hierarchy(comm, layout="ppn:1")
    rank = comm.Get_rank()
    for mine in (
        "int8" if rank == 0 else "fp16",
        Compression("int8", block=128 if rank == 0 else 256),
    ):
        with pytest.raises(
            CollectiveMismatchError, match="ranks passed different compression"
        ) as info:
            hpcpar.allreduce(np.ones(1000, np.float32), comm=h, compression=mine)
        assert "on rank(s) 0" in str(info.value)
    # and the communicator still works
    after = hpcpar.allreduce(np.ones(10, np.float32), comm=h, compression="int8")
    assert_all(np.array_equal(after, np.full(10, comm.Get_size(), np.float32)), "after", comm)
    h.free()


@pytest.mark.parametrize("scheme", ["int8", "1bit"])
def test_a_vector_of_several_segments_is_the_same_coding(comm, scheme):
    """Segments pipeline the stages; blocks never straddle them, so the result is the
    one-process reference's all the same (with error feedback's invariant kept)."""
    from hpcpar.collectives.compression.allreduce import segments

    rank = comm.Get_rank()
    h = hpcpar.Hierarchy(comm, layout="ppn:2")
    n = 700_001
    assert len(segments(n, 256)) >= 3
    x = _contribution(rank, n)
    everyone = comm.allgather(x)
    result = hpcpar.allreduce(x, comm=h, compression=scheme)
    if h.n_nodes == 1:
        ok = np.array_equal(result, hpcpar.allreduce(x, comm=h))
    else:
        ok = np.array_equal(result, _reference(codec_for(scheme), _node_sums(h, everyone)))
    feedback = hpcpar.ErrorFeedback(h)
    total = np.zeros(n)
    for _ in range(3):
        total += hpcpar.allreduce(x, comm=h, compression=scheme, feedback=feedback)
    owed = np.sum(comm.allgather(feedback.owed()), axis=0, dtype=np.float64)
    exact = 3 * np.sum(everyone, axis=0, dtype=np.float64)
    ok = ok and np.allclose(total + owed, exact, rtol=0, atol=1e-3 * np.abs(exact).max())
    assert_all(ok and len({r.tobytes() for r in comm.allgather(result)}) == 1, scheme, comm)
    h.free()
