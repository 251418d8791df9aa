"""Helpers the datatype tests share: MPI datatypes of irregular layouts, areas of random
bytes for them, and the check that an unpack writes what MPI's writes."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

__all__ = ["area_for", "assert_unpacks_like_mpi", "irregular_type"]


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


def irregular_type(kind):
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
