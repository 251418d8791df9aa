"""Datatype plans: differential against MPI's own Pack/Unpack, canonical forms, views, bad input."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import hpcpar
from hpcpar import datatypes
from hpcpar.datatypes import DatatypeError
from hpcpar.datatypes.decode import mpi_pack, probe_layout
from hpcpar.datatypes.gpu import gpu_available

NAMED = [MPI.BYTE, MPI.SHORT, MPI.INT, MPI.DOUBLE, MPI.FLOAT, MPI.C_DOUBLE_COMPLEX]


@st.composite
def datatypes_trees(draw, depth=0):
    """Random nested datatypes (the caller frees the returned list)."""
    made = []
    if depth >= 3 or (draw(st.booleans()) and depth > 0):
        return draw(st.sampled_from(NAMED)), made
    old, inner = draw(datatypes_trees(depth=depth + 1))
    made += inner
    kind = draw(
        st.sampled_from(
            [
                "contiguous",
                "vector",
                "hvector",
                "indexed",
                "hindexed",
                "indexed_block",
                "struct",
                "resized",
                "subarray",
                "dup",
            ]
        )
    )
    extent = old.Get_extent()[1]
    if kind == "contiguous":
        dt = old.Create_contiguous(draw(st.integers(1, 4)))
    elif kind == "vector":
        dt = old.Create_vector(
            draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.integers(-4, 6))
        )
    elif kind == "hvector":
        dt = old.Create_hvector(
            draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.integers(-64, 64))
        )
    elif kind == "indexed":
        n = draw(st.integers(1, 4))
        dt = old.Create_indexed(
            draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)),
            draw(st.lists(st.integers(-3, 8), min_size=n, max_size=n)),
        )
    elif kind == "hindexed":
        n = draw(st.integers(1, 4))
        dt = old.Create_hindexed(
            draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)),
            draw(st.lists(st.integers(-40, 80), min_size=n, max_size=n)),
        )
    elif kind == "indexed_block":
        n = draw(st.integers(1, 4))
        dt = old.Create_indexed_block(
            draw(st.integers(1, 3)), draw(st.lists(st.integers(0, 8), min_size=n, max_size=n))
        )
    elif kind == "struct":
        other = draw(st.sampled_from(NAMED))
        dt = MPI.Datatype.Create_struct(
            [draw(st.integers(1, 3)), draw(st.integers(0, 2))],
            [0, draw(st.integers(-32, 96))],
            [old, other],
        )
    elif kind == "resized":
        dt = old.Create_resized(
            draw(st.integers(-24, 8)), max(1, extent + draw(st.integers(0, 24)))
        )
    elif kind == "subarray":
        sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
        subs = [draw(st.integers(1, s)) for s in sizes]
        starts = [draw(st.integers(0, s - b)) for s, b in zip(sizes, subs, strict=True)]
        order = draw(st.sampled_from([MPI.ORDER_C, MPI.ORDER_FORTRAN]))
        dt = old.Create_subarray(sizes, subs, starts, order=order)
    else:
        dt = old.Dup()
    made.append(dt)
    return dt, made


def area_for(dt, count, seed):
    """Random bytes covering count elements, and the origin inside them."""
    lb, extent = dt.Get_extent()
    tlb, textent = dt.Get_true_extent()
    lows = [tlb, tlb + (count - 1) * extent, lb]
    highs = [
        tlb + textent,
        tlb + textent + (count - 1) * extent,
        lb + extent * count,
        extent * count,
    ]
    origin = max(0, -min(lows))
    area = np.random.default_rng(seed).integers(0, 256, origin + max(highs) + 8).astype(np.uint8)
    return area, origin


def assert_unpacks_like_mpi(p, dt, packed, area, origin, count):
    """``p.unpack`` of ``packed`` writes what ``MPI.Datatype.Unpack`` writes, nothing else.

    Both as a repeated unpack and as one of a received message (copied once).
    """
    ours, once, theirs = np.zeros_like(area), np.zeros_like(area), np.zeros_like(area)
    p.unpack(packed, ours, count=count, origin=origin)
    p._unpack(packed, once, count, origin, remember=False)
    extent = dt.Get_extent()[1]
    dt.Unpack(packed, 0, theirs[origin : origin + count * extent], MPI.COMM_SELF)
    assert ours.tobytes() == theirs.tobytes()
    assert once.tobytes() == theirs.tobytes()


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(tree=datatypes_trees(), count=st.integers(1, 3), seed=st.integers(0, 1000))
def test_pack_and_unpack_match_mpi(tree, count, seed):
    dt, made = tree
    committed = dt.Dup().Commit() if not dt.is_predefined else dt
    try:
        if committed.Get_extent()[1] <= 0 or committed.Get_size() == 0:
            return  # MPI.Datatype.Pack cannot step through such elements
        p = datatypes.plan(committed)
        area, origin = area_for(committed, count, seed)
        want = mpi_pack(committed, area, origin, count)
        got = p.pack(area, count=count, origin=origin)
        assert got.tobytes() == want.tobytes()
        assert_unpacks_like_mpi(p, committed, got, area, origin, count)
        mine = p.to_mpi()  # the plan's own MPI datatype packs the same bytes
        try:
            assert mpi_pack(mine, area, origin, count).tobytes() == want.tobytes()
        finally:
            mine.Free()
    finally:
        if committed is not dt:
            committed.Free()
        for t in reversed(made):
            t.Free()


def test_darray_is_read_by_probing_mpi():
    dt = MPI.DOUBLE.Create_darray(
        4,
        1,
        [4, 6],
        [MPI.DISTRIBUTE_BLOCK, MPI.DISTRIBUTE_CYCLIC],
        [MPI.DISTRIBUTE_DFLT_DARG, 2],
        [2, 2],
    ).Commit()
    try:
        area, origin = area_for(dt, 2, 3)
        assert (
            datatypes.plan(dt).pack(area, count=2, origin=origin).tobytes()
            == mpi_pack(dt, area, origin, 2).tobytes()
        )
    finally:
        dt.Free()


def same_plan(*types):
    plans = [datatypes.plan(t.Commit()).items for t in types]
    for t in types:
        t.Free()
    return all(p == plans[0] for p in plans)


def test_equivalent_constructions_give_one_plan():
    d = MPI.DOUBLE
    # 3 rows of 4 doubles out of a 3x10 array: vector, hvector of contiguous, subarray,
    # indexed, and a struct of three rows all describe the same bytes
    row = d.Create_contiguous(4)
    assert same_plan(
        d.Create_vector(3, 4, 10),
        row.Create_hvector(3, 1, 80),
        d.Create_subarray([3, 10], [3, 4], [0, 0]),
        d.Create_indexed([4, 4, 4], [0, 10, 20]),
        d.Create_hindexed_block(4, [0, 80, 160]),
        MPI.Datatype.Create_struct([1, 1, 1], [0, 80, 160], [row, row, row]),
    )
    row.Free()
    # contiguous of contiguous, one long block, and adjacent blocks that touch
    assert same_plan(
        d.Create_contiguous(12), d.Create_vector(3, 4, 4), d.Create_indexed([2, 10], [0, 2])
    )
    # Fortran-order subarray = vector of the transposed shape
    assert same_plan(
        d.Create_subarray([10, 3], [4, 3], [0, 0], order=MPI.ORDER_FORTRAN),
        d.Create_vector(3, 4, 10),
    )
    # a numpy view of the same region gives the same layout
    view = np.zeros((3, 10))[:, :4]
    v = d.Create_vector(3, 4, 10).Commit()
    assert datatypes.plan(view).items == datatypes.plan(v).items
    v.Free()


@pytest.mark.parametrize(
    "slicer",
    [
        lambda a: a[::2, 1:4, ::-1],
        lambda a: a.T,
        lambda a: a[:, :, 2],
        lambda a: a[::-1, ::3],
        lambda a: a[1:2, 0:0],
        lambda a: a[...],
        lambda a: a[0, 0, :1],
    ],
)
@pytest.mark.parametrize("dtype", ["u1", "i2", "f8", "c16", [("x", "i1"), ("y", "f8")]])
def test_view_plans_pack_like_ascontiguousarray(slicer, dtype):
    base = (
        np.arange(4 * 5 * 6).reshape(4, 5, 6).astype(dtype)
        if not isinstance(dtype, list)
        else (np.zeros((4, 5, 6), dtype=dtype))
    )
    view = slicer(base)
    p = datatypes.plan(view)
    packed = p.pack(view)
    assert packed.tobytes() == np.ascontiguousarray(view).tobytes()
    target = np.zeros_like(base)
    p.unpack(packed, slicer(target))
    assert np.array_equal(slicer(target), view)


@pytest.mark.parametrize(
    "slicer",
    [
        lambda a: a[1:-1, 1:-1, 1:-1],  # the interior of a block: rows at two strides
        lambda a: a[:, ::2, :],
        lambda a: a[::-1, :, 3:120:2],
        lambda a: a[7, ::-1, 1:],  # two dimensions
        lambda a: a.reshape(16, 8, 128, 128)[:, 1:, :, 2:],  # three strides and the words
        lambda a: a.reshape(64, 32768)[::2],  # rows of 32-512 KiB: numpy's memcpy
    ],
)
@pytest.mark.parametrize("dtype", ["u1", "i2", "f4", "f8", "c16"])
@pytest.mark.parametrize("streaming", [False, True])
def test_large_strided_views_run_the_compiled_loop_like_numpy(
    slicer, dtype, streaming, monkeypatch
):
    from hpcpar.datatypes import kernels

    used = []
    loop = kernels._compiled
    monkeypatch.setattr(kernels, "_compiled", lambda n, s: used.append((n, s)) or loop(n, s))
    # streaming stores from 1 MiB (every compiled copy here), or never
    monkeypatch.setattr(
        kernels, "STREAMING_BYTES", kernels.COMPILED_BYTES if streaming else 1 << 62
    )
    base = (np.arange(128**3) % 251).astype(dtype).reshape(128, 128, 128)
    view = slicer(base)
    p = datatypes.plan(view)
    packed = p.pack(view)  # 16 KiB to 32 MiB: numpy's copy, or a loop over the cores
    assert packed.tobytes() == np.ascontiguousarray(view).tobytes()
    packing = used[:]
    target = np.zeros_like(base)
    p.unpack(packed, slicer(target))  # into strided memory: nothing else written
    assert np.array_equal(slicer(target), view) and np.count_nonzero(target) <= view.size
    unpacking = used[len(packing) :]
    # 16-byte elements of a view stay with numpy's copy (the loops move 1-8 byte words);
    # streaming takes rows of any length, ordinary stores only short rows (numpy's
    # memcpy of each row is faster on longer ones while they sit in the cache)
    row = view.shape[-1] * view.itemsize
    compiled = view.nbytes >= kernels.COMPILED_BYTES and base.itemsize <= 8
    # ... except rows of 256 B - 64 KiB read sparsely (under 3/4 of their stride)
    sparse = view.ndim > 1 and view.strides[-1] == view.itemsize
    sparse = sparse and 4 * row < 3 * abs(view.strides[-2])
    sparse = sparse and kernels.SHORT_ROW_BYTES <= row < kernels.LONG_ROW_BYTES
    wanted = row < kernels.SHORT_ROW_BYTES or (streaming and not sparse)
    assert bool(packing) == (compiled and wanted), (packing, row, sparse)
    assert all(1 <= n <= 4 and s == streaming for n, s in packing), packing
    # unpacking streams only into runs of 256 B and more (whole rows of the view)
    run = row if view.strides[-1] == view.itemsize else view.itemsize
    unpack_streams = streaming and run >= kernels.STREAM_RUN_BYTES
    assert all(s == unpack_streams for _, s in unpacking), (unpacking, run)
    assert bool(unpacking) == (compiled and (row < kernels.SHORT_ROW_BYTES or unpack_streams))


@pytest.mark.parametrize("streaming", [False, True])
def test_large_mpi_vectors_pack_like_mpi_with_the_compiled_loop(streaming, monkeypatch):
    from hpcpar.datatypes import kernels

    monkeypatch.setattr(
        kernels, "STREAMING_BYTES", kernels.COMPILED_BYTES if streaming else 1 << 62
    )
    used = []
    loop = kernels._compiled
    monkeypatch.setattr(kernels, "_compiled", lambda n, s: used.append((n, s)) or loop(n, s))
    for block, stride in ((16, 32), (1, 3), (100, 101)):
        t = MPI.DOUBLE.Create_vector(-(-(2**17) // block), block, stride).Commit()
        src = np.random.default_rng(block).random(-(-(2**17) // block) * stride)
        p = datatypes.plan(t)
        assert p.size >= kernels.COMPILED_BYTES
        packed = p.pack(src)
        assert packed.tobytes() == mpi_pack(t, src.view(np.uint8), 0).tobytes()
        back = np.zeros_like(src)
        p.unpack(packed, back)
        mask = np.zeros(src.size, bool)
        mask.reshape(-1, stride)[:, :block] = True
        assert np.array_equal(back[mask], src[mask]) and not back[~mask].any()
        t.Free()
    # single doubles (1-D) stream; blocks of 16 and 100 doubles are rows of a 2-D loop
    assert ((1, True) in used) == streaming and ((2, True) in used) == streaming


def test_structured_dtypes_skip_padding():
    dt = np.dtype([("a", "i1"), ("b", "f8"), ("c", "i2", (3,))], align=True)
    p = datatypes.plan(dt)
    assert p.size == 1 + 8 + 6 and p.extent == dt.itemsize
    record = np.zeros(4, dtype=dt)
    record["a"], record["b"], record["c"] = 1, 2.5, [[7, 8, 9]] * 4
    packed = p.pack(record, count=4)
    first = packed[: p.size].tobytes()
    assert (
        first
        == np.int8(1).tobytes()
        + np.float64(2.5).tobytes()
        + np.array([7, 8, 9], np.int16).tobytes()
    )


def test_describe_and_to_mpi():
    dt = MPI.DOUBLE.Create_vector(3, 2, 5).Commit()
    text = datatypes.plan(dt).describe()
    assert "block 16 B at 0, over 3@40" in text and "48 bytes packed" in text
    dt.Free()


@pytest.mark.parametrize("shape", [(8,), (64, 64), (512, 512)])  # small, cached, large
def test_views_of_padded_records_pack_their_bytes_padding_included(shape):
    """numpy copies records field by field and leaves padding uninitialised; a pack
    must carry the view's own bytes (deterministic, nothing from fresh memory)."""
    record = np.dtype([("a", "i1"), ("b", "f8")], align=True)  # 7 bytes of padding
    whole = np.random.default_rng(3).integers(0, 255, int(np.prod(shape)) * 16, dtype=np.uint8)
    a = whole.view(record).reshape(shape)
    where = (slice(None, None, 2),) + (slice(1, None, 3),) * (len(shape) - 1)
    view = a[where]
    raw = np.dtype((np.void, record.itemsize))
    expected = np.ascontiguousarray(view.view(raw)).view(np.uint8).reshape(-1)
    p = datatypes.plan(view)
    for _ in range(2):  # the second time through what the first remembered
        assert np.array_equal(p.pack(view), expected)
        out = np.empty(p.size, np.uint8)
        assert np.array_equal(p.pack(view, out=out), expected)
    target = np.zeros_like(a)
    p.unpack(expected, target[where])
    assert target[where].view(raw).tobytes() == view.view(raw).tobytes()


