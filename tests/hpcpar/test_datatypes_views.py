"""numpy views to plans, and the copy loops that pack them (``datatypes/plan.py``,
``kernels.py``, ``loops.py``): exactly numpy's bytes, every path."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from hpcpar import datatypes
from hpcpar.datatypes import DatatypeError
from hpcpar.datatypes.decode import mpi_pack


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
