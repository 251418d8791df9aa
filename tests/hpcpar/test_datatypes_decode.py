"""MPI datatypes to plans: decoding every constructor, probing, one plan per layout,
and packing and unpacking exactly as MPI does (``datatypes/decode.py``, ``ir.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from datatype_layouts import area_for, assert_unpacks_like_mpi
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

from hpcpar import datatypes
from hpcpar.datatypes import DatatypeError
from hpcpar.datatypes.decode import mpi_pack, probe_layout

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


def test_describe_and_to_mpi():
    dt = MPI.DOUBLE.Create_vector(3, 2, 5).Commit()
    text = datatypes.plan(dt).describe()
    assert "block 16 B at 0, over 3@40" in text and "48 bytes packed" in text
    dt.Free()


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