def test_a_view_plan_packs_and_unpacks_other_strides_of_its_shape_exactly_every_time():
    from hpcpar.datatypes.views import unpack_view_once

    a = np.random.default_rng(5).random((64, 64, 64))
    views = [a[:, 0, :], a[0, :, :].T, a[:, :, 3], a[::-1, 5, :]]  # one shape, four layouts
    p = datatypes.plan(views[0])
    for _ in range(2):  # the second time, what the first chose for those strides is reused
        for v in views:
            assert p.pack(v).tobytes() == np.ascontiguousarray(v).tobytes()
            target = np.zeros_like(a)
            for w in (target[:, 0, :], target[0, :, :].T, target[:, :, 3], target[::-1, 5, :]):
                w[...] = 0
                unpack_view_once(p, np.ascontiguousarray(v), w)
                assert np.array_equal(w, v)
                w[...] = 0
                assert not target.any()  # nothing written outside the view


@pytest.mark.parametrize(
    "shape, step",
    [
        ((8192 + 5,), (9,)),  # 1-D, words 72 B apart
        ((8200,), (-16,)),  # negative stride
        ((3, 5000), (7, 9)),  # rows longer than the look-ahead
        ((300, 31), (2, 8)),  # rows shorter than it: the load ahead wraps to later rows
        ((900, 10), (2, 8)),  # rows shorter than the unpack's look-ahead too
        ((8193, 1), (8, 1)),  # a trailing single column
    ],
)
@pytest.mark.parametrize("dtype", ["f8", "u4"])
@pytest.mark.parametrize("distance", [0, 4, 32])
def test_sparse_words_pack_and_unpack_exactly_with_the_look_ahead_loop(
    shape, step, dtype, distance, monkeypatch
):
    from hpcpar.datatypes import kernels, loops
    from hpcpar.datatypes.kernels import AHEAD_WORDS, copy_op

    monkeypatch.setattr(loops, "distance", lambda gather: distance)
    monkeypatch.setattr(kernels, "_loops", {})
    sizes = [abs(k) * n for k, n in zip(step, shape, strict=True)]
    base = np.random.default_rng(len(shape)).random((*sizes, 2)).astype(dtype)
    where = (*(slice(None, None, k) for k in step), 0)
    view = base[where]
    assert view.shape == shape and view.size >= AHEAD_WORDS
    copy, _, _ = copy_op(np.empty(view.shape, view.dtype), view)
    # one word a cache line: the look-ahead loop packs it, unless loading ahead is slower
    assert ("ahead" in repr(copy)) == (distance > 0)
    p = datatypes.plan(view)
    packed = p.pack(view)
    assert packed.tobytes() == np.ascontiguousarray(view).tobytes()
    back = np.zeros_like(base)
    target = back[where]
    p.unpack(packed, target)
    assert np.array_equal(target, view)
    target[...] = 0
    assert not back.any()  # nothing written outside the view


