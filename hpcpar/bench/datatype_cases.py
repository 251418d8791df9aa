"""The cases of ``hpcpar bench datatypes`` and the sweep of one case, host and GPU alike.

Each case is a name and a function making ``(whole array, (view or Gather, MPI
datatype))``: the x, y and z faces and the interior of an N^3 float64 array, vectors of
8 B to 64 KiB blocks at twice their size apart, a padded struct, irregular layouts, and
three small messages.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .harness import Variant, format_header, format_row, sweep

__all__ = ["Gather", "cases", "small_cases", "measure_case", "traffic_of", "lines_read", "LINE"]


def cases(n: int, large: int = 16 << 20) -> list[tuple[str, Callable[[], tuple[np.ndarray, Any]]]]:
    """Every case for an N^3 array: ``(name, make)`` pairs (see the module docstring).

    ``large``: bytes each vector case packs; the largest indexed case has
    ``large / 128`` blocks (131,072 at the default 16 MiB).
    """
    from mpi4py import MPI

    def face(name: str, slicer: Any, sizes: list[int], subsizes: list[int]) -> tuple[str, Any]:
        def make() -> tuple[np.ndarray, Any]:
            a = np.random.default_rng(0).random((n, n, n))
            dt = MPI.DOUBLE.Create_subarray(sizes, subsizes, [0, 0, 0]).Commit()
            return a, (slicer(a), dt)

        return name, make

    out = [
        face("x face (contiguous plane)", lambda a: a[0], [n, n, n], [1, n, n]),
        face("y face (rows of N doubles)", lambda a: a[:, 0, :], [n, n, n], [n, 1, n]),
        face("z face (single doubles)", lambda a: a[:, :, 0], [n, n, n], [n, n, 1]),
    ]

    def interior() -> tuple[np.ndarray, Any]:
        a = np.random.default_rng(0).random((n, n, n))
        dt = MPI.DOUBLE.Create_subarray([n, n, n], [n - 2, n - 2, n - 2], [1, 1, 1]).Commit()
        return a, (a[1:-1, 1:-1, 1:-1], dt)

    out.append(("interior (N-2)^3", interior))
    for block in (8, 64, 512, 4096, 65536):

        def vector(block: int = block) -> tuple[np.ndarray, Any]:
            count = max(1, large // block)
            raw = np.random.default_rng(0).integers(0, 255, 2 * block * count, dtype=np.uint8)
            view = raw.reshape(count, 2 * block)[:, :block]
            dt = MPI.BYTE.Create_vector(count, block, 2 * block).Commit()
            return raw, (view, dt)

        out.append((f"vector of {block} B blocks, stride {2 * block} B", vector))

    def struct() -> tuple[np.ndarray, Any]:
        record = np.dtype([("a", "i1"), ("b", "f8"), ("c", "i2", (3,))], align=True)
        data = np.zeros(1 << 20, dtype=record)
        data["b"] = 1.5
        dt = MPI.Datatype.Create_struct(
            [1, 1, 3], [0, 8, 16], [MPI.INT8_T, MPI.DOUBLE, MPI.INT16_T]
        )
        element = dt.Create_resized(0, record.itemsize)
        dt.Free()
        every = element.Create_contiguous(data.size).Commit()
        element.Free()
        return data, (data, every)

    out.append(("struct (i1, f8, 3 x i2; padded to 24 B)", struct))
    for blocks, width in ((4096, 8), (4096, 64), (max(4096, large // 128), 8)):

        def scattered(blocks: int = blocks, width: int = width) -> tuple[np.ndarray, Any]:
            rng = np.random.default_rng(0)
            spots = np.sort(rng.choice(4 * blocks, blocks, replace=False)) * width
            raw = rng.random(4 * blocks * width // 8)
            dt = MPI.BYTE.Create_hindexed_block(width, [int(s) for s in spots]).Commit()
            words = width // 8
            index = (spots[:, None] // 8 + np.arange(words)).reshape(-1)
            return raw, (Gather(index), dt)

        out.append((f"indexed: {blocks} blocks of {width} B at random, 1 in 4", scattered))
    out += small_cases()
    return out


@dataclass(frozen=True)
class Gather:
    """An irregular case's numpy peer: the packed doubles are ``whole[index]``."""

    index: np.ndarray


def small_cases() -> list[tuple[str, Callable[[], tuple[np.ndarray, Any]]]]:
    """Small messages, where the time per call (latency) is what counts."""
    from mpi4py import MPI

    def vector() -> tuple[np.ndarray, Any]:
        a = np.random.default_rng(0).random(16)
        return a, (a[::2], MPI.DOUBLE.Create_vector(8, 1, 2).Commit())

    def block() -> tuple[np.ndarray, Any]:
        a = np.random.default_rng(0).random((64, 64))
        dt = MPI.DOUBLE.Create_subarray([64, 64], [16, 16], [8, 8]).Commit()
        return a, (a[8:24, 8:24], dt)

    def face() -> tuple[np.ndarray, Any]:
        a = np.random.default_rng(0).random((16, 16, 16))
        dt = MPI.DOUBLE.Create_subarray([16, 16, 16], [16, 16, 1], [0, 0, 0]).Commit()
        return a, (a[:, :, 0], dt)

    return [
        ("small: 8 doubles at stride 2 (64 B)", vector),
        ("small: 16 x 16 block of a 64 x 64 array (2 KiB)", block),
        ("small: z face of a 16^3 block (2 KiB)", face),
    ]


LINE = 64  # bytes in a cache line


def lines_read(kernels: list[Any], address: int) -> int:
    """Cache lines the source side of ``kernels`` touches, with the origin at ``address``.

    Every block's first to last line, the union over all blocks (a line two blocks share
    counts once): what a pack must read from memory at the least.
    """
    from ..datatypes.blocks import expand

    starts, _, lengths = expand(kernels)
    if not starts.size:
        return 0
    first, last = (address + starts) // LINE, (address + starts + lengths - 1) // LINE
    order = np.argsort(first, kind="stable")
    first, last = first[order], last[order]
    covered = np.concatenate(([np.iinfo(np.int64).min + 1], np.maximum.accumulate(last)[:-1]))
    return int(np.maximum(0, last - np.maximum(first, covered + 1) + 1).sum())


def traffic_of(p: Any, base: np.ndarray) -> dict[str, Any]:
    """The cache-line traffic a case implies: lines read, and their bytes over the packed."""
    lines = lines_read(p._kernels(1), base.ctypes.data)
    return {"lines_read": lines, "read_per_packed": lines * LINE / max(1, p.size)}


def measure_case(
    comm: Any,
    args: argparse.Namespace,
    say: Callable[..., Any],
    case: tuple[str, str],
    variants: list[Variant],
    size: int,
    peer: str,
    traffic: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Sweep one case's variants at one size; print and return its rows."""
    title, name = case
    say(f"# case: {title}")
    if traffic is not None:
        say(
            f"#   reads {traffic['lines_read']:,} cache lines of {LINE} B for {size:,} B packed: "
            f"{traffic['read_per_packed']:.2f}x the packed bytes"
        )
    say(format_header())
    rows = sweep(
        comm,
        variants,
        [size],
        peer=peer,
        repeats=args.repeats,
        warmup=args.warmup,
        min_time=args.min_time,
        max_iterations=args.max_iterations,
    )
    for m in rows:
        say(format_row(m))
    return [{**m.as_dict(), "case": name, **(traffic or {})} for m in rows]
