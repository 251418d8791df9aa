"""Irregular layouts (indexed, structs): the block loop, numpy's take and put, and
copies split over threads, all against MPI's bytes (``datatypes/kernels.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from datatype_layouts import area_for, assert_unpacks_like_mpi, irregular_type
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

from hpcpar import datatypes
from hpcpar.datatypes import DatatypeError
from hpcpar.datatypes.decode import mpi_pack


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
    dt = irregular_type(kind).Commit()
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
    dt = irregular_type(kind).Commit()
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
    dt = irregular_type("scattered 8 B blocks").Commit()
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