def test_the_look_ahead_distance_is_measured_once_among_the_candidates():
    from hpcpar.datatypes import loops

    for gather in (True, False):
        d = loops.distance(gather)
        assert d in loops.DISTANCES
        assert loops.distance(gather) == d  # kept for the process


@pytest.mark.parametrize("offset", [0, 1, 2, 4])  # aligned for words, or only for bytes
@pytest.mark.parametrize("dtype", ["u1", "u2", "u4"])
def test_large_views_of_small_elements_move_as_words_exactly(offset, dtype):
    from hpcpar.datatypes.kernels import WIDEN_BYTES, _widest, copy_op

    raw = np.random.default_rng(offset).integers(0, 255, 64 * 1024 + 8, dtype=np.uint8)
    base = raw[offset : offset + 64 * 1024].view(dtype)
    view = base.reshape(256, -1)[:, : 64 // base.itemsize]  # rows of 64 bytes, 256 apart
    assert view.nbytes >= WIDEN_BYTES
    p = datatypes.plan(view)
    packed = p.pack(view)
    assert packed.tobytes() == np.ascontiguousarray(view).tobytes()
    back = np.zeros_like(base)
    target = back.reshape(256, -1)[:, : 64 // base.itemsize]
    p.unpack(packed, target)
    assert (
        np.array_equal(target, view) and not back.reshape(256, -1)[:, 64 // base.itemsize :].any()
    )
    _, _, src = copy_op(np.empty(view.shape, view.dtype), view)
    assert src.dtype.kind == "V" and src.shape == (256,)  # numpy's copy: whole 64 B rows
    _, src = _widest(np.empty(view.shape, view.dtype), view)  # compiled loops: words
    aligned_for = next(w for w in (8, 4, 2, 1) if (raw.ctypes.data + offset) % w == 0)
    assert src.dtype.itemsize == max(aligned_for, base.itemsize)  # the widest word allowed


@pytest.mark.parametrize(
    "slicer",
    [
        lambda a: a.reshape(-1)[::2],  # 1,000 single doubles: 62 groups of 16 and a tail of 8
        lambda a: a.reshape(-1)[: 16 * 20 * 2 : 2],  # 320 = 20 groups of 16, no tail
        lambda a: a.reshape(10, 10, 20)[:, :, 3],  # 100 blocks at one stride (merged dims)
        lambda a: a.reshape(40, 50)[1:-1, 2:40:2],  # rows of 19 single doubles, 38 rows
        lambda a: a.reshape(40, 50)[::-2, 1:4],  # 24 B blocks, negative stride
        lambda a: a.reshape(-1).view(np.uint8)[: 17 * 12].reshape(17, 12)[:, :3],  # odd bytes
        lambda a: a.reshape(2, 1000)[:, ::17],  # 2 x 59 single doubles
    ],
)
def test_to_mpi_packs_what_the_plan_packs(slicer):
    from hpcpar.datatypes.ir import shift
    from hpcpar.datatypes.plan import Plan

    a = np.random.default_rng(3).random(2000)
    view = slicer(a)
    p = datatypes.plan(view)
    lo, hi = p.true_bounds
    dt = Plan(shift(p.items, -lo), 0, hi - lo).to_mpi()  # the type zero-copy sends use
    owner = a.reshape(-1).view(np.uint8)
    start = view.__array_interface__["data"][0] - a.__array_interface__["data"][0]
    got = mpi_pack(dt, owner[start + lo : start + hi], 0)
    assert got.tobytes() == np.ascontiguousarray(view).tobytes()
    dt.Free()


def test_bad_input():
    freed = MPI.DOUBLE.Create_contiguous(2).Commit()
    freed.Free()
    with pytest.raises(DatatypeError, match="DATATYPE_NULL"):
        datatypes.plan(freed)
    with pytest.raises(DatatypeError, match="zero strides"):
        datatypes.plan(np.broadcast_to(np.arange(3.0), (4, 3)))
    vec = MPI.DOUBLE.Create_vector(4, 1, 3).Commit()
    p = datatypes.plan(vec)
    area = np.zeros(100, np.uint8)
    for count in (-1, 2**41, 1.5, True):
        with pytest.raises(DatatypeError, match="count"):
            p.pack(area, count=count)
    with pytest.raises(DatatypeError, match="reach bytes"):  # would read past the end
        p.pack(area, count=2)
    with pytest.raises(DatatypeError, match="reach bytes"):
        p.pack(area, origin=-1)
    with pytest.raises(DatatypeError, match="out has 8 bytes"):
        p.pack(np.zeros(200, np.uint8), out=np.zeros(8, np.uint8))
    packed = p.pack(np.zeros(200, np.uint8))
    with pytest.raises(DatatypeError, match="buf has"):
        p.unpack(packed[:10], np.zeros(200, np.uint8))
    frozen = np.zeros(200, np.uint8)
    frozen.flags.writeable = False
    with pytest.raises(DatatypeError, match="read-only"):
        p.unpack(packed, frozen)
    both = np.zeros(400, np.uint8)
    with pytest.raises(DatatypeError, match="overlap"):
        p.unpack(both[:32], both)
    guard = np.full(300, 7, np.uint8)
    with pytest.raises(DatatypeError):
        p.unpack(np.ones(64, np.uint8), guard[:50])
    assert (guard == 7).all()  # nothing written when refused
    vec.Free()


def test_probe_agrees_with_decoding_on_simple_types():
    dt = MPI.DOUBLE.Create_vector(3, 2, 5).Commit()
    assert probe_layout(dt) == datatypes.plan(dt).items
    dt.Free()


@pytest.mark.parametrize("crowded", [False, True])
def test_without_a_table_regular_layouts_go_as_datatypes_irregular_ones_packed(
    crowded, monkeypatch
):
    from hpcpar.datatypes import choose
    from hpcpar.runtime.profile import default_profile, profile_from_json

    monkeypatch.setattr(choose, "oversubscribed", lambda: crowded)
    rows = 64 + 2 * crowded  # a layout of its own per case: the choice is kept per layout
    regular = datatypes.plan(np.zeros((rows, 131072), np.uint8)[:, :65536])
    method, reason = choose.send_method(regular, profile=default_profile())
    assert method == ("pack" if crowded else "datatype")
    assert ("more ranks than cores" in reason) == crowded
    spots = np.sort(np.random.default_rng(rows).choice(8000, 1000, replace=False)) * 8
    dt = MPI.BYTE.Create_hindexed_block(8, [int(x) for x in spots]).Commit()  # 8,000 B
    try:
        method, reason = choose.send_method(datatypes.plan(dt), profile=default_profile())
        assert method == "pack" and "irregular" in reason
        # a measured table that favours datatypes for such blocks does not decide: it is
        # measured on regular vectors
        methods = {"send_methods": {"ranks": 2, "table": [[8, 8192, 1.0, 1e-6]]}}
        doc = {**default_profile().to_json(), "mpi_library": methods}
        fresh = MPI.BYTE.Create_hindexed_block(8, [int(x) + 8 for x in spots]).Commit()
        try:
            measured = profile_from_json(doc)
            assert choose.send_method(datatypes.plan(fresh), profile=measured)[0] == "pack"
        finally:
            fresh.Free()
    finally:
        dt.Free()


def test_oversubscribed_compares_the_launchers_ranks_with_the_nodes_cores(monkeypatch):
    from hpcpar.datatypes import choose

    monkeypatch.setattr(choose, "local_ranks", lambda: 4)
    monkeypatch.setattr(choose.os, "cpu_count", lambda: 2)
    assert choose.oversubscribed()
    monkeypatch.setattr(choose.os, "cpu_count", lambda: 4)
    assert not choose.oversubscribed()


def test_send_method_follows_the_measured_table():
    from hpcpar.datatypes.choose import send_method
    from hpcpar.runtime.profile import ProfileError, default_profile, profile_from_json

    table = [[8, 65536, 2e-4, 1e-4], [65536, 4194304, 1e-3, 2e-3]]
    doc = {
        **default_profile().to_json(),
        "mpi_library": {"send_methods": {"ranks": 2, "table": table}},
    }
    profile = profile_from_json(doc)
    small = datatypes.plan(np.zeros((4096, 16), np.uint8)[:, :8])
    big = datatypes.plan(np.zeros((64, 131072), np.uint8)[:, :65536])
    method, reason = send_method(small, profile=profile)
    assert method == "datatype"  # 32 KiB of 8 B blocks: half the measured class's bytes
    assert "predicted for 32768 B: pack 100.0 us, datatype 50.0 us" in reason
    assert send_method(big, profile=profile)[0] == "pack"
    tiny = datatypes.plan(np.zeros((64, 16), np.uint8)[:, :8])
    assert send_method(tiny, profile=default_profile())[0] == "datatype"  # no table: 512 B
    assert send_method(tiny, profile=profile)[0] == "datatype"  # the table's nearest class
    plane = MPI.DOUBLE.Create_subarray([8, 64, 64], [1, 64, 64], [3, 0, 0]).Commit()
    method, reason = send_method(datatypes.plan(plane), profile=default_profile())
    assert method == "datatype" and "contiguous" in reason  # 32 KiB, but nothing to pack
    plane.Free()
    # a fifth column, the stride: dense and sparse layouts of one block size differ
    doc["mpi_library"]["send_methods"]["table"] = [
        [8, 65536, 1e-4, 2e-4, 16],  # 8 B blocks 16 B apart: pack wins
        [8, 65536, 2e-4, 1e-4, 768],  # 8 B blocks 768 B apart (a z face): datatype wins
    ]
    strided = profile_from_json(doc)
    dense = datatypes.plan(np.zeros((8192, 2))[:, 0])
    sparse = datatypes.plan(np.zeros((96 * 96, 96))[:, 0])
    assert send_method(dense, profile=strided)[0] == "pack"
    assert send_method(sparse, profile=strided)[0] == "datatype"
    for bad in ([[8, 65536, 2e-4]], [[8, 65536, 1e-4, 2e-4, 16, 3]], [[8, 65536, 1, 2, "x"]]):
        doc["mpi_library"]["send_methods"]["table"] = bad
        with pytest.raises(ProfileError, match=r"send_methods\.table"):
            profile_from_json(doc)


class _FakeDeviceArray:
    """Only the CUDA array interface of a device array (nothing behind its pointer)."""

    def __init__(self, shape: tuple[int, ...], strides: tuple[int, ...]) -> None:
        self.__cuda_array_interface__ = {
            "shape": shape,
            "strides": strides,
            "typestr": "<f8",
            "data": (0, False),
            "version": 3,
        }


def test_device_send_method_follows_the_table_else_the_layout():
    from hpcpar.datatypes.choose import device_send_method, explain_send
    from hpcpar.runtime.profile import ProfileError, default_profile, profile_from_json

    bare = default_profile()
    column = datatypes.plan(np.zeros((64, 64))[:, :8])  # one strided run: one 2D copy
    interior = datatypes.plan(np.zeros((8, 8, 8))[1:-1, 1:-1, 1:-1])  # two strided dims
    backwards = datatypes.plan(np.zeros(64)[::-2])  # a 2D copy's pitch cannot be negative
    contiguous = datatypes.plan(np.zeros(64))
    assert device_send_method(column, bare)[0] == "staged"
    assert device_send_method(contiguous, bare)[0] == "staged"
    assert device_send_method(interior, bare)[0] == "device"
    assert device_send_method(backwards, bare)[0] == "device"
    table = [[64, 4096, 1e-5, 2e-5], [8, 4096, 3e-5, 2e-5]]  # [block, bytes, device s, staged s]
    doc = {**bare.to_json(), "mpi_library": {"device_send_methods": {"ranks": 1, "table": table}}}
    measured = profile_from_json(doc)
    method, reason = device_send_method(column, measured)  # 64 B blocks: the first row
    assert method == "device" and "measured at 64 B blocks / 4096 B: 20.0 and 10.0 us" in reason
    assert "predicted for 4096 B: staged 20.0 us, device 10.0 us" in reason  # 64 x 8 doubles
    assert device_send_method(backwards, measured)[0] == "staged"  # 8 B blocks: the second
    text = explain_send(_FakeDeviceArray((16, 4), (256, 8)), profile=bare)
    assert "send by: staged" in text and "typical block 32 B" in text
    doc["mpi_library"]["device_send_methods"]["table"] = [[8, 4096, 1e-5]]
    with pytest.raises(ProfileError, match=r"device_send_methods\.table must be \[\[block"):
        profile_from_json(doc)


def test_device_views_bad_input_without_a_gpu():
    with pytest.raises(DatatypeError, match="zero strides"):
        datatypes.plan(_FakeDeviceArray((4, 4), (0, 8)))
    fake = _FakeDeviceArray((4, 4), (64, 8))
    assert datatypes.plan(fake).size == 128  # the plan needs only the interface
    with pytest.raises(DatatypeError, match="GPU array must be auto, staged or device"):
        hpcpar.send(fake, 0, comm=MPI.COMM_SELF, method="pack")
    try:
        import cupy  # noqa: F401
    except ImportError:
        with pytest.raises(DatatypeError, match="GPU array; sending or receiving it needs cupy"):
            hpcpar.send(fake, 0, comm=MPI.COMM_SELF)
        with pytest.raises(DatatypeError, match="needs cupy"):
            hpcpar.recv(fake, 0, comm=MPI.COMM_SELF)


@pytest.mark.skipif(not gpu_available(), reason="needs cupy and a GPU")
@pytest.mark.parametrize("method", ["staged", "device"])
def test_gpu_views_reach_the_host_and_back(method):
    import cupy

    from hpcpar.datatypes.gpu import device_to_host, host_to_device

    base = np.arange(16 * 18 * 20, dtype=np.float64).reshape(16, 18, 20)
    for index in (
        np.s_[:, :, 3],  # single words at a stride: one 2D copy
        np.s_[:, 4, :],  # rows
        np.s_[2],  # contiguous
        np.s_[1:-1, 1:-1, 1:-1],  # two strided dimensions: the kernel
        np.s_[::-1, :, ::-2],  # negative strides
    ):
        device = cupy.asarray(base)
        host = device_to_host(device[index], method)
        assert host.tobytes() == np.ascontiguousarray(base[index]).tobytes(), index
        target = cupy.zeros_like(device)
        host_to_device(host, target[index], method)
        want = np.zeros_like(base)
        want[index] = base[index]
        assert cupy.asnumpy(target).tobytes() == want.tobytes(), index
    fortran = cupy.asfortranarray(cupy.asarray(base[0]))
    assert device_to_host(fortran, method).tobytes() == np.ascontiguousarray(base[0]).tobytes()


@pytest.mark.skipif(not gpu_available(), reason="needs cupy and a GPU")
def test_gpu_packers_match_the_cpu_packer():
    import cupy

    from hpcpar.datatypes.gpu import pack_device, pack_to_host, unpack_device

    for dt in (
        MPI.DOUBLE.Create_subarray([32, 32, 32], [32, 32, 1], [0, 0, 0]),
        MPI.DOUBLE.Create_vector(64, 3, 7),
        MPI.Datatype.Create_struct([1, 2], [0, 16], [MPI.INT, MPI.DOUBLE]),
        *(_irregular(kind) for kind in ("scattered 8 B blocks", "mixed lengths", "nested indexed")),
    ):
        dt.Commit()
        p = datatypes.plan(dt)
        irregular = p._block_list() is not None  # one block_copy launch for all its blocks
        area = np.random.default_rng(1).integers(0, 256, 32 * 32 * 32 * 8 * 2).astype(np.uint8)
        want = p.pack(area, count=2)
        device = cupy.asarray(area)
        assert cupy.asnumpy(pack_device(p, device, count=2)).tobytes() == want.tobytes()
        assert pack_to_host(p, device).tobytes() == p.pack(area).tobytes()
        back = cupy.zeros_like(device)
        unpack_device(p, cupy.asarray(want), back, count=2)
        mine = np.zeros_like(area)
        p.unpack(want, mine, count=2)
        assert cupy.asnumpy(back).tobytes() == mine.tobytes()
        assert irregular == any(key[0] == "device blocks" for key in p._memo if len(key) == 2)
        dt.Free()


@pytest.mark.parametrize(
    "src",
    [
        np.arange(3 * 2**18 + 5, dtype=np.int16),  # 1.5 MiB, not a multiple of the threads
        np.random.default_rng(1).random((512, 300)),  # 1.2 MiB, 2-D
        np.arange(2**21, dtype=np.float64).reshape(1024, 2048)[:, ::2],  # not contiguous
        np.arange(100, dtype=np.uint8),  # small: numpy's copy
    ],
)
def test_copy_array_copies_exactly(src):
    from hpcpar.datatypes.threads import copy_array

    dst = np.zeros_like(src)
    copy_array(dst, src)
    assert np.array_equal(dst, src) and dst.tobytes() == np.ascontiguousarray(src).tobytes()


def test_a_helper_threads_failure_reaches_the_caller_and_the_helpers_go_on():
    from hpcpar.datatypes.threads import _on_threads

    src, dst = np.arange(40.0), np.zeros(40)

    def copy(d, s):  # fails on the helper's span (not the caller's, which starts at 0)
        if s[0] != 0:
            raise ValueError("helper span refused")
        d[...] = s

    with pytest.raises(ValueError, match="helper span refused"):
        _on_threads(copy, dst, src, [0, 20, 40])
    assert np.array_equal(dst[:20], src[:20])  # the caller's part was still copied
    for _ in range(3):  # and the helpers still take work, right away and after a pause
        dst[:] = 0
        _on_threads(np.copyto, dst, src, [0, 10, 20, 30, 40])
        assert np.array_equal(dst, src)
        time.sleep(0.01)


@pytest.mark.parametrize("layout", ["contiguous", "vector", "large vector"])
def test_repeated_packs_of_the_same_buffers_see_new_data(layout):
    """The second call with the same arrays replays the first call's copies."""
    n = {"contiguous": 1000, "vector": 1000, "large vector": 2**18}[layout]
    t = (
        MPI.DOUBLE.Create_contiguous(n)
        if layout == "contiguous"
        else (MPI.DOUBLE.Create_vector(n // 2, 1, 2))
    )
    t.Commit()
    p = datatypes.plan(t)
    src, out, back = np.zeros(n), np.empty(p.size, np.uint8), np.zeros(n)
    for value in (1.0, 2.0, 3.0):
        src[:] = np.arange(n) * value
        packed = p.pack(src, out=out)
        assert packed.tobytes() == mpi_pack(t, src.view(np.uint8), 0).tobytes()
        p.unpack(out, back)
        step = 1 if layout == "contiguous" else 2
        assert np.array_equal(back[::step], src[::step])
    t.Free()


def test_streaming_starts_at_an_eighth_of_this_ranks_share_of_the_cache(monkeypatch):
    from hpcpar.datatypes import kernels, threads

    monkeypatch.setattr(kernels, "_last_level_cache", lambda: 32 << 20)
    for env, want in (
        ({}, 4 << 20),
        ({"MPI_LOCALNRANKS": "2"}, 2 << 20),
        ({"OMPI_COMM_WORLD_LOCAL_SIZE": "64"}, kernels.COMPILED_BYTES),
        ({"PMI_LOCAL_SIZE": "x"}, 4 << 20),
    ):
        for name in threads._LOCAL_RANKS:
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        assert kernels.streaming_bytes() == want, env


def test_copy_threads_are_this_ranks_share_of_the_cores(monkeypatch):
    from hpcpar.datatypes import threads
    from hpcpar.runtime.env import usable_cores

    cores = usable_cores()
    for env, want in (
        ({"MPI_LOCALNRANKS": "1"}, min(cores, 8)),
        ({"MPI_LOCALNRANKS": str(2 * cores)}, 1),  # oversubscribed: one thread each
        ({"OMPI_COMM_WORLD_LOCAL_SIZE": "1"}, min(cores, 8)),
        ({"HPCPAR_COPY_THREADS": "3", "MPI_LOCALNRANKS": "64"}, 3),
        ({"HPCPAR_COPY_THREADS": "many"}, "HPCPAR_COPY_THREADS='many': expected a whole number"),
    ):
        for name in (*threads._LOCAL_RANKS, "HPCPAR_COPY_THREADS"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(threads, "_thread_count", [])
        if isinstance(want, str):  # not a count: refused, naming the variable
            with pytest.raises(hpcpar.UsageError, match=want):
                threads.copy_threads()
        else:
            assert threads.copy_threads() == want, env


@pytest.mark.parametrize("kind", ["datatype", "view"])
def test_packer_and_unpacker_repeat_pack_and_unpack_on_new_values(kind):
    a = np.arange(64.0).reshape(8, 8)
    t = MPI.DOUBLE.Create_vector(8, 3, 8).Commit()  # the first three columns
    p = datatypes.plan(t) if kind == "datatype" else datatypes.plan(a[:, :3])
    src = a.reshape(-1).view(np.uint8) if kind == "datatype" else a[:, :3]
    out = np.empty(p.size, np.uint8)
    pack = p.packer(src, out)
    assert out.tobytes() == np.ascontiguousarray(a[:, :3]).tobytes()
    a *= -2.5  # new values in the same memory: the next call packs them
    assert pack() is None and out.tobytes() == np.ascontiguousarray(a[:, :3]).tobytes()
    back = np.zeros((8, 8))
    target = back.reshape(-1).view(np.uint8) if kind == "datatype" else back[:, :3]
    unpack = p.unpacker(out, target)
    assert np.array_equal(back[:, :3], a[:, :3]) and not back[:, 3:].any()
    out[:] = np.ascontiguousarray(a[:, :3] + 1).view(np.uint8).reshape(-1)
    unpack()
    assert np.array_equal(back[:, :3], a[:, :3] + 1) and not back[:, 3:].any()
    # unpack's remembered call checks that dst is still writable
    frozen = target.view()
    p.unpack(out, frozen)
    frozen.flags.writeable = False
    with pytest.raises(datatypes.DatatypeError, match="read-only"):
        p.unpack(out, frozen)
    with pytest.raises(datatypes.DatatypeError, match="out buffer"):
        p.packer(src, None)
    with pytest.raises(datatypes.DatatypeError, match="read-only"):
        p.unpacker(out, frozen)
    t.Free()


def test_plans_are_worked_out_once_per_layout_and_hold_no_buffers():
    import gc
    import weakref

    a = np.arange(64.0).reshape(8, 8)
    t = MPI.DOUBLE.Create_vector(8, 3, 8).Commit()
    p1, p2 = datatypes.plan(t), datatypes.plan(t)
    assert p1 is not p2 and p1 == p2  # one decoding, two plans
    assert p1._kernels(1) is p2._kernels(1)  # what the layout gives is shared ...
    o1, o2 = np.empty(p1.size, np.uint8), np.empty(p1.size, np.uint8)
    again = p1.packer(a.reshape(-1).view(np.uint8), o1)
    b = -a
    p2.pack(b.reshape(-1).view(np.uint8), out=o2)  # ... the buffers each plan packed are not
    again()
    assert o1.tobytes() == np.ascontiguousarray(a[:, :3]).tobytes()
    assert o2.tobytes() == np.ascontiguousarray(b[:, :3]).tobytes()
    assert datatypes.plan(t, count=2).size == 2 * p1.size
    t.Free()
    # a new datatype (which may reuse the freed handle) is decoded afresh: the plans went
    # with the freed datatype
    u = MPI.DOUBLE.Create_contiguous(5).Commit()
    assert datatypes.plan(u).items == datatypes.plan(np.zeros(5)).items  # 40 bytes, one block
    u.Free()
    # an uncommitted datatype is refused, as MPI would
    loose = MPI.DOUBLE.Create_vector(2, 1, 2)
    with pytest.raises(DatatypeError, match="not committed"):
        datatypes.plan(loose)
    loose.Free()
    # views: one plan per (shape, strides, dtype); packing through it keeps nothing alive
    big = np.arange(1000.0)
    gone = weakref.ref(big)
    assert datatypes.plan(big[::3]) == datatypes.plan(np.zeros(3000)[::3][:334])
    packed = datatypes.plan(big[::3]).pack(big[::3])
    assert packed.tobytes() == big[::3].tobytes()
    del big
    gc.collect()
    assert gone() is None


def _irregular(kind):
    """Irregular datatypes (the caller frees them): many small kernels, the block loop."""
    rng = np.random.default_rng(len(kind))
    if kind == "scattered 8 B blocks":  # one length: the loop with a fixed count per block
        spots = np.sort(rng.choice(np.arange(2000), 500, replace=False)) * 8
        return MPI.BYTE.Create_hindexed_block(8, [int(d) for d in spots])
    if kind == "mixed lengths":  # bytes 1-40 long at byte offsets: single bytes, merged runs
        lengths = [int(n) for n in rng.integers(1, 41, 300)]
        gaps = rng.integers(0, 30, 300)
        starts = np.cumsum(np.concatenate(([0], np.array(lengths[:-1]) + gaps[:-1])))
        return MPI.BYTE.Create_hindexed(lengths, [int(s) for s in starts])
    if kind == "struct, negative lb":  # fields of a record repeated, resized with a hole
        fields = [MPI.INT8_T, MPI.DOUBLE, MPI.INT16_T, MPI.FLOAT] * 4
        at = [-40 + 12 * i for i in range(len(fields))]
        record = MPI.Datatype.Create_struct([1] * len(fields), at, fields)
        wide = record.Create_resized(-48, 240)
        record.Free()
        return wide
    assert kind == "nested indexed"  # an indexed type of a vector, in an hvector
    vec = MPI.SHORT.Create_vector(3, 1, 5)
    idx = vec.Create_indexed([1, 2, 1, 3, 1, 2, 1, 1, 2, 1], [0, 7, 19, 40, 51, 60, 75, 77, 90, 99])
    out = idx.Create_hvector(3, 1, 4000)
    vec.Free()
    idx.Free()
    return out


@pytest.mark.parametrize("numba", [True, False])  # the compiled loop, numpy's take and put
@pytest.mark.parametrize("count", [1, 3])
@pytest.mark.parametrize("shift", [0, 1])  # an odd origin: words of one byte
@pytest.mark.parametrize(
    "kind", ["scattered 8 B blocks", "mixed lengths", "struct, negative lb", "nested indexed"]
)
def test_irregular_layouts_take_the_block_loop_and_match_mpi(
    kind, count, shift, numba, monkeypatch
):
    from hpcpar.datatypes import blocks

    if not numba:
        monkeypatch.setattr(blocks, "numba_loop", lambda *args: None)
    dt = _irregular(kind).Commit()
    try:
        p = datatypes.plan(dt)
        area, origin = area_for(dt, count, seed=count)
        area = np.concatenate([np.zeros(shift, np.uint8), area])
        origin += shift
        out = np.empty(p.size * count, np.uint8)
        for step in range(2):  # the second pack and unpack replay the first's copies
            area[origin:] = np.random.default_rng(step).integers(0, 256, area.size - origin)
            want = mpi_pack(dt, area, origin, count)
            assert p.pack(area, out, count=count, origin=origin).tobytes() == want.tobytes()
            assert p.pack(area, count=count, origin=origin).tobytes() == want.tobytes()
            assert_unpacks_like_mpi(p, dt, out, area, origin, count)
        blocks_used = p._memo["blocks"]
        assert blocks_used is not None and blocks_used.at.size >= 8  # the block loop ran
        with pytest.raises(DatatypeError, match="reach bytes"):  # nothing past the buffer
            p.pack(area[: origin + p._reach(count)[1] - 1], count=count, origin=origin)
        with pytest.raises(DatatypeError, match="reach bytes"):
            p.unpack(
                out, np.zeros(origin + p._reach(count)[1] - 1, np.uint8), count=count, origin=origin
            )
    finally:
        dt.Free()


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    lengths=st.lists(st.integers(1, 5), min_size=8, max_size=40),
    gaps=st.lists(st.integers(0, 4), min_size=40, max_size=40),
    shuffle=st.randoms(use_true_random=False),
    base=st.sampled_from([MPI.BYTE, MPI.SHORT, MPI.DOUBLE]),
    count=st.integers(1, 3),
)
def test_random_indexed_layouts_pack_and_unpack_like_mpi(lengths, gaps, shuffle, base, count):
    """Many blocks in any order (the type map's, not the addresses'): the block loop."""
    starts, at = [], 0
    for length, gap in zip(lengths, gaps, strict=False):
        starts.append(at)
        at += length + gap
    order = list(range(len(lengths)))
    shuffle.shuffle(order)
    dt = base.Create_indexed([lengths[i] for i in order], [starts[i] for i in order]).Commit()
    try:
        p = datatypes.plan(dt)
        area, origin = area_for(dt, count, seed=len(lengths))
        want = mpi_pack(dt, area, origin, count)
        assert p.pack(area, count=count, origin=origin).tobytes() == want.tobytes()
        assert_unpacks_like_mpi(p, dt, want, area, origin, count)
    finally:
        dt.Free()


@pytest.mark.parametrize("count", [1, 3])
@pytest.mark.parametrize("kind", ["scattered 8 B blocks", "mixed lengths", "nested indexed"])
def test_large_irregular_copies_split_over_threads_exactly(kind, count, monkeypatch):
    """Blocks split into runs (one element) or elements into runs (several), 3 parts."""
    from hpcpar.datatypes import blocks

    monkeypatch.setattr(blocks, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(blocks, "copy_threads", lambda: 3)
    split = []
    real = blocks._parts
    monkeypatch.setattr(blocks, "_parts", lambda *a: split.append(real(*a)) or split[-1])
    dt = _irregular(kind).Commit()
    try:
        p = datatypes.plan(dt)
        area, origin = area_for(dt, count, seed=5)
        want = mpi_pack(dt, area, origin, count)
        assert p.pack(area, count=count, origin=origin).tobytes() == want.tobytes()
        assert_unpacks_like_mpi(p, dt, want, area, origin, count)
        assert split and all(len(parts) == 3 for parts in split)  # the copies were split
    finally:
        dt.Free()


def test_describe_of_an_irregular_plan_is_capped():
    dt = _irregular("scattered 8 B blocks").Commit()
    try:
        p = datatypes.plan(dt)
        everything = p.describe(limit=None).splitlines()
        short = p.describe().splitlines()
        assert len(everything) > 100 and len(short) == 42  # the header, 40 items, the rest
        assert short[:41] == everything[:41]
        assert (
            short[-1]
            == f"  ... {len(everything) - 41:,} more lines (500 blocks: copied by the block loop)"
        )
    finally:
        dt.Free()
